"""Runtime dispatch: `dispatch((M, N, K))` or `dispatch(problem, m)` → kernel(x, w).

Winners are read once per process into plain dicts keyed by problem; a call does one dict
lookup and one bisect over the problem's buckets, with no SQL, no lock and no allocation beyond
the key tuple. The answer comes from a fixed ladder: exact or next-larger bucket of a stored
winner (clamped to the largest) → the designated default, which counts and records a miss.
Winners recorded under other library versions for their family are never used (they are misses).
"""
from __future__ import annotations

import atexit
import logging
import warnings
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass

from autotune.env import Env, current
from autotune.problem import Problem, check_m
from autotune.records import Miss
from tactics.arch import ARCHS, Arch, detect
from tactics.base import Tactic

log = logging.getLogger("autotune.dispatch")


@dataclass
class _Entry:
    buckets: tuple[int, ...]
    kernels: tuple                      # one per bucket
    tactics: tuple[Tactic, ...]


class Dispatcher:
    """One per process (or per cache). `stats` counts which rung answered."""

    def __init__(self, cache=None, *, env: Env | None = None, arch: Arch | None = None, record_misses: bool = True):
        self.env = env or current()
        self.arch = arch or (detect() if self.env.device == "cuda" else ARCHS["cpu"])
        self._cache = cache
        self._entries: dict[Problem, _Entry] = {}
        self._dense: dict[tuple[int, int], _Entry] = {}   # (N, K) of the default dense problem
        self._defaults: dict[Problem, object] = {}
        self.misses: Counter = Counter()                   # (problem key, m) -> count
        self.stats: Counter = Counter()                    # "hit" / "miss"
        self.skipped: Counter = Counter()                  # why stored winners were not loaded
        self._record = record_misses
        self._load()
        if record_misses:
            atexit.register(self.flush_misses)

    # --- loading -------------------------------------------------------------------------
    def _store(self, readonly: bool):
        from cache import Store
        return self._cache if hasattr(self._cache, "winners") else Store(self._cache, readonly=readonly)

    def _load(self) -> None:
        from tactics import registry
        try:
            store = self._store(readonly=True)
            winners = store.winners(self.env.device_key)
        except Exception as e:  # a broken cache must never take the serving process down
            warnings.warn(f"fp4-autotune: cache not used ({e}); every problem takes its default", stacklevel=3)
            return
        rows: dict[Problem, list] = {}
        for w in winners:
            try:
                fam = registry.get(w.family)
            except (ValueError, ImportError):
                self.skipped["unknown family"] += 1
                continue
            if w.lib_key != self.env.lib_key(fam.depends_on):
                self.skipped[f"{w.family} library version differs"] += 1
                continue
            p = Problem.from_key(w.problem_key)
            rows.setdefault(p, []).append((w.bucket, Tactic.from_json(w.params_json)))
        for p, items in rows.items():
            items.sort(key=lambda r: r[0])
            built = {}
            kernels = []
            for _, t in items:
                if t not in built:
                    built[t] = registry.get(t.family).build(p, t, self.env.device)
                kernels.append(built[t])
            e = _Entry(tuple(b for b, _ in items), tuple(kernels), tuple(t for _, t in items))
            self._entries[p] = e
            if p.kind == "dense" and p.a_fmt == "bf16" and p.w_fmt == "nvfp4" and p.out_dtype == "bf16":
                self._dense[(p.n, p.k)] = e

    # --- the hot path ----------------------------------------------------------------------
    def __call__(self, shape, m: int | None = None):
        if m is None:
            mm, n, k = shape
            e = self._dense.get((n, k))
            if e is not None and mm > 0:
                self.stats["hit"] += 1
                b = e.buckets
                i = bisect_left(b, mm)
                return e.kernels[i if i < len(b) else -1]
            return self._miss(Problem.dense(n, k), check_m(mm))
        e = self._entries.get(shape)
        if e is not None and m > 0:
            self.stats["hit"] += 1
            i = bisect_left(e.buckets, m)
            return e.kernels[i if i < len(e.buckets) else -1]
        return self._miss(shape, check_m(m))

    def tactic_for(self, problem: Problem, m: int) -> tuple[str, Tactic]:
        """Which rung answers and with which tactic (for debugging and `autotune show`)."""
        e = self._entries.get(problem)
        if e is not None:
            i = bisect_left(e.buckets, m)
            return "winner", e.tactics[i if i < len(e.buckets) else -1]
        return "default", self._default_tactic(problem)

    # --- misses ------------------------------------------------------------------------------
    def _default_tactic(self, problem: Problem) -> Tactic:
        from autotune.search import designated_default
        from tactics import registry
        return designated_default(problem, self.arch, self.env.device, registry.get)

    def _miss(self, problem: Problem, m: int):
        from tactics import registry
        self.stats["miss"] += 1
        self.misses[(problem.key, m)] += 1
        k = self._defaults.get(problem)
        if k is None:
            t = self._default_tactic(problem)
            warnings.warn(f"fp4-autotune: no tuned tactic for {problem.key} on {self.env.gpu_name}; "
                          f"using the default {t} (run `autotune search --from-misses`)", stacklevel=3)
            k = self._defaults[problem] = registry.get(t.family).build(problem, t, self.env.device)
        return k

    def flush_misses(self) -> None:
        """Write counted misses to the cache (best effort: never raises)."""
        if not self._record or not self.misses:
            return
        try:
            store = self._store(readonly=False)
            store.record_misses(Miss(pk, m, self.env.device_key, c) for (pk, m), c in self.misses.items())
            self.misses.clear()
        except Exception as e:
            log.debug("could not record misses: %s", e)


_default: Dispatcher | None = None


def dispatch(shape, m: int | None = None):
    """`dispatch((M, N, K))` for a dense bf16 × NVFP4 → bf16 GEMM, or `dispatch(problem, m)`.

    Returns kernel(x, w) computing y[M, N] = x[M, K] · W[N, K]ᵀ with x bf16 and w an FP4Weight.
    """
    global _default
    if _default is None:
        _default = Dispatcher()
    return _default(shape, m)


def reset(dispatcher: Dispatcher | None = None) -> None:
    """Drop the process-wide table (tests, or after a new search in the same process)."""
    global _default
    _default = dispatcher
