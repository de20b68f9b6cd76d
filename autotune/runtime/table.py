"""One problem's answers: the ladder that maps a runtime M to a tactic, counted per rung.

  pinned     a tactic forced for the problem (`Dispatcher.pin`, or $AUTOTUNE_PIN)
  exact      M is one of the buckets with a measured winner
  predicted  M is one of the buckets with a predicted winner (`--strategy predict`: the rank model's
             checked first choice, never timed; a bucket holds one winner, measured or predicted)
  nearest    the smallest bucket >= M with a measured winner (clamped to the largest)
  default    no measured winner at or near M: the designated default, counted as a miss per M

The hot paths (`Table.__call__` for the unbound `kernel(x, w)` form, `Table.index` for bound
launchers) are one `bisect` over a tuple and a list increment: no SQL, no lock, no container or
tensor allocation (the only new objects are the counters' ints beyond 256).
"""
from __future__ import annotations

import warnings
from bisect import bisect_left
from typing import Any, Callable

from autotune.core.problem import Problem, check_m
from autotune.core.tactic import Tactic

RUNGS = ("pinned", "exact", "predicted", "nearest", "default")
PINNED, EXACT, PREDICTED, NEAREST, DEFAULT = range(5)
#: what `Table.index` returns besides a bucket index
PIN_SLOT, DEFAULT_SLOT = -2, -1


class Table:
    """`table(m)` returns the unbound kernel(x, w); `table.index(m)` returns the bucket index
    (or PIN_SLOT / DEFAULT_SLOT) so a layer can keep one bound launcher per bucket."""

    __slots__ = ("problem", "buckets", "kernels", "tactics", "counts", "misses", "pinned", "pinned_tactic",
                 "default", "default_tactic", "version", "predicted", "_n", "_last", "_exact", "_near")

    def __init__(self, problem: Problem, buckets: tuple[int, ...], kernels: tuple, tactics: tuple[Tactic, ...],
                 default: "LazyDefault", default_tactic: Tactic, predicted: tuple[bool, ...] = ()):
        self.problem = problem
        self.buckets = buckets
        self.kernels = kernels
        self.tactics = tactics
        self.default = default
        self.default_tactic = default_tactic
        self.counts = [0, 0, 0, 0, 0]       # per rung, see RUNGS
        self.misses: dict[int, int] = {}    # M -> count (default rung only)
        self.pinned: Callable | None = None
        self.pinned_tactic: Tactic | None = None
        self.version = 0                    # bumped when a pin changes what the table answers
        self._n = len(buckets)
        self._last = self._n - 1
        self.predicted = tuple(predicted) or (False,) * self._n    # per bucket: its winner is predicted
        # per bucket index: the rung an exact M counts; per insertion point i (0..n): the index of the
        # measured bucket a non-exact M takes (the first measured >= i, else the largest), -1: none
        self._exact = tuple(PREDICTED if p else EXACT for p in self.predicted)
        measured = [i for i, p in enumerate(self.predicted) if not p]
        self._near = tuple(next((j for j in measured if j >= i), measured[-1] if measured else -1)
                           for i in range(self._n + 1))

    # --- the hot paths -------------------------------------------------------------------------
    # __call__ and index() spell out the same ladder on purpose: sharing it would cost a call per
    # GEMM (bench/dispatch_latency.py); change both together.
    def __call__(self, m: int):
        if self.pinned is not None:
            self.counts[PINNED] += 1
            return self.pinned
        b = self.buckets
        i = bisect_left(b, m)
        if i < self._n and b[i] == m:
            self.counts[self._exact[i]] += 1
            return self.kernels[i]
        j = self._near[i]
        if j >= 0:
            self.counts[NEAREST] += 1
            return self.kernels[j]
        return self._miss(m)

    def index(self, m: int) -> int:
        """The bucket index answering M, or PIN_SLOT / DEFAULT_SLOT (a miss is counted and warned)."""
        if self.pinned is not None:
            self.counts[PINNED] += 1
            return PIN_SLOT
        b = self.buckets
        i = bisect_left(b, m)
        if i < self._n and b[i] == m:
            self.counts[self._exact[i]] += 1
            return i
        j = self._near[i]
        if j >= 0:
            self.counts[NEAREST] += 1
            return j
        self._miss(m)
        return DEFAULT_SLOT

    def _miss(self, m: int):
        if m <= 0:
            check_m(m)
        self.counts[DEFAULT] += 1
        self.misses[m] = self.misses.get(m, 0) + 1
        k = self.default._k
        return k if k is not None else self.default.resolve()   # first miss: build and warn once

    # --- pinning (Dispatcher.pin validates first) -----------------------------------------------
    def _set_pin(self, kernel: Callable | None, tactic: Tactic | None) -> None:
        self.pinned, self.pinned_tactic = kernel, tactic
        self.version += 1

    # --- introspection -------------------------------------------------------------------------
    def rung_for(self, m: int) -> tuple[str, Tactic]:
        """Which rung would answer M and with which tactic (does not count)."""
        check_m(m)
        if self.pinned is not None:
            return "pinned", self.pinned_tactic
        i = bisect_left(self.buckets, m)
        if i < self._n and self.buckets[i] == m:
            return RUNGS[self._exact[i]], self.tactics[i]
        j = self._near[i] if self._n else -1
        return ("nearest", self.tactics[j]) if j >= 0 else ("default", self.default_tactic)


class LazyDefault:
    """The default kernel of a problem, built (and warned about) on its first call only, so that
    creating a table at load time costs nothing for problems that have winners."""

    __slots__ = ("_build", "_p", "_t", "_k", "_warn_on")

    def __init__(self, build: Callable[[Problem, Tactic], Callable], p: Problem, t: Tactic, warn_on: str | None):
        self._build, self._p, self._t, self._k, self._warn_on = build, p, t, None, warn_on

    def __call__(self, *args: Any, **kw: Any):
        k = self._k
        if k is None:
            k = self.resolve()
        return k(*args, **kw)

    def resolve(self) -> Callable:
        if self._k is None:
            if self._warn_on is not None:
                warnings.warn(f"fp4-autotune: no tuned tactic for {self._p.key} on {self._warn_on}; "
                              f"using the default {self._t} (run `autotune search --from-misses`)", stacklevel=4)
            self._k = self._build(self._p, self._t)
        return self._k
