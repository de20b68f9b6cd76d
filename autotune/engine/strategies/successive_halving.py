"""Measuring one (problem, bucket): check every tactic, then successive halving, then an
interleaved final round.

1. check: build and run once against the float64 reference; a failure is final for the tactic.
2. halving rounds: every survivor gets a short timing, the best 1/eta (never fewer than
   `finalists`, always the designated default) go on with a longer one; the rest are stored as
   `dropped` with the time that dropped them.
3. final: the last few are re-timed interleaved (A B C A B C …) so drift (clocks, heat, other
   load) hits all of them alike; each one's median over the cycles is its stored time.
4. replay check: each finalist is run as an engine serves it, under graph replay with inputs
   refreshed in place (autotune.engine.replay); one that fails there is stored as failed, "wrong
   under graph replay", and never wins. Those that passed are stored `replay_checked`. On a
   count-bound host (below) only the finalists that can still win are replayed (the winner rule's
   contenders), drawn again after a failure, so the winner has always passed.

`exhaustive` skips 2 and 3 and times every survivor with the full timer (the reference the halving is checked against).

On a count-bound host (`measure_host`: the CPU, where one call of the torch reference takes 0.1-8 s and
outlasts the job's whole budget, so halving's minimum reps — a check and >= 3 interleaved cycles per
tactic — set the cost, not its budget) the check's call, timed on the host by the same clock as a
timing rep, is each tactic's first sample: a tactic slower than the fastest check by more than
`host_window` is dropped on it, and the near-ties (with the default) are timed once more, interleaved.
Trials are handed to `emit` as soon as they are decided, so each commits on its own.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

from autotune.core import winner as winner_rule
from autotune.engine.options import Halving, TimerConfig  # declared with every other knob
from autotune.engine.executor import Executor, Outcome, TacticError, WorkerLost
from autotune.core.tactic import Tactic


def _round_timer(base: TimerConfig, budget_s: float, min_reps: int) -> TimerConfig:
    return replace(base, budget_s=max(budget_s, 1e-4), min_reps=min_reps, max_reps=max(min_reps, base.max_reps))


def _timer_of(ex: Executor, alive: list[Tactic], checked: dict,
              emit: Callable[[Outcome], None]) -> Callable[[Tactic, TimerConfig], dict | None]:
    """`timed(t, cfg)`: the executor's timing of `t`, or None after storing it as failed and
    taking it out of `alive` (a tactic that breaks while timed never wins)."""
    def timed(t: Tactic, cfg: TimerConfig) -> dict | None:
        try:
            return ex.time(t, cfg)
        except (TacticError, WorkerLost) as e:
            alive.remove(t)
            emit(Outcome(t, "failed", "while timing: " + (e.reason if isinstance(e, WorkerLost) else str(e)),
                         rel_err=checked[t.id]["rel_err"], exit_signal=getattr(e, "exit_signal", None)))
            return None
    return timed


def measure(ex: Executor, tactics: Sequence[Tactic], default_id: str, timer: TimerConfig,
            halving: Halving, emit: Callable[[Outcome], None], margin: float = winner_rule.DEFAULT_MARGIN) -> None:
    """Run one (problem, bucket) whose setup the executor already has; `margin` is the winner
    rule's (on a count-bound host: which finalists the replay check must prove)."""
    checked = _check_all(ex, tactics, emit)
    alive = [t for t in tactics if t.id in checked]
    if count_bound(ex, alive, checked, halving):
        return measure_host(ex, alive, checked, default_id, timer, halving, emit, margin)
    timings: dict[str, dict] = {}

    timed = _timer_of(ex, alive, checked, emit)

    replayed: set[str] = set()

    def done(t: Tactic, status: str, reason: str = "") -> Outcome:
        tm, c = timings[t.id], checked[t.id]
        return Outcome(t, status, reason, tm["median_us"], tm["iqr_us"], tm["reps"], c["rel_err"], c["smem_compiled"],
                       replay_checked=t.id in replayed)

    def replay_all() -> None:
        replayed.update(_replay(ex, alive, timings, default_id, checked, emit, None))   # every finalist

    if halving.exhaustive or len(alive) <= 1:
        for t in list(alive):
            if (tm := timed(t, timer)) is not None:
                timings[t.id] = tm
        notes = _confirm(alive, timed, timings, timer, halving)
        replay_all()
        for t in alive:
            emit(done(t, "ok", notes.get(t.id, "")))
        return

    _halve(alive, timed, timings, timer, halving, default_id, lambda t, why: emit(done(t, "dropped", why)))
    _final(alive, timed, timings, timer, halving)
    notes = _confirm(alive, timed, timings, _round_timer(timer, halving.final_share * halving.budget_s
                                                        / max(1, halving.cycles), min_reps=2), halving)
    replay_all()
    for t in alive:
        emit(done(t, "ok", notes.get(t.id, "")))


def _check_all(ex: Executor, tactics: Sequence[Tactic], emit: Callable[[Outcome], None]) -> dict[str, dict]:
    """Each tactic checked against float64 (tactic id -> its check's figures); a failure is emitted."""
    checked: dict[str, dict] = {}
    for t in tactics:
        try:
            checked[t.id] = ex.check(t)
        except TacticError as e:
            emit(Outcome(t, "failed", str(e)))
        except WorkerLost as e:
            emit(Outcome(t, "failed", e.reason, exit_signal=e.exit_signal))
    return checked


def _halve(alive: list[Tactic], timed: Callable, timings: dict, timer: TimerConfig, halving: Halving,
           default_id: str, drop: Callable[[Tactic, str], None]) -> None:
    """The halving rounds: each times the alive tactics on its share of the early budget and keeps
    the fastest `keep` of them (and the default); `drop(tactic, why)` for the rest."""
    rounds = _rounds(len(alive), halving)
    early = (1 - halving.final_share) * halving.budget_s / max(1, len(rounds))
    for r, keep in enumerate(rounds, 1):
        cfg = _round_timer(timer, early / len(alive), min_reps=2)
        for t in list(alive):
            if (tm := timed(t, cfg)) is not None:
                timings[t.id] = tm
        ranked = sorted(alive, key=lambda t: (timings[t.id]["median_us"], t.id))
        kept = ranked[:keep] + [t for t in ranked[keep:] if t.id == default_id]
        best = timings[ranked[0].id]["median_us"] if ranked else 0.0
        for t in ranked:
            if t not in kept:
                alive.remove(t)
                drop(t, f"successive halving: dropped after round {r} "
                        f"({timings[t.id]['median_us']:.3g} us, best {best:.3g} us)")


class _Timed(NamedTuple):
    tactic_id: str
    median_us: float
    iqr_us: float


def _replay(ex: Executor, alive: list[Tactic], timings: dict, default_id: str, checked: dict,
            emit: Callable[[Outcome], None], margin: float | None) -> set[str]:
    """The replay check (autotune.engine.replay) of the finalists: every one (`margin` None), or on a
    count-bound host, where each replay costs seconds, only those that can still win — the winner
    rule's contenders under `margin` (`core.winner.contenders`: the tied fastest, and the default
    where the rule could keep it), drawn again from the rest after each failure, so whatever the
    rule picks has passed. One that fails leaves `alive`, stored as failed. Returns the ids that
    passed. An executor without the check (a test's stand-in) checks none: their trials are stored
    not replay-checked. The check is the job's last stage: every finalist's timed kernel and graph
    is dropped first (`Executor.forget`), so the launcher bound for the replay is the only scratch
    alive beside the inputs (GLM-5's w2-reduce at M = 8192 holds 1.6 GB of fp32 rows per launcher)."""
    run = getattr(ex, "replay", None)
    passed: set[str] = set()
    if run is None:
        return passed
    for t in alive:
        ex.forget(t)
    while True:
        if margin is None:
            ids = {t.id for t in alive}
        else:
            rows = [_Timed(t.id, timings[t.id]["median_us"], timings[t.id]["iqr_us"]) for t in alive]
            ids = {r.tactic_id for r in winner_rule.contenders(rows, default_id, margin)}
        todo = [t for t in alive if t.id in ids and t.id not in passed]
        if not todo:
            return passed
        for t in todo:
            try:
                run(t)
                passed.add(t.id)
            except (TacticError, WorkerLost) as e:
                alive.remove(t)
                emit(Outcome(t, "failed", "wrong under graph replay: " + (e.reason if isinstance(e, WorkerLost) else str(e)),
                             rel_err=checked[t.id]["rel_err"], exit_signal=getattr(e, "exit_signal", None)))


def check_call_us(c: dict) -> float | None:
    """The host time of a check's one call (the worker's "parts"/"call"), in microseconds; None when
    the executor does not say."""
    v = (c.get("parts") or {}).get("call")
    return v * 1e6 if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def count_bound(ex: Executor, alive: Sequence[Tactic], checked: dict, h: Halving) -> bool:
    """A host job whose calls cost more than its budget: timed on the host clock (not CUDA events),
    every check's call time known, and the fastest call longer than the budget's share per tactic —
    halving would spend its minimum reps (>= 4 calls a tactic) whatever the budget."""
    if not h.host_window or h.exhaustive or getattr(ex, "device", "cuda") == "cuda" or not alive:
        return False
    calls = [check_call_us(checked[t.id]) for t in alive]
    return all(c is not None for c in calls) and min(calls) * 1e-6 > h.budget_s / len(alive)


def measure_host(ex: Executor, alive: list[Tactic], checked: dict, default_id: str, timer: TimerConfig,
                 h: Halving, emit: Callable[[Outcome], None], margin: float = winner_rule.DEFAULT_MARGIN) -> None:
    """A count-bound host job (`count_bound`): the check call is each tactic's first sample; those
    slower than the fastest by more than `h.host_window` are dropped on it, but the default, which
    keeps its check's time (the winner rule compares against it). The near-ties (at most
    `h.finalists`), when there are two or more, are timed once more, interleaved, one call each, and
    keep the median of their two samples (reps 2); a leader with no near tie keeps its check's time.
    A suspiciously fast leader is re-timed before it stands (`_confirm`)."""
    first = {t.id: check_call_us(checked[t.id]) for t in alive}
    ranked = sorted(alive, key=lambda t: (first[t.id], t.id))
    lead = first[ranked[0].id]
    near = [t for t in ranked if first[t.id] <= lead * (1 + h.host_window)][:h.finalists]
    final = near + [t for t in ranked if t.id == default_id and t not in near]
    for t in ranked:
        if t not in final:
            c = checked[t.id]
            emit(Outcome(t, "dropped", f"count-bound host: dropped on its check call ({first[t.id]:.3g} us, "
                                       f"best {lead:.3g} us)", first[t.id], 0.0, 1, c["rel_err"], c["smem_compiled"]))
    one = replace(_round_timer(timer, 1e-4, min_reps=1), max_reps=1)     # one call, whatever its speed
    timings: dict[str, dict] = {}
    alive[:] = final

    timed = _timer_of(ex, alive, checked, emit)
    notes: dict[str, str] = {}
    for t in list(alive):
        if len(near) < 2 or t not in near:
            timings[t.id] = {"median_us": first[t.id], "iqr_us": 0.0, "reps": 1}
            notes[t.id] = "count-bound host: its check call's time" + ("" if t in near else " (the default)")
        elif (tm := timed(t, one)) is not None:
            s = (first[t.id], tm["median_us"])
            timings[t.id] = {"median_us": statistics.median(s), "iqr_us": abs(s[1] - s[0]), "reps": 1 + tm["reps"]}
            notes[t.id] = "count-bound host: the median of its check call and one more"
    notes.update(_confirm(alive, timed, timings, one, h))
    replayed = _replay(ex, alive, timings, default_id, checked, emit, margin)   # the ones that can still win
    for t in alive:
        tm, c = timings[t.id], checked[t.id]
        emit(Outcome(t, "ok", notes.get(t.id, ""), tm["median_us"], tm["iqr_us"], tm["reps"], c["rel_err"],
                     c["smem_compiled"], replay_checked=t.id in replayed))


def _confirm(alive: list[Tactic], timed, timings: dict, cfg: TimerConfig, h: Halving) -> dict[str, str]:
    """A suspiciously fast best (under `h.suspect` × the runner-up's time: a timer glitch, a replay
    that ran nothing) is timed once more, and the new time stands, before it can win. Each tactic
    is re-timed at most once; two measurements that agree on a fast time are believed."""
    notes: dict[str, str] = {}
    while len(alive) >= 2:
        first, second = sorted(alive, key=lambda t: (timings[t.id]["median_us"], t.id))[:2]
        fast, runner = timings[first.id]["median_us"], timings[second.id]["median_us"]
        if first.id in notes or fast >= h.suspect * runner:
            break
        tm = timed(first, cfg)
        if tm is None:           # failed while re-timing: already emitted and removed from alive
            continue
        timings[first.id] = tm
        notes[first.id] = (f"re-timed: {fast:.3g} us was under {h.suspect:g}x the runner-up's {runner:.3g} us; "
                           f"now {tm['median_us']:.3g} us")
    return notes


def _final(alive: list[Tactic], timed, timings: dict, timer: TimerConfig, h: Halving) -> None:
    """A B C A B C …: one short timing of each finalist per cycle. The number of cycles fits the
    final share of the budget (measured on the first cycle), between 3 and `h.cycles`."""
    share = h.final_share * h.budget_s
    cfg = _round_timer(timer, share / (h.cycles * max(1, len(alive))), min_reps=1)
    samples: dict[str, list[float]] = {t.id: [] for t in alive}
    reps = dict.fromkeys(samples, 0)
    cycles, c = h.cycles, 0
    while c < cycles and alive:
        for t in list(alive):
            if (tm := timed(t, cfg)) is not None:
                samples[t.id].append(tm["median_us"])
                reps[t.id] += tm["reps"]
        if c == 0:
            cost_s = sum(samples[t.id][0] * reps[t.id] for t in alive) * 1e-6
            cycles = max(3, min(h.cycles, int(share / cost_s) if cost_s > 0 else h.cycles))
        c += 1
    for t in alive:
        s = sorted(samples[t.id])
        q = statistics.quantiles(s, n=4) if len(s) >= 4 else (s[0], None, s[-1])
        timings[t.id] = {"median_us": statistics.median(s), "iqr_us": q[2] - q[0], "reps": reps[t.id]}


def _rounds(n: int, h: Halving) -> list[int]:
    """How many survive each halving round, e.g. n=100, eta=3, finalists=3 -> [34, 12, 4, 3].
    Up to 2x finalists go straight to the interleaved final: a round would cost more than it saves."""
    out = []
    if n <= 2 * h.finalists:
        return out
    while n > h.finalists:
        n = max(h.finalists, math.ceil(n / h.eta))
        out.append(n)
    return out
