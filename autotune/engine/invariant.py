"""`--batch-invariant`: one tactic per problem for every M, among the tactics whose family says a row's
result does not depend on the batch (Family.batch_invariant) — what the search keeps and the winner
it stores for every bucket. No family is named here."""
from __future__ import annotations

import math
from typing import Sequence

from autotune.core import winner as winner_rule
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic
from autotune.tactics import registry


def invariant(problem: Problem, tactic: Tactic) -> bool:
    """The tactic's family says a row's result does not depend on the batch (Family.batch_invariant)."""
    try:
        return bool(registry.get(tactic.family).batch_invariant(problem, tactic))
    except (ValueError, ImportError):
        return False


def one_per_problem(trials: Sequence[Trial], buckets: Sequence[int], default_id: str,
                    margin: float = winner_rule.DEFAULT_MARGIN) -> tuple[Trial | None, float]:
    """The one tactic for every bucket: the geometric mean over buckets of its time / the bucket's
    best is smallest (a tactic must have a time in every bucket; ok or dropped times count). Near
    ties (1 %) go to the smaller smem, then the smaller id; the default stays unless beaten by
    `margin`. Returns (a trial of the pick, its mean slowdown against the per-bucket best)."""
    by: dict[str, dict[int, Trial]] = {}
    for t in trials:
        if t.status in ("ok", "dropped") and t.median_us and t.bucket in buckets:
            by.setdefault(t.tactic_id, {})[t.bucket] = t
    best = {b: min((ts[b].median_us for ts in by.values() if b in ts), default=None) for b in buckets}
    score = {i: math.exp(sum(math.log(ts[b].median_us / best[b]) for b in buckets) / len(buckets))
             for i, ts in by.items() if all(b in ts for b in buckets)}
    if not score:
        return None, float("nan")
    low = min(score.values())
    tied = [i for i, s in score.items() if s <= low * (1 + winner_rule.TIE_TOLERANCE)]
    pick = min(tied, key=lambda i: (next(iter(by[i].values())).smem_model or 0, i))
    if default_id in score and pick != default_id and score[pick] > score[default_id] * (1 - margin):
        pick = default_id
    return by[pick][max(buckets)], score[pick]


def invariant_winners(store, problem: Problem, buckets: Sequence[int], env: Env, default_id: str,
                      lib_keys: dict, margin: float) -> tuple[list[Winner], str]:
    """Store the one batch-invariant tactic as the winner of every bucket of `problem`; a note."""
    trials = [t for b in buckets for t in store.get_trials(problem.key, b, env.device_key)
              if registry.fresh(lib_keys, t) and invariant(problem, Tactic.from_json(t.params_json))]
    pick, cost = one_per_problem(trials, buckets, default_id, margin)
    if pick is None:
        return [], f"{problem.key}: --batch-invariant: no invariant tactic has a time in every bucket"
    out = []
    for b in buckets:
        mine = next(t for t in trials if t.bucket == b and t.tactic_id == pick.tactic_id)
        d = next((t for t in trials if t.bucket == b and t.tactic_id == default_id and t.median_us), None)
        w = Winner(problem.key, b, env.device_key, pick.tactic_id, pick.family, pick.params_json, pick.lib_key,
                   mine.median_us, default_id, d.median_us if d else None,
                   (d.median_us / mine.median_us) if d else None, pick.code_key,
                   replay_checked=mine.replay_checked)
        store.put_winner(w)
        out.append(w)
    return out, (f"{problem.key}: --batch-invariant: {Tactic.from_json(pick.params_json)} for every M, "
                 f"{cost:.3f}x the per-bucket best batch-invariant tactic (geometric mean)")
