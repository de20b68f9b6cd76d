"""Every knob of a search, declared once: the options of one search (`SearchOptions`) and the
groups it nests — how trials are timed (`TimerConfig`), successive halving's budget (`Halving`),
where measurements run (`Runner`). Nothing here loads torch: the CLI reads these declarations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from autotune.core import winner as winner_rule
from autotune.core.arch import Arch
from autotune.core.env import Env
from autotune.engine.progress import Progress
from autotune.engine.ranked import Ranked

#: default limit for one check (build + compile + one call) or one timing request
DEFAULT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 0             # extra calls before timing (the check call already warmed up)
    min_reps: int = 3
    max_reps: int = 100
    budget_s: float = 0.25      # per tactic, after the first timed repetition
    # CUDA: calls estimated faster than this are timed as graph replays (host launch cost excluded).
    # Default: every call that can be captured — an eager event timing of a call whose host work
    # outlasts its GPU work (a MoE launcher's routing ops) measures the host, not the kernels.
    graph_below_us: float = math.inf
    max_graph_calls: int = 256  # a graph holds one call per input set (the whole cold-L2 rotation), at most this many
    lead_us: float = 20.0       # CUDA: a spin kernel queued before each timed sample hides the host's launch latency


@dataclass(frozen=True)
class Halving:
    """Timing budget of one (problem, bucket), split over the rounds."""

    # seconds of timing per (problem, bucket) after the checks (per batch under --strategy ranked):
    # the whole GLM-5 TP8 main job on one H200 measured its ranked batches at 2 s each for 66 of 168
    # jobs in 330 s; 0.5 s leaves each finalist ~5 interleaved cycles of >= 1 graph replay
    budget_s: float = 0.5
    eta: int = 3                # keep 1/eta per round
    finalists: int = 3          # how many reach the interleaved round
    cycles: int = 5             # interleaved cycles in the final round
    final_share: float = 0.4    # fraction of the budget spent on the final round
    exhaustive: bool = False
    suspect: float = 0.5        # a best time under this share of the runner-up's is re-timed before it stands

    def __post_init__(self):
        if not 0 < self.budget_s < float("inf"):
            raise ValueError(f"budget_s must be a positive number of seconds, got {self.budget_s!r}")
        for name, low in (("eta", 2), ("finalists", 1), ("cycles", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"successive halving: {name} must be >= {low}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Runner:
    """How and where measurements run (see docs/search.md)."""

    isolate: bool = True                  # one spawned worker process per device; False: in-process
    gpus: tuple[int, ...] = ()            # one worker per listed device; () = one worker
    workers: int = 1                      # worker processes when no GPUs are listed (CPU sharding)
    ray: str | None = None                # Ray address ("local" starts a local cluster)
    compile_workers: int = 1              # joblib processes for ahead-of-time compilation
    timeout_s: float = DEFAULT_TIMEOUT_S
    families: dict = field(default_factory=dict)   # extra "name": "module:Class" for workers (tests)

    def __post_init__(self):
        for name in ("workers", "compile_workers"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a whole number >= 1, got {getattr(self, name)!r}")
        if not self.timeout_s > 0 or self.timeout_s == float("inf"):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"--gpus must list distinct device indices, got {list(self.gpus)}")


@dataclass(frozen=True)
class SearchOptions:
    """Everything about one search besides what (problems, families, buckets) and where (store)."""

    arch: Arch | None = None              # target; default the live device
    env: Env | None = None                # default: this machine (autotune.core.env.current)
    margin: float = winner_rule.DEFAULT_MARGIN   # a winner must beat the default by this fraction
    timer: TimerConfig = TimerConfig()    # the exhaustive timer (and the base of halving's rounds)
    halving: Halving = Halving()
    runner: Runner = Runner()
    retry_failed: bool = False            # measure again tactics whose trials failed
    dry_run: bool = False                 # verdicts only
    compile_check: bool = False           # cross-compile kept tactics and compare smem with the verdicts
    audit_rejected: int = 200             # compile_check: footprint-rejected tactics compiled per arch (seeded)
    seed: int = 0
    max_tactics: int | None = None        # at most this many kept tactics per family and problem
    measure_unknown: bool = False         # also measure tactics whose verdict is unchecked ("unknown: ...")
    strategy: str = "ranked"              # ranked (halving where no model covers the arch) | halving | exhaustive
    ranked: Ranked = Ranked()             # the ranked strategy's knobs
    rank_model: object = None             # a rankmodel.Model or its path; None: strategy.default_model
    batch_invariant: bool = False         # one batch-invariant tactic per problem for every M
    progress: Progress | bool = False     # True: a bar on the terminal; or a Progress (plain lines, tests)
    log: Callable[[str], None] = lambda s: None
