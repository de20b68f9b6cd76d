"""`--strategy ranked`: measure per (problem, bucket) only what the ranking model puts first.

Per job the candidates are the kept tactics in the model's predicted order. The first batch is the
top `first` (at least `min_first`, else `first_share` of the kept ones) plus the extras: the
designated default and the winners of the neighbouring buckets (warm start). Each batch is measured
by successive halving (autotune.engine.halving). Then the model's predictions are calibrated on
what was measured (the median gap between measured log2 time and prediction) and the next `step`
candidates are measured only if one of them is predicted faster than the best measured time
times (1 + `stop_margin`): the adaptive stop. `max_share` caps what one job may measure.

`Ranker.batches` is the one place that decides; the engine (`measure`) and the offline
evaluation (bench/rank_eval.py, `simulate`) both drive it, with timings from the device or from a
store.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

from autotune.core import winner as winner_rule
from autotune.core.records import Trial
from autotune.core.tactic import Tactic


@dataclass(frozen=True)
class Ranked:
    """The ranked strategy's knobs (defaults measured by bench/rank_eval.py on the H200 data)."""

    min_first: int = 6          # first batch: at least this many predicted-best tactics
    first_share: float = 0.035  # ... or this share of the kept tactics, whichever is more
    step: int = 6               # each further batch
    stop_margin: float = 0.03   # measure on while a candidate is predicted within this of the best
    max_share: float = 0.15     # never more than this share of the kept tactics (extras aside)

    def __post_init__(self):
        if self.min_first < 1 or self.step < 1:
            raise ValueError("ranked: min_first and step must be >= 1")
        for name in ("first_share", "max_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"ranked: {name} must be within [0, 1], got {getattr(self, name)!r}")
        if self.stop_margin < 0:
            raise ValueError(f"ranked: stop_margin must be >= 0, got {self.stop_margin!r}")


@dataclass(frozen=True)
class RankPlan:
    """One job's ranking: every candidate in predicted order with its prediction, and the extras."""

    order: tuple[Tactic, ...]
    pred: tuple[float, ...]                 # predicted log2(time / best), same order
    extras: tuple[Tactic, ...] = ()         # the default and neighbouring buckets' winners
    known: Mapping[str, float] = field(default_factory=dict)   # tactic id -> time already stored (resume)


class Ranker:
    """Drives one job: `batches(measured)` yields what to measure next until the stop rule says no."""

    def __init__(self, plan: RankPlan, cfg: Ranked):
        self.plan, self.cfg = plan, cfg
        n = len(plan.order)
        self.first = min(n, max(cfg.min_first, math.ceil(cfg.first_share * n)))
        self.cap = max(self.first, math.ceil(cfg.max_share * n))
        self.stopped = ""       # why the job stopped (for the log)

    def batches(self, times: Mapping[str, float]) -> Iterator[list[Tactic]]:
        """Batches to measure; `times` (tactic id -> median us) is read again before each decision,
        so the caller fills it as outcomes arrive."""
        plan, seen = self.plan, set(self.plan.known)
        first = [t for t in (*plan.order[:self.first], *plan.extras) if t.id not in seen]
        seen.update(t.id for t in first)
        if first:
            yield list(dict.fromkeys(first))
        pos = self.first
        while pos < min(self.cap, len(plan.order)):
            nxt = [(t, p) for t, p in zip(plan.order[pos:], plan.pred[pos:]) if t.id not in seen][:self.cfg.step]
            if not nxt:
                break
            why = self._stop(times, min(p for _, p in nxt))
            if why:
                self.stopped = why
                return
            pos = plan.order.index(nxt[-1][0]) + 1
            seen.update(t.id for t, _ in nxt)
            yield [t for t, _ in nxt]
        self.stopped = self.stopped or f"measured the cap ({self.cap} of {len(plan.order)})"

    def _stop(self, times: Mapping[str, float], best_pred: float) -> str:
        pred = dict(zip((t.id for t in self.plan.order), self.plan.pred))
        gaps = [math.log2(us) - pred[i] for i, us in times.items() if i in pred and us > 0]
        if not gaps:
            return ""
        best = min(us for us in times.values() if us > 0)
        expect = 2 ** (best_pred + statistics.median(gaps))
        if expect > best * (1 + self.cfg.stop_margin):
            return f"next predicted {expect:.3g} us > best {best:.3g} us + {self.cfg.stop_margin:.0%}"
        return ""


def simulate(plan: RankPlan, cfg: Ranked, stored: Mapping[str, float], default_id: str,
             margin: float = winner_rule.DEFAULT_MARGIN) -> tuple[list[str], str | None]:
    """Offline: the ranked strategy with each measurement replaced by its stored time (a tactic
    without one counts as measured and failed). Returns (measured tactic ids, the winner's id)."""
    r, times, measured = Ranker(plan, cfg), dict(plan.known), []
    for batch in r.batches(times):
        for t in batch:
            measured.append(t.id)
            if t.id in stored:
                times[t.id] = stored[t.id]
    trials = [Trial("", 1, i, "", "", "", "", "ok", median_us=us) for i, us in times.items()]
    pick = winner_rule.choose(trials, default_id, margin)
    return measured, pick.tactic_id if pick else None


def plan_for(kept: Sequence[Tactic], preds: Sequence[float], extras: Sequence[Tactic] = (),
             known: Mapping[str, float] | None = None) -> RankPlan:
    """Candidates sorted by prediction (ties: tactic id, so two searches order alike)."""
    pairs = sorted(zip(kept, preds), key=lambda tp: (tp[1], tp[0].id))
    return RankPlan(tuple(t for t, _ in pairs), tuple(p for _, p in pairs), tuple(dict.fromkeys(extras)),
                    dict(known or {}))


def measure(run_batch: Callable[[list[Tactic], Callable], None], plan: RankPlan, cfg: Ranked,
            emit: Callable, log: Callable[[str], None] = lambda s: None) -> None:
    """Online: `run_batch(tactics, emit)` measures one batch (successive halving in a worker);
    every outcome is passed on to `emit` and its time feeds the stop rule."""
    r, times = Ranker(plan, cfg), dict(plan.known)

    def seen(o) -> None:
        if o.median_us is not None and o.status in ("ok", "dropped"):
            times[o.tactic.id] = o.median_us
        emit(o)

    for batch in r.batches(times):
        run_batch(batch, seen)
    log(r.stopped)
