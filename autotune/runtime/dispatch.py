"""Runtime dispatch: `dispatch((M, N, K))` or `dispatch(problem, m)` → kernel(x, w).

Winners are read once per process into one `Table` per problem (autotune.runtime.table: the
ladder pinned → exact → nearest → default, counted per rung). Engines that know their problem and
weight at load time call `dispatcher.bind(problem, weight)` once and keep the `BoundTable`: a call
then picks by M and launches a launcher bound at load (autotune.runtime.bound).

Every stored winner is checked before it is used: known family, parameters valid for the family,
tactic id matching its parameters, library versions equal to the live ones, code key equal to
this code's (autotune.core.codekey: a winner measured by other kernel, launch or pack code is not
served, with one warning naming the refresh), verdict not rejected on the live arch, kernel
builds. Anything else is skipped with a counted reason (`skipped`), so the problem falls through
to the next rung; a damaged cache never takes the serving process down.

Batch-invariant mode (`batch_invariant=True`, $AUTOTUNE_BATCH_INVARIANT, or vLLM's
$VLLM_BATCH_INVARIANT): a row's result must not depend on the batch, so each problem serves ONE
tactic for every M (through the pinned rung), and only one its family calls batch-invariant: the
stored winners' one (a `--batch-invariant` search stores one per problem), else the invariant
winner covering the most buckets (warned: per-M tuning is lost), else the designated default if
invariant; with none, using the problem raises a one-line error — never a silent mix of tactics.
"""
from __future__ import annotations

import atexit
import logging
import os
import warnings
from collections import Counter
from typing import Any, Callable

from autotune.core.env import Env, current
from autotune.core.problem import Problem, check_m
from autotune.core.records import Miss
from autotune.core import settings
from autotune.core.arch import ARCHS, Arch, detect
from autotune.core.formats import FP4Weight
from autotune.core.operands import checked
from autotune.core.tactic import Tactic, parse_tactic
from autotune.runtime.bound import BoundTable
from autotune.cache import CacheError, Store, check_winner, verify_for_serving
from autotune.runtime.pins import PIN_ENV, parse_pins
from autotune.runtime.table import RUNGS, LazyDefault, Table
from autotune.tactics import registry

log = logging.getLogger("autotune.runtime.dispatch")

MISSES_ENV, IMMUTABLE_ENV = settings.MISSES, settings.CACHE_IMMUTABLE
#: the skipped reason of a winner whose code key is not this code's (autotune.tactics.registry.stale_code)
_CODE_DIFFERS = "code differs"


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
                 pins: dict[str, Any] | None = None, immutable: bool | None = None, warn: bool = True,
                 batch_invariant: bool | None = None):
        self.env = env or current()
        self.batch_invariant = settings.batch_invariant() if batch_invariant is None else bool(batch_invariant)
        self.invariant_notes: dict[str, str] = {}              # problem key -> what batch-invariant mode serves
        self._refused: dict[Problem, str] = {}                 # batch-invariant: no invariant tactic
        self.arch = arch or (detect() if self.env.device == "cuda" else ARCHS["cpu"])
        self._cache = cache
        self._immutable = immutable if immutable is not None else settings.cache_immutable()
        self._tables: dict[Problem, Table] = {}
        self._by_id: dict[int, tuple[Problem, Table]] = {}    # id(problem) -> table, no hashing per call
        # N -> K -> the table's bound __call__ (bf16 x nvfp4 -> bf16): the (M, N, K) form's fast path
        self._dense: dict[int, dict[int, Callable]] = {}
        self._winners: dict[Problem, list[tuple[int, Tactic]]] = {}
        self._built: dict[tuple[Problem, Tactic], Callable] = {}
        self._pins: dict[str, Tactic] = {}
        self._warn = warn
        self.skipped: Counter = Counter()                     # why stored winners were not used
        self.cache_error: str | None = None
        self._record = record_misses
        self._misses_to = misses
        self._flushed: dict[tuple[str, int], int] = {}
        for key, t in {**parse_pins(settings.pins()), **(pins or {})}.items():
            self._pins[key] = parse_tactic(t)
        self._load()
        for key in self._pins:
            if key != "*":
                self.table(Problem.from_key(key))      # installs the table with its pin
        if record_misses:
            atexit.register(self.flush_misses)

    # --- loading -------------------------------------------------------------------------------
    def _open(self):
        if hasattr(self._cache, "winners"):
            return self._cache, False
        return Store(self._cache, readonly=True, immutable=self._immutable or None), True

    def _load(self) -> None:
        try:
            store, owned = self._open()
            try:
                ok, why = verify_for_serving(store)     # a configured signing key must vouch for the file
                if not ok:
                    raise CacheError(why)
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
        stale = 0
        for w in winners:
            why = self._check(w)
            if why:
                self.skipped[why] += 1
                stale += why.endswith(_CODE_DIFFERS)
                log.debug("winner %s bucket %s skipped: %s", w.problem_key, w.bucket, why)
        if stale and self._warn:        # once per cache: the numbers are not this code's
            warnings.warn(f"fp4-autotune: {stale} cached winner(s) were measured with other kernel code and are "
                          f"not served; {registry.REFRESH}", stacklevel=3)
        for p, items in self._winners.items():
            items.sort(key=lambda r: r[0])
            self._install(p, items)

    def _check(self, w) -> str | None:
        """Why a stored winner cannot be used here (None: it was accepted into _winners). The
        structural half is autotune.cache.rows (shared with import and show), the family half
        autotune.tactics.registry.usable (shared with pins); the reason's head before ':' is what counts."""
        why = check_winner(w)
        if why:
            return why
        t, p = Tactic.from_json(w.params_json), Problem.from_key(w.problem_key)
        try:
            fam = registry.get(t.family)
        except (ValueError, ImportError):
            return "unknown family"
        if w.lib_key != self.env.lib_key(fam.depends_on):
            return f"{t.family} library version differs"
        if registry.stale_code(w) is not None:     # computed once per member per process
            return f"{t.family} {_CODE_DIFFERS}"
        why = registry.usable(p, t, self.arch, self.env.device)
        if why:
            log.debug("winner %s bucket %s: %s", w.problem_key, w.bucket, why)
            return why.split(":", 1)[0]
        try:
            self._kernel(p, t)
        except Exception as e:  # noqa: BLE001 - a kernel that cannot be built is a skip, not a crash
            return f"{t.family} build failed: {type(e).__name__}"
        self._winners.setdefault(p, []).append((w.bucket, t))
        return None

    def _kernel(self, p: Problem, t: Tactic) -> Callable:
        """The unbound kernel(x, w, ...), every operand checked against `p` on each call."""
        k = self._built.get((p, t))
        if k is None:
            k = self._built[(p, t)] = checked(p, registry.get(t.family).build(p, t, self.env.device))
        return k

    def _default_tactic(self, problem: Problem) -> Tactic:
        return registry.designated_default(problem, self.arch, self.env.device)

    def _install(self, p: Problem, items: list[tuple[int, Tactic]]) -> Table:
        dt = self._default_tactic(p)
        old = self._tables.get(p)
        t = Table(p, tuple(b for b, _ in items), tuple(self._kernel(p, x) for _, x in items),
                  tuple(x for _, x in items),
                  LazyDefault(self._kernel, p, dt, self.env.gpu_name if self._warn else None), dt)
        if old is not None:      # keep counts and pins across a re-install
            t.counts, t.misses = old.counts, old.misses
            if old.pinned is not None:
                t._set_pin(old.pinned, old.pinned_tactic)
        self._tables[p] = t
        if t.pinned is None and p.key in self._pins:
            self._pin_table(t, self._pins[p.key])          # an explicit pin must fit: raises if not
        elif t.pinned is None and "*" in self._pins:
            try:
                self._pin_table(t, self._pins["*"])
            except ValueError:
                self.skipped[f"pin * does not fit {p.kind}"] += 1
        if t.pinned is None and self.batch_invariant and not self._pin_invariant(t, items):
            return t                         # refused: not on the (M, N, K) fast path; table() raises
        self._fast_path(t)
        return t

    def _fast_path(self, t: Table) -> None:
        """The (M, N, K) form's dict for bf16 x nvfp4 -> bf16 dense tables."""
        p = t.problem
        if p.kind == "dense" and p.a_fmt == "bf16" and p.w_fmt == "nvfp4" and p.out_dtype == "bf16":
            self._dense.setdefault(p.n, {})[p.k] = t.__call__

    def _pin_invariant(self, t: Table, items: list[tuple[int, Tactic]]) -> bool:
        """Batch-invariant mode: pin the problem's one invariant tactic; False (and refused) if none."""
        p = t.problem
        pick, note = self._invariant_pick(p, items, t.default_tactic)
        if pick is None:
            self._refused[p] = note
            self._dense.get(p.n, {}).pop(p.k, None)
            return False
        t._set_pin(self._kernel(p, pick), pick)
        self.invariant_notes[p.key] = note or f"one tactic for every M: {pick}"
        if note and self._warn:
            warnings.warn(f"fp4-autotune: batch-invariant: {p.key}: {note}", stacklevel=5)
        return True

    def _invariant(self, p: Problem, t: Tactic) -> bool:
        try:
            return bool(registry.get(t.family).batch_invariant(p, t))
        except (ValueError, ImportError):
            return False

    def _invariant_pick(self, p: Problem, items: list[tuple[int, Tactic]], dt: Tactic) -> tuple[Tactic | None, str]:
        """(the one tactic for every M, a note when it is not simply the stored one) or (None, why)."""
        ok = [x for _, x in items if self._invariant(p, x)]
        if ok and len({x for _, x in items}) == 1:
            return ok[0], ""
        if ok:
            pick = max(set(ok), key=lambda x: (ok.count(x), x.id))
            return pick, (f"the stored winners name {len({x for _, x in items})} tactics; serving {pick} for every M "
                          f"(the winner of {ok.count(pick)} of {len(items)} buckets): `autotune search "
                          "--batch-invariant` tunes one tactic for every M")
        if self._invariant(p, dt):
            return dt, (f"no stored winner is batch-invariant; serving the designated default {dt} for every M"
                        if items else "")
        return None, (f"{p.key}: no batch-invariant tactic (stored winners: {len(items)}; the designated default "
                      f"{dt} is not batch-invariant on {self.arch.name}); run `autotune search --batch-invariant` "
                      "or turn batch-invariant mode off")

    # --- lookups -------------------------------------------------------------------------------
    def table(self, problem: Problem) -> Table:
        """The problem's table (created on first use: then it answers from the default rung)."""
        t = self._tables.get(problem) or self._install(problem, [])
        if self._refused and problem in self._refused:
            raise ValueError(self._refused[problem])
        return t

    def bind(self, problem: Problem, weight: FP4Weight, *, one_copy: bool = False) -> BoundTable:
        """The problem's table with `weight` bound (checked once, packed once per layout): what a
        layer keeps at load and calls per forward. `.rebind(weight)` after moving the weight.
        one_copy=True: one layout for every M, written over `weight`'s own storage where its
        family can (the weight is then no checkpoint-layout weight); `.substituted` lists the
        rungs that run another tactic for it (autotune.runtime.onecopy)."""
        return BoundTable(self.table(problem), weight, self.env.device, one_copy=one_copy, arch=self.arch)

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
        self._pin_table(self._tables.get(problem) or self._install(problem, []), t)
        self._pins[problem.key] = t         # recorded once it fits (a re-install pins it again)

    def _pin_table(self, table: Table, t: Tactic) -> None:
        why = registry.usable(table.problem, t, self.arch, self.env.device)
        if not why and self.batch_invariant and not self._invariant(table.problem, t):
            why = "not batch-invariant (batch-invariant mode is on)"
        if why:
            raise ValueError(f"cannot pin {t} for {table.problem.key}: {why}")
        table._set_pin(self._kernel(table.problem, t), t)
        if self._refused.pop(table.problem, None) is not None:
            self._fast_path(table)           # a refused problem, now served by the pin

    def unpin(self, problem: Problem) -> None:
        """Back to the stored winners; in batch-invariant mode to the one invariant tactic, and
        refused (ValueError, the pin stays) when there is none: bound layers would otherwise fall
        back to the per-M ladder."""
        t = self._tables.get(problem)
        if t is not None and self.batch_invariant:
            items = self._winners.get(problem, [])
            pick, note = self._invariant_pick(problem, items, t.default_tactic)
            if pick is None:
                raise ValueError(f"cannot unpin: {note}")
        self._pins.pop(problem.key, None)
        if t is not None:
            t._set_pin(None, None)
            if self.batch_invariant:         # back to the one invariant tactic, never the per-M ladder
                self._pin_invariant(t, items)

    # --- misses --------------------------------------------------------------------------------
    def _misses_store(self):
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


def _writable(store) -> bool:
    p = getattr(store, "path", None)
    if p is None:
        return False
    return os.access(p, os.W_OK) and os.access(p.parent, os.W_OK | os.X_OK)


# ------------------------------------------------------------------------------ process-wide

_default: Dispatcher | None = None


#: the default dispatcher's N -> K -> table lookup (the same dict object, so installs show up)
_DENSE: dict[int, dict[int, Callable]] = {}


def dispatch(shape, m: int | None = None):
    """`dispatch((M, N, K))` for a dense bf16 × NVFP4 → bf16 GEMM, or `dispatch(problem, m)`.

    Returns kernel(x, w) computing y[M, N] = x[M, K] · W[N, K]ᵀ with x bf16 and w an FP4Weight.
    Engines that know their problem and weight at load should bind instead (`Dispatcher.bind`):
    `bound.launcher(M)(x)` skips this lookup and the per-call weight check.
    """
    if m is None:                          # the README's form, inlined: module dict, table's bound call
        mm, n, k = shape
        byk = _DENSE.get(n)
        if byk is not None:
            t = byk.get(k)
            if t is not None and mm > 0:
                return t(mm)
    return default_dispatcher()(shape, m)


def default_dispatcher() -> Dispatcher:
    if _default is None:
        reset(Dispatcher())
    return _default


def reset(dispatcher: Dispatcher | None = None) -> None:
    """Drop the process-wide table (tests, or after a new search in the same process)."""
    global _default, _DENSE
    _default = dispatcher
    _DENSE = dispatcher._dense if dispatcher is not None else {}
