"""Runtime dispatch: `dispatch((M, N, K))` or `dispatch(problem, m)` → kernel(x, w).

Winners are read once per process into one `Table` per problem. The answer comes from a fixed
ladder, and each table counts which rung answered (`Dispatcher.stats`, `Table.counts`):

  pinned   a tactic forced for the problem (`Dispatcher.pin`, or $AUTOTUNE_PIN)
  exact    M is one of the tuned buckets
  nearest  the smallest tuned bucket >= M (clamped to the largest)
  default  the problem has no usable winner: the designated default, counted as a miss per M

The hot path (`Table.__call__`) is one `bisect` over a tuple and a list increment: no SQL, no
lock, no container or tensor allocation (the only new objects are the counters' ints beyond 256).
Engines that know their problem at load time call `dispatcher.table(problem)` once and keep it.

Every stored winner is checked before it is used: known family, parameters valid for the family,
tactic id matching its parameters, library versions equal to the live ones, verdict not rejected
on the live arch, kernel builds. Anything else is skipped with a counted reason (`skipped`), so the
problem falls through to the next rung; a damaged cache never takes the serving process down.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import warnings
from bisect import bisect_left
from collections import Counter
from typing import Any, Callable, Iterable

from autotune.core.env import Env, current
from autotune.core.problem import Problem, check_m
from autotune.core.records import Miss
from autotune.core import settings
from autotune.core.arch import ARCHS, Arch, detect
from autotune.core.tactic import Tactic, parse_tactic

log = logging.getLogger("autotune.runtime.dispatch")

RUNGS = ("pinned", "exact", "nearest", "default")
PINNED, EXACT, NEAREST, DEFAULT = range(4)
PIN_ENV, MISSES_ENV, IMMUTABLE_ENV = settings.PIN, settings.MISSES, settings.CACHE_IMMUTABLE


class Table:
    """The answers for one problem. `table(m)` returns the kernel; `table.pick(m)` returns
    (kernel, slot) where `slot` indexes `layouts` (what a prepacked layer keeps per layout)."""

    __slots__ = ("problem", "buckets", "kernels", "tactics", "slots", "layouts", "counts", "misses",
                 "pinned", "pinned_tactic", "default", "default_tactic", "default_slot", "_n", "_last",
                 "_pairs", "_pinned_pair", "layout_owners")

    def __init__(self, problem: Problem, buckets: tuple[int, ...], kernels: tuple, tactics: tuple[Tactic, ...],
                 default: Callable, default_tactic: Tactic):
        from autotune.runtime.prepack import layout_of
        self.problem = problem
        self.buckets = buckets
        self.kernels = kernels
        self.tactics = tactics
        self.default = default
        self.default_tactic = default_tactic
        # one slot per distinct weight layout the kernels of this table want
        lays: list[str] = []
        owners: list[Tactic] = []
        for t in (*tactics, default_tactic):
            lay = layout_of(t)
            if lay not in lays:
                lays.append(lay)
                owners.append(t)
        self.layouts: tuple[str, ...] = tuple(lays)
        self.layout_owners: tuple[Tactic, ...] = tuple(owners)   # the tactic whose family packs each slot
        self.slots = tuple(lays.index(layout_of(t)) for t in tactics)
        self.default_slot = lays.index(layout_of(default_tactic))
        self.counts = [0, 0, 0, 0]          # per rung, see RUNGS
        self.misses: dict[int, int] = {}    # M -> count (default rung only)
        self.pinned: Callable | None = None
        self.pinned_tactic: Tactic | None = None
        self._pinned_pair: tuple[Callable, int] | None = None
        self._pairs = tuple(zip(kernels, self.slots))     # built once: pick() returns them, allocating nothing
        self._n = len(buckets)
        self._last = self._n - 1

    # --- the hot path --------------------------------------------------------------------------
    # __call__ and pick() spell out the same ladder on purpose: sharing it would cost a call and
    # a tuple per GEMM (bench/dispatch_latency.py); change both together.
    def __call__(self, m: int):
        if self.pinned is not None:
            self.counts[PINNED] += 1
            return self.pinned
        b = self.buckets
        i = bisect_left(b, m)
        if i < self._n:
            if b[i] == m:
                self.counts[EXACT] += 1
            else:
                self.counts[NEAREST] += 1
            return self.kernels[i]
        if self._n:
            self.counts[NEAREST] += 1
            return self.kernels[self._last]
        return self._miss(m)

    def pick(self, m: int) -> tuple[Callable, int]:
        """(kernel, layout slot): for layers that keep one prepacked weight per layout."""
        if self._pinned_pair is not None:
            self.counts[PINNED] += 1
            return self._pinned_pair
        b = self.buckets
        i = bisect_left(b, m)
        if i < self._n:
            if b[i] == m:
                self.counts[EXACT] += 1
            else:
                self.counts[NEAREST] += 1
            return self._pairs[i]
        if self._n:
            self.counts[NEAREST] += 1
            return self._pairs[self._last]
        return self._miss(m), self.default_slot

    def _miss(self, m: int):
        if m <= 0:
            check_m(m)
        self.counts[DEFAULT] += 1
        self.misses[m] = self.misses.get(m, 0) + 1
        k = self.default._k
        return k if k is not None else self.default.resolve()   # first miss: build and warn once

    # --- pinning (Dispatcher.pin validates first) -----------------------------------------------
    def _set_pin(self, kernel: Callable | None, tactic: Tactic | None) -> None:
        from autotune.runtime.prepack import layout_of
        if kernel is None:
            self.pinned = self.pinned_tactic = self._pinned_pair = None
            return
        lay = layout_of(tactic)
        if lay not in self.layouts:
            self.layouts = (*self.layouts, lay)      # a layer holding this table repacks (see nn.py)
            self.layout_owners = (*self.layout_owners, tactic)
        self.pinned, self.pinned_tactic = kernel, tactic
        self._pinned_pair = (kernel, self.layouts.index(lay))

    # --- introspection -------------------------------------------------------------------------
    def rung_for(self, m: int) -> tuple[str, Tactic]:
        """Which rung would answer M and with which tactic (does not count)."""
        check_m(m)
        if self.pinned is not None:
            return "pinned", self.pinned_tactic
        if not self._n:
            return "default", self.default_tactic
        i = min(bisect_left(self.buckets, m), self._last)
        return ("exact" if self.buckets[i] == m else "nearest"), self.tactics[i]


class Dispatcher:
    """One per process (or per cache).

    cache: a Store, a path or URL (default $AUTOTUNE_CACHE); always opened read-only, and
    immutable (no -wal/-shm files, works on a read-only filesystem) when nothing can be writing it.
    misses: where counted misses go at exit: "memory" (nowhere), a path/URL of a writable cache,
    or None = $AUTOTUNE_MISSES, else the cache itself if it is writable, else memory.
    pins: {problem key or "*": tactic} forced tactics; $AUTOTUNE_PIN adds to them.
    """

    def __init__(self, cache=None, *, env: Env | None = None, arch: Arch | None = None,
                 record_misses: bool = True, misses: str | os.PathLike | None = None,
                 pins: dict[str, Any] | None = None, immutable: bool | None = None, warn: bool = True):
        self.env = env or current()
        self.arch = arch or (detect() if self.env.device == "cuda" else ARCHS["cpu"])
        self._cache = cache
        self._immutable = immutable if immutable is not None else settings.cache_immutable()
        self._tables: dict[Problem, Table] = {}
        self._by_id: dict[int, tuple[Problem, Table]] = {}    # id(problem) -> table, no hashing per call
        self._dense: dict[int, dict[int, Table]] = {}         # N -> K -> table (bf16 x nvfp4 -> bf16)
        self._winners: dict[Problem, list[tuple[int, Tactic]]] = {}
        self._built: dict[tuple[Problem, Tactic], Callable] = {}
        self._pins: dict[str, Tactic] = {}
        self._warn = warn
        self.skipped: Counter = Counter()                     # why stored winners were not used
        self.cache_error: str | None = None
        self._record = record_misses
        self._misses_to = misses
        self._flushed: dict[tuple[str, int], int] = {}
        for key, t in {**_parse_pins(settings.pins()), **(pins or {})}.items():
            self._pins[key] = parse_tactic(t)
        self._load()
        for key in self._pins:
            if key != "*":
                self.table(Problem.from_key(key))      # installs the table with its pin
        if record_misses:
            atexit.register(self.flush_misses)

    # --- loading -------------------------------------------------------------------------------
    def _open(self):
        from cache import Store
        if hasattr(self._cache, "winners"):
            return self._cache, False
        return Store(self._cache, readonly=True, immutable=self._immutable or None), True

    def _load(self) -> None:
        try:
            store, owned = self._open()
            try:
                winners = store.winners(self.env.device_key)
                self.cache_url = store.url
                self._cache_writable = _writable(store)
            finally:
                if owned:
                    store.close()
        except Exception as e:  # a broken cache must never take the serving process down
            self.cache_error = str(e).splitlines()[0] if str(e) else type(e).__name__
            self.cache_url, self._cache_writable = None, False
            warnings.warn(f"fp4-autotune: cache not used ({self.cache_error}); every problem takes its default",
                          stacklevel=3)
            return
        for w in winners:
            why = self._check(w)
            if why:
                self.skipped[why] += 1
                log.debug("winner %s bucket %s skipped: %s", w.problem_key, w.bucket, why)
        for p, items in self._winners.items():
            items.sort(key=lambda r: r[0])
            self._install(p, items)

    def _check(self, w) -> str | None:
        """Why a stored winner cannot be used here (None: it was accepted into _winners)."""
        from tactics import registry
        try:
            t = Tactic.from_json(w.params_json)
        except (ValueError, TypeError):
            return "malformed tactic"
        if t.id != w.tactic_id or t.family != w.family:
            return "tactic does not match its id"
        try:
            fam = registry.get(t.family)
        except (ValueError, ImportError):
            return "unknown family"
        if not isinstance(w.bucket, int) or isinstance(w.bucket, bool) or w.bucket <= 0:
            return "bad bucket"
        try:
            p = Problem.from_key(w.problem_key)
        except ValueError:
            return "bad problem key"
        if w.lib_key != self.env.lib_key(fam.depends_on):
            return f"{t.family} library version differs"
        why = registry.validate(t.family, t.params)
        if why:
            return f"invalid {t.family} parameters"
        if not fam.available(self.env.device)[0]:
            return f"{t.family} not available on {self.env.device}"
        try:
            if fam.verdict(p, t, self.arch).rejected:
                return f"{t.family} verdict rejects it on {self.arch.name}"
            self._kernel(p, t)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot be built is a skip, not a crash
            return f"{t.family} build failed: {type(e).__name__}"
        self._winners.setdefault(p, []).append((w.bucket, t))
        return None

    def _kernel(self, p: Problem, t: Tactic) -> Callable:
        k = self._built.get((p, t))
        if k is None:
            from tactics import registry
            k = self._built[(p, t)] = registry.get(t.family).build(p, t, self.env.device)
        return k

    def _default_tactic(self, problem: Problem) -> Tactic:
        from tactics import registry
        return registry.designated_default(problem, self.arch, self.env.device)

    def _install(self, p: Problem, items: list[tuple[int, Tactic]]) -> Table:
        dt = self._default_tactic(p)
        old = self._tables.get(p)
        t = Table(p, tuple(b for b, _ in items), tuple(self._kernel(p, x) for _, x in items),
                  tuple(x for _, x in items), _LazyDefault(self, p, dt), dt)
        if old is not None:      # keep counts and pins across a re-install
            t.counts, t.misses = old.counts, old.misses
            if old.pinned is not None:
                t._set_pin(old.pinned, old.pinned_tactic)
        self._tables[p] = t
        if p.kind == "dense" and p.a_fmt == "bf16" and p.w_fmt == "nvfp4" and p.out_dtype == "bf16":
            self._dense.setdefault(p.n, {})[p.k] = t
        if t.pinned is None and p.key in self._pins:
            self._pin_table(t, self._pins[p.key])          # an explicit pin must fit: raises if not
        elif t.pinned is None and "*" in self._pins:
            try:
                self._pin_table(t, self._pins["*"])
            except ValueError:
                self.skipped[f"pin * does not fit {p.kind}"] += 1
        return t

    # --- lookups -------------------------------------------------------------------------------
    def table(self, problem: Problem) -> Table:
        """The problem's table (created on first use: then it answers from the default rung)."""
        t = self._tables.get(problem)
        if t is None:
            t = self._install(problem, [])
        return t

    def __call__(self, shape, m: int | None = None):
        if m is None:
            mm, n, k = shape
            byk = self._dense.get(n)
            if byk is not None:
                t = byk.get(k)
                if t is not None and mm > 0:
                    return t(mm)
            return self.table(Problem.dense(n, k))(check_m(mm))
        hit = self._by_id.get(id(shape))
        if hit is not None and m > 0:
            return hit[1](m)
        t = self.table(shape)
        if len(self._by_id) < 4096:
            self._by_id[id(shape)] = (shape, t)      # holding the problem keeps its id unique
        return t(check_m(m))

    def tactic_for(self, problem: Problem, m: int) -> tuple[str, Tactic]:
        """("winner" | "pinned" | "default", tactic) for debugging and `autotune show`."""
        rung, t = self.table(problem).rung_for(m)
        return ("winner" if rung in ("exact", "nearest") else rung), t

    def rung_for(self, problem: Problem, m: int) -> tuple[str, Tactic]:
        return self.table(problem).rung_for(m)

    @property
    def stats(self) -> Counter:
        """Calls answered per rung, plus "hit" (exact + nearest) and "miss" (default)."""
        c: Counter = Counter()
        for t in self._tables.values():
            for r, n in zip(RUNGS, t.counts):
                if n:
                    c[r] += n
        c["hit"] = c["exact"] + c["nearest"]
        c["miss"] = c["default"]
        return +c

    @property
    def misses(self) -> Counter:
        """(problem key, M) -> calls answered by the default rung."""
        return Counter({(p.key, m): n for p, t in self._tables.items() for m, n in t.misses.items()})

    # --- pinning -------------------------------------------------------------------------------
    def pin(self, problem: Problem, tactic: Tactic | str | dict) -> None:
        """Force `tactic` for every M of `problem` (debugging, A/B runs). Raises ValueError when
        the tactic is not valid for its family or is rejected for this problem on this arch."""
        t = parse_tactic(tactic)
        self._pins[problem.key] = t
        self._pin_table(self.table(problem), t)

    def _pin_table(self, table: Table, t: Tactic) -> None:
        from tactics import registry
        why = registry.validate(t.family, t.params)
        if why:
            raise ValueError(f"cannot pin {t} for {table.problem.key}: {why}")
        fam = registry.get(t.family)
        ok, why = fam.available(self.env.device)
        if not ok:
            raise ValueError(f"cannot pin {t} for {table.problem.key}: {why}")
        v = fam.verdict(table.problem, t, self.arch)
        if v.rejected:
            raise ValueError(f"cannot pin {t} for {table.problem.key}: {v.reason}")
        table._set_pin(self._kernel(table.problem, t), t)

    def unpin(self, problem: Problem) -> None:
        self._pins.pop(problem.key, None)
        t = self._tables.get(problem)
        if t is not None:
            t._set_pin(None, None)

    # --- misses --------------------------------------------------------------------------------
    def _misses_store(self):
        from cache import Store
        target = self._misses_to if self._misses_to is not None else settings.misses_url()
        if target == "memory":
            return None
        if target is None:
            if hasattr(self._cache, "record_misses") and not getattr(self._cache, "readonly", False):
                return self._cache
            if not self._cache_writable or self.cache_url is None:
                return None            # a read-only image: misses stay in memory (Dispatcher.misses)
            target = self.cache_url
        if hasattr(target, "record_misses"):
            return target
        Store.check_writable(target)
        return Store(target)

    def flush_misses(self) -> int:
        """Write the misses counted since the last flush; returns how many (problem, M) rows.
        Best effort: never raises (a serving process must not die at exit over a log)."""
        if not self._record:
            return 0
        now = self.misses
        delta = {k: n - self._flushed.get(k, 0) for k, n in now.items() if n > self._flushed.get(k, 0)}
        if not delta:
            return 0
        try:
            store = self._misses_store()
            if store is None:
                return 0
            store.record_misses(Miss(pk, m, self.env.device_key, c) for (pk, m), c in delta.items())
            self._flushed.update({k: now[k] for k in delta})
            return len(delta)
        except Exception as e:  # noqa: BLE001
            log.debug("could not record misses: %s", e)
            return 0


class _LazyDefault:
    """The default kernel of a problem, built (and warned about) on its first call only, so that
    creating a table at load time costs nothing for problems that have winners."""

    __slots__ = ("_d", "_p", "_t", "_k")

    def __init__(self, d: Dispatcher, p: Problem, t: Tactic):
        self._d, self._p, self._t, self._k = d, p, t, None

    def __call__(self, *args, **kw):
        k = self._k
        if k is None:
            k = self.resolve()
        return k(*args, **kw)

    def resolve(self) -> Callable:
        if self._k is None:
            d = self._d
            if d._warn:
                warnings.warn(f"fp4-autotune: no tuned tactic for {self._p.key} on {d.env.gpu_name}; "
                              f"using the default {self._t} (run `autotune search --from-misses`)", stacklevel=4)
            self._k = d._kernel(self._p, self._t)
        return self._k


def _writable(store) -> bool:
    p = getattr(store, "path", None)
    if p is None:
        return False
    return os.access(p, os.W_OK) and os.access(p.parent, os.W_OK | os.X_OK)


# ------------------------------------------------------------------------------------- pins

def _parse_pins(text: str) -> dict[str, Tactic]:
    """$AUTOTUNE_PIN: JSON {"<problem key>" | "*": tactic}, or `KEY=family[k=v,...]` items
    separated by ';'."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(f"${PIN_ENV} is not valid JSON: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"${PIN_ENV} must map problem keys to tactics")
        items: Iterable = doc.items()
    else:
        items = []
        for part in filter(None, (p.strip() for p in text.split(";"))):
            key, eq, tac = part.partition("=")
            if not eq:
                raise ValueError(f"${PIN_ENV} item {part!r} is not KEY=family[k=v,...]")
            items.append((key.strip(), tac))
    out = {}
    for key, tac in items:
        if key != "*":
            try:
                Problem.from_key(key)
            except ValueError as e:
                raise ValueError(f"${PIN_ENV}: {e}") from None
        try:
            out[key] = parse_tactic(tac)
        except (ValueError, TypeError) as e:
            raise ValueError(f"${PIN_ENV}: {e}") from None
    return out


# --------------------------------------------------------------------------- misses -> search

def search_input_from_misses(misses: Iterable[Miss], device_key: str,
                             problem_keys: set[str] | None = None) -> tuple[list[Problem], tuple[int, ...], int]:
    """What `autotune search --from-misses` tunes: the missed problems of this device (optionally
    only those in problem_keys) and the M values they were called with, as buckets. Engines call
    every layer with the same M per forward, so one shared bucket set is (nearly) exact.
    Returns (problems, buckets, rows skipped because their problem key does not parse)."""
    problems: dict[str, Problem] = {}
    ms: set[int] = set()
    bad = 0
    for m in misses:
        if m.device_key != device_key or (problem_keys is not None and m.problem_key not in problem_keys):
            continue
        try:
            p = problems.get(m.problem_key) or Problem.from_key(m.problem_key)
            check_m(m.m)
        except (ValueError, TypeError):
            bad += 1
            continue
        problems[m.problem_key] = p
        ms.add(m.m)
    return sorted(problems.values(), key=lambda p: p.key), tuple(sorted(ms)), bad


# ------------------------------------------------------------------------------ process-wide

_default: Dispatcher | None = None


def dispatch(shape, m: int | None = None):
    """`dispatch((M, N, K))` for a dense bf16 × NVFP4 → bf16 GEMM, or `dispatch(problem, m)`.

    Returns kernel(x, w) computing y[M, N] = x[M, K] · W[N, K]ᵀ with x bf16 and w an FP4Weight.
    """
    global _default
    if _default is None:
        _default = Dispatcher()
    return _default(shape, m)


def default_dispatcher() -> Dispatcher:
    global _default
    if _default is None:
        _default = Dispatcher()
    return _default


def reset(dispatcher: Dispatcher | None = None) -> None:
    """Drop the process-wide table (tests, or after a new search in the same process)."""
    global _default
    _default = dispatcher
