"""Runtime dispatch: `dispatch((M, N, K))` or `dispatch(problem, m)` → kernel(x, w).

Winners are read once per process into one `Table` per problem (autotune.runtime.table: the
ladder pinned → exact → nearest → default, counted per rung). Engines that know their problem and
weight at load time call `dispatcher.bind(problem, weight)` once and keep the `BoundTable`: a call
then picks by M and launches a launcher bound at load (autotune.runtime.bound).

`Dispatcher` is a façade over single-purpose parts, each its own module: the loader opens,
verifies and vets the cache (autotune.runtime.loader: every stored winner is checked — known
family, valid parameters, id matching them, library versions equal to the live ones, code key
equal to this code's (autotune.core.codekey; one warning names the refresh), verdict not
rejected on the live arch, kernel builds — or skipped with a counted reason, `skipped`), the table
builder makes each problem's Table (autotune.runtime.builder), the serving policy is data (pins,
batch-invariant, one-copy: autotune.runtime.policy), and the miss recorder writes what the default
rung answered (autotune.runtime.misses), at exit through a finalizer that holds no dispatcher.

Batch-invariant mode (`batch_invariant=True`, $AUTOTUNE_BATCH_INVARIANT, or vLLM's
$VLLM_BATCH_INVARIANT): a row's result must not depend on the batch, so each problem serves ONE
tactic for every M (through the pinned rung), and only one its family calls batch-invariant: the
stored winners' one (a `--batch-invariant` search stores one per problem), else the invariant
winner covering the most buckets (warned: per-M tuning is lost), else the designated default if
invariant; with none, using the problem raises a one-line error — never a silent mix of tactics.
"""
from __future__ import annotations

import os
import warnings
import weakref
from collections import Counter
from typing import Any, Callable

from autotune.core.arch import ARCHS, Arch, detect
from autotune.core.env import Env, current
from autotune.core.formats import FP4Weight
from autotune.core.problem import Problem, check_m
from autotune.core import settings
from autotune.core.tactic import Tactic, parse_tactic
from autotune.runtime import loader, onecopy
from autotune.runtime.bound import BoundTable
from autotune.runtime.builder import TableBuilder
from autotune.runtime.misses import MissRecorder, counted, flush_at_exit
from autotune.runtime.pins import check_star_pin
from autotune.runtime.policy import ServingPolicy, invariant_pick
from autotune.runtime.table import RUNGS, Table
from autotune.tactics import registry
from autotune.tactics.scratch import ScratchPool

MISSES_ENV, IMMUTABLE_ENV = settings.MISSES, settings.CACHE_IMMUTABLE


class Dispatcher:
    """One per process (or per cache).

    cache: a Store, a path or URL (default $AUTOTUNE_CACHE); always opened read-only, and
    immutable (no -wal/-shm files, works on a read-only filesystem) when nothing can be writing it.
    misses: where counted misses go at exit: "memory" (nowhere), a path/URL of a writable cache,
    or None = $AUTOTUNE_MISSES, else the cache itself if it is writable, else memory.
    pins: {problem key or "*": tactic} forced tactics; $AUTOTUNE_PIN adds to them.
    one_copy: what `bind` (and FP4Linear, FP4MLP, FP4MoE on this dispatcher) does unless told: one
    layout per bound weight; one_copy_upto: M — one copy (it implies one_copy), the layout chosen
    by the rungs up to M (the largest batch the engine captures in CUDA graphs); one copy without
    it chooses by the rungs up to `onecopy.DECODE_UPTO`, never by every rung. A dispatcher binding
    weights in more than one layout warns once, in one line, when two copies of what it bound would
    not fit the device (autotune.runtime.onecopy, docs/serving.md "One copy in an engine").
    """

    def __init__(self, cache=None, *, env: Env | None = None, arch: Arch | None = None,
                 record_misses: bool = True, misses: str | os.PathLike | None = None,
                 pins: dict[str, Any] | None = None, immutable: bool | None = None, warn: bool = True,
                 batch_invariant: bool | None = None, one_copy: bool = False,
                 one_copy_upto: int | None = None):
        self.env = env or current()
        self.arch = arch or (detect() if self.env.device == "cuda" else ARCHS["cpu"])
        # one_copy_upto names the layout's M range: it means one copy
        self.policy = ServingPolicy.from_settings(pins, batch_invariant, one_copy or one_copy_upto is not None,
                                                  one_copy_upto)
        self.copies = onecopy.CopyWatch()
        #: workspaces (split-K, reduce) shared by every launcher this dispatcher builds or binds, one
        #: set per (device, stream), and the bad-id words of its MoE layers (tactics/scratch.py)
        self.scratch = ScratchPool()
        self.builder = TableBuilder(self.env, self.arch, warn, self.scratch)
        self._warn = warn
        immutable = immutable if immutable is not None else settings.cache_immutable()
        loaded = loader.load(cache, self.env, self.arch, self.builder.kernel, immutable=immutable)
        self._source, self._immutable = cache, immutable      # one-copy substitutes read its trials at bind
        self._bests: dict[tuple[Problem, int], dict[str, Tactic]] = {}
        self.skipped: Counter = loaded.skipped               # why stored winners were not used
        self.cache_error, self.cache_url = loaded.error, loaded.url
        if loaded.error:
            warnings.warn(f"fp4-autotune: cache not used ({loaded.error}); every problem takes its default",
                          stacklevel=2)
        stale = sum(n for why, n in loaded.skipped.items() if why.endswith(loader.CODE_DIFFERS))
        if stale and warn:          # once per cache: the numbers are not this code's
            warnings.warn(f"fp4-autotune: {stale} cached winner(s) were measured with other kernel code and are "
                          f"not served; {registry.REFRESH}", stacklevel=2)
        self._winners = loaded.winners
        self._predicted = loaded.predicted                    # problem -> buckets whose winner is predicted
        self.recorder = MissRecorder(self.env.device_key, record=record_misses, to=misses, cache=cache,
                                     cache_url=loaded.url, cache_writable=loaded.writable)
        self.invariant_notes: dict[str, str] = {}              # problem key -> what batch-invariant mode serves
        self._refused: dict[Problem, str] = {}                 # batch-invariant: no invariant tactic
        self._tables: dict[Problem, Table] = {}
        self._by_id: dict[int, tuple[Problem, Table]] = {}    # id(problem) -> table, no hashing per call
        # N -> K -> the table's bound __call__ (bf16 x nvfp4 -> bf16): the (M, N, K) form's fast path
        self._dense: dict[int, dict[int, Callable]] = {}
        star = self.policy.pins.get("*")
        if star is not None:      # a `*` pin that can pin nothing is refused, never dropped silently
            check_star_pin(star, [*self._winners, *self.policy.explicit()],
                           lambda p, t: registry.usable(p, t, self.arch, self.env.device))
        for p, items in self._winners.items():
            self._install(p, items)
        for p in self.policy.explicit():
            self.table(p)                                      # installs the table with its pin
        if record_misses:
            weakref.finalize(self, flush_at_exit, self.recorder, self._tables)

    # --- the parts' answers, under the names callers and tests use --------------------------
    @property
    def batch_invariant(self) -> bool:
        return self.policy.batch_invariant

    @property
    def _record(self) -> bool:
        return self.recorder.record

    @_record.setter
    def _record(self, on: bool) -> None:
        self.recorder.record = on

    def _kernel(self, p: Problem, t: Tactic) -> Callable:
        return self.builder.kernel(p, t)

    def _default_tactic(self, problem: Problem) -> Tactic:
        return self.builder.default_tactic(problem)

    # --- tables under the policy ---------------------------------------------------------------
    def _install(self, p: Problem, items: list[tuple[int, Tactic]]) -> Table:
        t = self._tables[p] = self.builder.table(p, items, self._tables.get(p), self._predicted.get(p, frozenset()))
        pin, explicit = self.policy.pin_for(p)
        if t.pinned is None and pin is not None:
            try:
                self._pin_table(t, pin)                # an explicit pin must fit: raises if not
            except ValueError:
                if explicit:
                    raise
                self.skipped[f"pin * does not fit {p.kind}"] += 1
        if t.pinned is None and self.batch_invariant and not self._pin_invariant(t, items):
            return t                         # refused: not on the (M, N, K) fast path; table() raises
        self._fast_path(t)
        return t

    def _fast_path(self, t: Table) -> None:
        """The (M, N, K) form's dict for bf16 x nvfp4 -> bf16 dense tables (plain GEMMs: a swiglu
        problem of the same N, K is another function, reached through its Problem only)."""
        p = t.problem
        if p.kind == "dense" and p.a_fmt == "bf16" and p.w_fmt == "nvfp4" and p.out_dtype == "bf16" \
                and p.epilogue == "none":
            self._dense.setdefault(p.n, {})[p.k] = t.__call__

    def _invariant(self, p: Problem, t: Tactic) -> bool:
        try:
            return bool(registry.get(t.family).batch_invariant(p, t))
        except (ValueError, ImportError):
            return False

    def _pin_invariant(self, t: Table, items: list[tuple[int, Tactic]]) -> bool:
        """Batch-invariant mode: pin the problem's one invariant tactic; False (and refused) if none."""
        p = t.problem
        pick, note = invariant_pick(p, items, t.default_tactic, self._invariant, self.arch.name)
        if pick is None:
            self._refused[p] = note
            if p.epilogue == "none":
                self._dense.get(p.n, {}).pop(p.k, None)
            return False
        t._set_pin(self._kernel(p, pick), pick)
        self.invariant_notes[p.key] = note or f"one tactic for every M: {pick}"
        if note and self._warn:
            warnings.warn(f"fp4-autotune: batch-invariant: {p.key}: {note}", stacklevel=5)
        return True

    # --- lookups -------------------------------------------------------------------------------
    def table(self, problem: Problem) -> Table:
        """The problem's table (created on first use: then it answers from the default rung)."""
        t = self._tables.get(problem) or self._install(problem, [])
        if self._refused and problem in self._refused:
            raise ValueError(self._refused[problem])
        return t

    def bind(self, problem: Problem, weight: FP4Weight, *, one_copy: bool | None = None,
             bad_word: Callable[[Any], Any] | None = None) -> BoundTable:
        """The problem's table with `weight` bound (checked once, packed once per layout): what a
        layer keeps at load and calls per forward. `.rebind(weight)` after moving the weight.
        one_copy=True: one layout for every M, written over `weight`'s own storage where its
        family can (the weight is then no checkpoint-layout weight); `.substituted` lists the
        rungs that run another tactic for it (autotune.runtime.onecopy). Every launcher takes its
        workspaces from `self.scratch`; bad_word(device): the word grouped-MoE launchers set for
        bad ids (FP4MoE gives its own; default: one word per bound table, labelled by its problem)."""
        one_copy = self.policy.one_copy if one_copy is None else one_copy
        if bad_word is None and problem.kind == "grouped_moe":
            words: dict = {}

            def bad_word(device, _key=problem.key):
                w = words.get(str(device))
                if w is None:
                    w = words[str(device)] = self.scratch.word(device, _key)
                return w
        table = self.table(problem)
        self.watch_copies(table, weight, one_copy)
        return BoundTable(table, weight, self.env.device, one_copy=one_copy, arch=self.arch,
                          scratch=self.scratch, bad_word=bad_word, one_copy_upto=self.policy.one_copy_upto,
                          best=self.best_of(problem))

    def watch_copies(self, table: Table, weight: FP4Weight, one_copy: bool) -> None:
        """Before a binding packs: count the copies it will hold beside the checkpoint; warn once
        when two copies of the weights bound so far would not fit the device."""
        if one_copy:
            return
        msg = self.copies.bound(table, weight.nbytes, self.env.device)
        if msg is not None:
            warnings.warn(msg, stacklevel=3)

    def best_of(self, problem: Problem) -> Callable[[int, str], Tactic | None]:
        """(bucket, layout) -> the fastest servable trial of that layout the cache measured for
        `problem` at that bucket (None: none, or an export without trials): what a one-copy binding
        runs where the winner reads another layout. Reads the cache once per (problem, bucket), at
        bind — never on the call path."""
        def best(bucket: int, layout: str) -> Tactic | None:
            k = (problem, bucket)
            if k not in self._bests:
                self._bests[k] = ({} if self.cache_error else
                                  loader.bests_by_layout(self._source, self.env, self.arch, self.builder.kernel,
                                                         problem, bucket, immutable=self._immutable))
            return self._bests[k].get(layout)
        return best

    def routing_errors(self, clear: bool = True) -> list[str]:
        """What set a bad-id word since the last read (expert ids outside [-1, E): their rows came
        out NaN): the labels of the words (FP4MoE layers: `FP4MoE.label`; other bound grouped
        tables: the problem key). One device→host read per device — a host sync: an engine calls it
        once per step (after a graph replay too), or in debug. clear=True (default) resets the
        words it read (read-and-clear); clear=False leaves them set."""
        return self.scratch.errors(clear)

    def __call__(self, shape, m: int | None = None):
        if m is None:
            mm, n, k = shape
            byk = self._dense.get(n)
            if byk is not None:
                t = byk.get(k)
                if t is not None and mm.__class__ is int and mm > 0:   # not 1.5, not True: check_m says why
                    return t(mm)
            return self.table(Problem.dense(n, k))(check_m(mm))
        hit = self._by_id.get(id(shape))
        if hit is not None and m.__class__ is int and m > 0:
            return hit[1](m)
        t = self.table(shape)
        if len(self._by_id) < 4096:
            self._by_id[id(shape)] = (shape, t)      # holding the problem keeps its id unique
        return t(check_m(m))

    def tactic_for(self, problem: Problem, m: int) -> tuple[str, Tactic]:
        """("winner" | "pinned" | "default", tactic) for debugging and `autotune show`."""
        rung, t = self.table(problem).rung_for(m)
        return ("winner" if rung in ("exact", "predicted", "nearest") else rung), t

    def rung_for(self, problem: Problem, m: int) -> tuple[str, Tactic]:
        return self.table(problem).rung_for(m)

    @property
    def stats(self) -> Counter:
        """Calls answered per rung, plus "hit" (exact + predicted + nearest) and "miss" (default)."""
        c: Counter = Counter()
        for t in self._tables.values():
            for r, n in zip(RUNGS, t.counts):
                if n:
                    c[r] += n
        c["hit"] = c["exact"] + c["predicted"] + c["nearest"]
        c["miss"] = c["default"]
        return +c

    @property
    def misses(self) -> Counter:
        """(problem key, M) -> calls answered by the default rung."""
        return counted(self._tables)

    # --- pinning -------------------------------------------------------------------------------
    def pin(self, problem: Problem, tactic: Tactic | str | dict) -> None:
        """Force `tactic` for every M of `problem` (debugging, A/B runs). Raises ValueError when
        the tactic is not valid for its family or is rejected for this problem on this arch."""
        t = parse_tactic(tactic)
        self._pin_table(self._tables.get(problem) or self._install(problem, []), t)
        self.policy.pins[problem.key] = t   # recorded once it fits (a re-install pins it again)

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
            pick, note = invariant_pick(problem, items, t.default_tactic, self._invariant, self.arch.name)
            if pick is None:
                raise ValueError(f"cannot unpin: {note}")
        self.policy.pins.pop(problem.key, None)
        if t is not None:
            t._set_pin(None, None)
            if self.batch_invariant:         # back to the one invariant tactic, never the per-M ladder
                self._pin_invariant(t, items)

    # --- misses --------------------------------------------------------------------------------
    def flush_misses(self) -> int:
        """Write the misses counted since the last flush; returns how many (problem, M) rows.
        Best effort: never raises (a serving process must not die at exit over a log)."""
        return self.recorder.flush(self.misses)


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
            if t is not None and mm.__class__ is int and mm > 0:
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
