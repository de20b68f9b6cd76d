"""`--strategy ranked`'s bucket cut: which buckets of a problem's ladder are measured in full, and
what each other bucket verifies in one round.

A problem's winners change slowly along the M ladder: neighbouring buckets mostly share a winner,
or their winners differ by a tile. So a ranked search measures in full (the ranked plan: the
model's top, its bests, every kernel's best-predicted tactic, the neighbours' winners, later
batches while the stop rule allows) only

* both ends of the ladder and every `every`-th bucket between them,
* each crossover the model predicts: two neighbouring buckets whose first choices are of
  different families, both,
* the buckets the model is unsure of: its first two choices predicted within `unsure` (log2
  units) of each other,
* each crossover the measured buckets show: a bucket whose nearest measured buckets below and
  above were won by different kernels (`split`, decided as the bucket's job starts);

and each other bucket in one round of successive halving over few candidates: the model's first
choice there, the designated default, the model's own best (the fastest its data timed there),
and the winners stored for the nearest buckets below and above (`verify`). A verifying bucket runs
after its problem's measured buckets (`Strategy.order`); one that starts while a measured
neighbour's winner is not stored (several workers) is measured in full instead, so the cut never
verifies against nothing. The rule and its defaults were chosen offline on stored searches
(bench/bucket_cut_eval.py; docs/decisions/0013-bucket-cut.md).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Hashable, Mapping, Sequence

from autotune.core.tactic import Tactic
from autotune.engine.strategies.ranked.batches import RankPlan


def measured(ladder: Sequence[int], first_family: Mapping[int, Hashable], margin: Mapping[int, float],
             every: int, unsure: float) -> frozenset[int]:
    """The buckets of `ladder` measured in full: the ends, every `every`-th, each predicted
    crossover (`first_family`: the family of the model's first choice per bucket) and each bucket
    whose top-two margin (`margin`, log2 units; missing: one candidate, nothing to choose) is under
    `unsure`. `every` <= 1: every bucket."""
    bs = sorted(set(ladder))
    if every <= 1 or len(bs) <= 2:
        return frozenset(bs)
    keep = {bs[0], bs[-1], *bs[::every]}
    for a, b in zip(bs, bs[1:]):
        if first_family.get(a) != first_family.get(b):
            keep |= {a, b}
    keep |= {b for b in bs if margin.get(b, math.inf) < unsure}
    return frozenset(keep)


def top_two(plan: RankPlan) -> tuple[Hashable, float]:
    """(the family of the plan's first choice, the predicted margin of its second, log2 units:
    inf with fewer than two candidates)."""
    if not plan.order:
        return None, math.inf
    return plan.order[0].family, (plan.pred[1] - plan.pred[0]) if len(plan.pred) > 1 else math.inf


def split(low: Tactic, high: Tactic, kernel) -> bool:
    """Whether the winners of a verifying bucket's nearest measured buckets below and above are of
    different kernels (`kernel`: a tactic's kernel, plans.kernel_of): a crossover between them that
    the model did not predict, which the bucket measures in full."""
    return kernel(low) != kernel(high)


def nearest(bucket: int, have: Sequence[int]) -> tuple[int | None, int | None]:
    """The nearest of `have` below and above `bucket` (None where there is none)."""
    below = [b for b in have if b < bucket]
    above = [b for b in have if b > bucket]
    return (max(below) if below else None), (min(above) if above else None)


def verify(plan: RankPlan, fixed: Sequence[Tactic], neighbours: Sequence[str]) -> RankPlan:
    """One round: the plan's first choice, `fixed` (the default, the model's best) and the kept
    tactics among `neighbours` (winner ids of the nearest buckets), no later batch."""
    ids = set(neighbours)
    near = [t for t in plan.order if t.id in ids]
    cfg = replace(plan.cfg, min_first=1, first_share=0.0, max_share=0.0, every_kernel=False)
    return replace(plan, extras=tuple(dict.fromkeys((*fixed, *near))), cfg=cfg)
