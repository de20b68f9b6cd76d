"""Every knob of a search, declared once: the options of one search (`SearchOptions`) and the
groups it nests — how trials are timed (`TimerConfig`), successive halving's budget (`Halving`),
which buckets a ranked search measures in full (`Cut`), where measurements run (`Runner`).

A knob a user sets carries its flag on its field (`knob(default, Opt(...))`): the flag's spelling,
help, value type, choices and check. The CLI's `search` options (cli.py), `api.run`'s keywords and
their one-line refusals, and the options table of docs/search.md (`python3 -m autotune.request`)
are all generated from these fields. Nothing here loads torch: the CLI reads these declarations.
"""
from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from typing import Any, Callable, Iterator, Sequence

from autotune.core import winner as winner_rule
from autotune.core.arch import Arch
from autotune.core.env import Env
from autotune.engine import strategies
from autotune.engine.progress import Progress
from autotune.engine.strategies.ranked.batches import Ranked

#: default limit for one check (build + compile + one call) or one timing request
DEFAULT_TIMEOUT_S = 300.0

_FIELD: Any = object()     # Opt.unset: the flag's absence stands for the field's own default


@dataclass(frozen=True)
class Opt:
    """The flag of one field: declared on the field it sets, read by the CLI, the API and the docs."""

    flag: str                      # click's spelling: "--margin", "--fused-moe/--no-fused-moe"
    help: str | Callable[[], str]  # (a callable: text read from a registry when asked)
    key: str = ""                  # api.run's keyword and the CLI's parameter ("" = the field's name)
    type: type | None = None       # the value's type where the default does not say (a None default)
    choices: Sequence[str] | Callable[[], Sequence[str]] = ()
    switch: bool = False           # a flag without a value; with flag_value False it turns the field off
    flag_value: bool = True
    show_default: bool = False
    unset: Any = _FIELD            # what the flag's absence passes: the field's default, or this (None: the
    #                                library decides, e.g. every visible GPU)
    scale: float = 1.0             # field value = flag value x scale (--budget-ms sets seconds)
    parse: Callable[[Any], Any] | None = None     # the flag's value -> the field's (raises ValueError: reason)
    check: Callable[[Any], str] | None = None     # "" when the value is fine, else why ("must be >= 1")
    doc_default: str = ""          # the default as docs/search.md says it ("" = the flag's default)

    def text(self) -> str:
        return self.help() if callable(self.help) else self.help

    def options(self) -> tuple[str, ...]:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    @property
    def name(self) -> str:
        """The flag as a message spells it (`--fused-moe/--no-fused-moe` -> `--fused-moe`)."""
        return self.flag.split("/")[0]


class OptionError(ValueError):
    """A knob's value refused by its check: `str(e)` names the field (library use), `flag_message`
    the flag (the CLI's one-line refusal)."""

    def __init__(self, field_name: str, opt: Opt | None, reason: str):
        super().__init__(f"{field_name} {reason}")
        self.field, self.reason = field_name, reason
        self.flag_message = f"{opt.name if opt else field_name} {reason}"


def knob(default: Any = MISSING, opt: Opt | None = None, *, factory: Callable[[], Any] | None = None):
    """A dataclass field with its flag (`opt`) in the field's metadata."""
    meta = {"opt": opt} if opt is not None else {}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Flag:
    """One flag as the CLI and the API see it: where it goes (`path`, e.g. ("runner", "workers")),
    its declaration and the field's default."""

    path: tuple[str, ...]
    opt: Opt
    field_default: Any

    @property
    def key(self) -> str:
        return self.opt.key or self.path[-1]

    @property
    def default(self) -> Any:
        """The flag's default as the CLI shows and passes it."""
        if self.opt.unset is not _FIELD:
            return self.opt.unset
        v = self.field_default
        if self.opt.scale != 1 and isinstance(v, (int, float)):
            v = v / self.opt.scale
            v = int(round(v)) if abs(v - round(v)) < 1e-9 else v
        return v

    def value(self, given: Any) -> Any:
        """The field's value for the flag's value `given` (OptionError when refused)."""
        o = self.opt
        if o.parse is not None:
            try:
                given = o.parse(given)
            except ValueError as e:
                raise OptionError(self.path[-1], o, str(e)) from None
        if o.scale != 1 and isinstance(given, (int, float)) and not isinstance(given, bool):
            given = given * o.scale
        return given


def _field_default(f) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None


def flags_of(cls, path: tuple[str, ...] = ()) -> Iterator[Flag]:
    """The flags of `cls`'s fields in declaration order, nested dataclass groups (a field whose
    default is a dataclass: `runner`, `halving`, `timer`) expanded in place."""
    for f in fields(cls):
        opt = f.metadata.get("opt")
        if opt is not None:
            yield Flag((*path, f.name), opt, _field_default(f))
        elif is_dataclass(d := _field_default(f)) and not isinstance(d, type):
            yield from flags_of(type(d), (*path, f.name))


def validate(obj) -> None:
    """Run every field check of `obj` (a dataclass of knobs): the first refusal raises OptionError."""
    for f in fields(obj):
        opt = f.metadata.get("opt")
        if opt is None:
            continue
        v = getattr(obj, f.name)
        if v is not None and opt.options() and v not in opt.options():
            raise OptionError(f.name, opt, f"must be one of {', '.join(opt.options())}, got {v!r}")
        why = opt.check(v) if opt.check is not None else ""
        if why:
            raise OptionError(f.name, opt, why)


# -- checks: each returns "" or why the value is refused ------------------------------------------

def whole(low: int) -> Callable[[Any], str]:
    def check(v) -> str:
        return "" if isinstance(v, int) and not isinstance(v, bool) and v >= low else \
            f"must be a whole number >= {low}, got {v!r}"
    return check


def at_least(low: int) -> Callable[[Any], str]:
    return lambda v: "" if v is None or v >= low else f"must be >= {low}, got {v}"


def seconds(v) -> str:
    return "" if isinstance(v, (int, float)) and 0 < v < math.inf else \
        f"must be a positive number of seconds, got {v!r}"


def fraction(v) -> str:
    return "" if 0 <= v < 1 else f"must be in [0, 1), got {v}"


def device_ids(v) -> str:
    return "" if len(set(v)) == len(v) and all(g >= 0 for g in v) else f"must list distinct device indices, got {list(v)}"


def gpu_list(v) -> tuple[int, ...]:
    """`--gpus 0,1,2` (or a sequence of indices) as a tuple."""
    if not isinstance(v, str):
        return tuple(v)
    try:
        ids = tuple(int(g) for g in v.split(",") if g.strip())
    except ValueError:
        ids = ()
    if not ids:
        raise ValueError(f"takes device indices like 0,1,2, got {v!r}")
    return ids


@dataclass(frozen=True)
class TimerConfig:
    warmup: int = 0             # extra calls before timing (the check call already warmed up)
    min_reps: int = 3
    max_reps: int = 100
    budget_s: float = knob(0.25, Opt(            # per tactic, after the first timed repetition
        "--budget-ms", "with --exhaustive: timing budget per tactic and bucket (ms)", key="budget_ms",
        scale=1e-3, show_default=True))
    # CUDA: calls estimated faster than this are timed as graph replays (host launch cost excluded).
    # Default: every call that can be captured — an eager event timing of a call whose host work
    # outlasts its GPU work (a MoE launcher's routing ops) measures the host, not the kernels.
    graph_below_us: float = math.inf
    max_graph_calls: int = 256  # a graph holds one call per input set (the whole cold-L2 rotation), at most this many
    lead_us: float = 20.0       # CUDA: a spin kernel queued before each timed sample hides the host's launch latency
    # CUDA graphs: a request stops once its median's standard error is about this share of the median
    # (judged from its first samples), not when its budget is spent; 0 spends the budget. Chosen on the
    # stored main jobs by bench/stop_rule_eval.py (docs/decisions/0012-precision-stop.md)
    precision: float = knob(0.0025, Opt(
        "--precision", "CUDA graph timing: stop a request once its median's standard error is this share of "
        "the median (0: spend the whole budget)", show_default=True, check=fraction))


@dataclass(frozen=True)
class Halving:
    """Timing budget of one (problem, bucket), split over the rounds."""

    # seconds of timing per (problem, bucket) after the checks (per batch under --strategy ranked):
    # 0.3 s leaves each finalist >= 3 interleaved cycles of >= 1 graph replay (a decode-size replay is
    # 0.1-0.5 ms); timing is most of the main job's time, so this budget sets its length
    budget_s: float = knob(0.3, Opt(
        "--budget-s", "successive halving: timing budget per (problem, bucket) in seconds (per batch with "
        "--strategy ranked)", show_default=True, check=seconds))
    eta: int = 3                # keep 1/eta per round
    finalists: int = 3          # how many reach the interleaved round
    cycles: int = 5             # interleaved cycles in the final round
    final_share: float = 0.4    # fraction of the budget spent on the final round
    exhaustive: bool = knob(False, Opt(
        "--exhaustive", "time every kept tactic fully (no successive halving); same as --strategy exhaustive",
        switch=True))
    suspect: float = 0.5        # a best time under this share of the runner-up's is re-timed before it stands
    # a count-bound host (the CPU, where one call outlasts the job's budget share: halving's minimum reps,
    # not its budget, set the cost): the check call's host time is each tactic's first sample, those
    # slower than the fastest check by more than this share are dropped on it, and the rest are timed
    # once more (autotune.engine.strategies.successive_halving.measure_host); 0 turns the rule off
    host_window: float = 0.15

    def __post_init__(self):
        validate(self)
        if not 0 <= self.host_window < math.inf:
            raise ValueError(f"successive halving: host_window must be >= 0, got {self.host_window!r}")
        for name, low in (("eta", 2), ("finalists", 1), ("cycles", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"successive halving: {name} must be >= {low}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Cut:
    """Which buckets of a problem's ladder `--strategy ranked` measures in full; the others verify the
    model's choice against their measured neighbours' winners in one round
    (autotune/engine/strategies/ranked/cut.py; the defaults chosen by bench/bucket_cut_eval.py)."""

    every: int = knob(4, Opt(
        "--measure-every", "--strategy ranked: measure every Nth bucket in full (and both ends, each predicted "
        "family crossover, the buckets the model is unsure of, those between neighbours won by different kernels); "
        "the others verify their neighbours' winners and the model's choice in one round (1: every bucket in full)",
        key="measure_every", show_default=True, check=whole(1)))
    unsure: float = 0.05        # a bucket whose model's first two choices are predicted this close (log2) is measured

    def __post_init__(self):
        validate(self)
        if not 0 <= self.unsure < math.inf:
            raise ValueError(f"cut: unsure must be >= 0, got {self.unsure!r}")


@dataclass(frozen=True)
class Runner:
    """How and where measurements run (see docs/search.md)."""

    gpus: tuple[int, ...] = knob((), Opt(          # one worker per listed device; () = one worker
        "--gpus", "shard the work over these devices, one worker each, e.g. 0,1,2,3 [default: every visible GPU]",
        type=str, unset=None, parse=gpu_list, check=device_ids, doc_default="every visible GPU (one worker on the CPU)"))
    workers: int = knob(1, Opt(                    # CPU sharding
        "--workers", "worker processes when --gpus is not given", show_default=True, check=whole(1)))
    ray: str | None = knob(None, Opt(              # "local" starts a local cluster
        "--ray", "run jobs on a Ray cluster at this address ('local' starts one)"))
    compile_workers: int = knob(1, Opt(            # joblib processes for ahead-of-time compilation
        "--compile-workers", "processes compiling ahead of timing [default: CPU cores]", type=int, unset=None,
        check=whole(1), doc_default="CPU cores"))
    timeout_s: float = knob(DEFAULT_TIMEOUT_S, Opt(
        "--timeout-s", "a tactic's precompile, build/check or timing past this is killed and failed",
        show_default=True, check=seconds))
    isolate: bool = knob(True, Opt(                # one spawned worker process per device; False: in-process
        "--no-isolate", "measure in this process (debugging; a crashing tactic ends the search)", switch=True,
        flag_value=False))
    overlap_compile: bool = True          # measure while later tactics compile (autotune.engine.pipeline); False: a barrier
    families: dict = field(default_factory=dict)   # extra "name": "module:Class" for workers (tests)

    def __post_init__(self):
        validate(self)


@dataclass(frozen=True)
class SearchOptions:
    """Everything about one search besides what (problems, families, buckets) and where (store)."""

    arch: Arch | None = None              # target; default the live device
    env: Env | None = None                # default: this machine (autotune.core.env.current)
    margin: float = knob(winner_rule.DEFAULT_MARGIN, Opt(
        "--margin", "a winner must beat the default by this fraction", show_default=True, check=fraction))
    timer: TimerConfig = TimerConfig()    # the exhaustive timer (and the base of halving's rounds)
    halving: Halving = Halving()
    strategy: str = knob(strategies.DEFAULT, Opt(    # autotune.engine.strategies: the registered ones
        "--strategy", strategies.help_text, choices=strategies.names, unset=None,
        doc_default=f"{strategies.DEFAULT} ({strategies.INVARIANT_DEFAULT} with --batch-invariant)"))
    ranked: Ranked = Ranked()             # the ranked strategy's knobs
    cut: Cut = Cut()                      # ... and which buckets it measures in full
    rank_model: object = knob(None, Opt(  # a rankmodel.Model or its path; None: strategy.default_model
        "--rank-model", "rank model file for --strategy ranked [default: <cache>.rank-<arch>.json, else the model "
        "shipped for the arch]", type=str, doc_default="`<cache>.rank-<arch>.json`, else the model shipped for the arch"))
    batch_invariant: bool = knob(False, Opt(
        "--batch-invariant", "one tactic per problem for every M, among tactics whose reduction order does not "
        "depend on M", switch=True))
    runner: Runner = Runner()
    compile_check: bool = knob(False, Opt(
        "--compile-check", "with --arch: cross-compile kept tactics and compare smem with the verdicts", switch=True))
    audit_rejected: int = 200             # compile_check: footprint-rejected tactics compiled per arch (seeded)
    seed: int = 0
    max_tactics: int | None = knob(None, Opt(
        "--max-tactics", "time at most this many kept tactics per family and problem (evenly spaced; the default "
        "is always timed)", type=int, check=at_least(1)))
    retry_failed: bool = knob(False, Opt("--retry-failed", "measure again tactics whose trials failed", switch=True))
    measure_unknown: bool = knob(False, Opt(
        "--measure-unknown", "also measure tactics whose verdict is unknown (outside the region a smem model was "
        "checked on)", switch=True))
    dry_run: bool = knob(False, Opt("--dry-run", "print the tactic space and verdicts; measure nothing", switch=True))
    progress: Progress | bool = False     # True: a bar on the terminal; or a Progress (plain lines, tests)
    log: Callable[[str], None] = lambda s: None

    def __post_init__(self):
        validate(self)


def build(top: dict, nested: dict) -> SearchOptions:
    """SearchOptions from keywords: `top` are SearchOptions fields (a flag's value None: the field's
    default), `nested` the flags of its groups by key (budget_s=, workers=, …), applied over the
    group given in `top` (a caller's own Runner) or the default one. A refused value: OptionError."""
    by_key = {fl.key: fl for fl in flags_of(SearchOptions)}
    kw: dict[str, Any] = {}
    for k, v in top.items():
        fl = by_key.get(k)
        if fl is not None and len(fl.path) == 1:
            if v is None and fl.opt.unset is not _FIELD:
                continue
            v = fl.value(v)
        kw[k] = v
    groups: dict[str, dict[str, Any]] = {}
    for k, v in nested.items():
        fl = by_key[k]
        if v is not None:
            groups.setdefault(fl.path[0], {})[fl.path[1]] = fl.value(v)
    for g, repl in groups.items():
        base = kw.get(g) or _field_default(next(f for f in fields(SearchOptions) if f.name == g))
        kw[g] = replace(base, **repl)
    return SearchOptions(**kw)
