"""`--strategy ranked`: measure per (problem, bucket) only what the ranking model puts first.

Per job the candidates are the kept tactics in the model's predicted order. The first batch is the
top `first` (at least `min_first`, else `first_share` of the kept ones) plus the extras: the
designated default and the winners of the neighbouring buckets (warm start). Each batch is measured
by successive halving (autotune.engine.strategies.successive_halving). Then the next `step` candidates are measured only
if the model predicts the first of them within `stop_margin` of the best measured tactic (its
prediction relative to the best's own prediction): the adaptive stop. `max_share` caps what one job may measure.

`Ranker.batches` is the one place that decides; the engine (`measure`) and the offline
evaluation (bench/rank_eval.py, `simulate`) both drive it, with timings from the device or from a
store.
"""
from __future__ import annotations

import math
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
    every_kernel: bool = True   # each kernel's best-predicted tactic joins the first batch (strategy.every_member)

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
    cfg: Ranked = Ranked()


class Ranker:
    """Drives one job: `batches(measured)` yields what to measure next until the stop rule says no."""

    def __init__(self, plan: RankPlan):
        self.plan, self.cfg = plan, plan.cfg
        cfg = plan.cfg
        n = len(plan.order)
        self.first = min(n, max(cfg.min_first, math.ceil(cfg.first_share * n)))
        self.cap = max(self.first, math.ceil(cfg.max_share * n))
        self.stopped = ""       # why the job stopped (for the log)

    def batches(self, times: Mapping[str, float]) -> Iterator[list[Tactic]]:
        """Batches to measure; `times` (tactic id -> median us) is read again before each decision,
        so the caller fills it as outcomes arrive. The batches do not depend on `plan.known`: a
        resumed job walks the same batches as a fresh one and the caller skips what is stored, so
        with the same times it takes the same decisions and measures nothing twice."""
        plan = self.plan
        first = list(dict.fromkeys((*plan.order[:self.first], *plan.extras)))
        seen = {t.id for t in first}
        if first:
            yield first
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

    def _stop(self, times: Mapping[str, float], next_pred: float) -> str:
        """Stop when the model says the next candidate is slower than the best measured one by more
        than the margin: predictions are read relative to the best's own prediction, so a model
        that is off by a constant for this problem (a new shape) still ranks right."""
        pred = dict(zip((t.id for t in self.plan.order), self.plan.pred))
        timed = [(us, i) for i, us in times.items() if us > 0]
        if not timed:
            return ""
        best_us, best_id = min(timed)
        base = pred.get(best_id)
        if base is None:            # the best is an extra the model did not rank: compare with the top
            base = self.plan.pred[0] if self.plan.pred else 0.0
        ratio = 2 ** (next_pred - base)
        if ratio > 1 + self.cfg.stop_margin:
            return f"next predicted {ratio:.3f}x the best measured ({best_us:.3g} us), margin {self.cfg.stop_margin:.0%}"
        return ""


def simulate(plan: RankPlan, stored: Mapping[str, float], default_id: str,
             margin: float = winner_rule.DEFAULT_MARGIN) -> tuple[list[str], str | None]:
    """Offline: the ranked strategy with each measurement replaced by its stored time (a tactic
    without one counts as measured and failed). Returns (measured tactic ids, the winner's id)."""
    r, times, measured = Ranker(plan), dict(plan.known), []
    for batch in r.batches(times):
        for t in (t for t in batch if t.id not in plan.known):
            measured.append(t.id)
            if t.id in stored:
                times[t.id] = stored[t.id]
    trials = [Trial("", 1, i, "", "", "", "", "ok", median_us=us) for i, us in times.items()]
    pick = winner_rule.choose(trials, default_id, margin)
    return measured, pick.tactic_id if pick else None


def plan_for(kept: Sequence[Tactic], preds: Sequence[float], extras: Sequence[Tactic] = (),
             known: Mapping[str, float] | None = None, cfg: Ranked = Ranked()) -> RankPlan:
    """Candidates sorted by prediction (ties: tactic id, so two searches order alike)."""
    pairs = sorted(zip(kept, preds), key=lambda tp: (tp[1], tp[0].id))
    return RankPlan(tuple(t for t, _ in pairs), tuple(p for _, p in pairs), tuple(dict.fromkeys(extras)),
                    dict(known or {}), cfg)


def measure(run_batch: Callable[[list[Tactic], Callable], None], plan: RankPlan, emit: Callable,
            log: Callable[[str], None] = lambda s: None) -> None:
    """Online: `run_batch(tactics, emit)` measures one batch (successive halving in a worker) and
    skips what the cache holds (the job's todo); every outcome is passed on to `emit` and its time
    feeds the stop rule, as the stored times of `plan.known` do."""
    r, times = Ranker(plan), dict(plan.known)

    def seen(o) -> None:
        if o.median_us is not None and o.status in ("ok", "dropped"):
            times[o.tactic.id] = o.median_us
        emit(o)

    for batch in r.batches(times):
        run_batch(batch, seen)
    log(r.stopped)
