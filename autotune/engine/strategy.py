"""How a search chooses what to measure: `halving` (every kept tactic, successive halving),
`exhaustive` (every kept tactic, fully timed), `ranked` (the ranking model's top candidates, warm
starts, adaptive stop: autotune.engine.ranked); and `--batch-invariant` (one tactic per problem for
every M, among the tactics whose family says their reduction order does not depend on M).

The search (autotune.engine.search) calls these steps; none of them names a family.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from autotune.core import winner as winner_rule
from autotune.core.arch import Arch
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic
from autotune.engine import rankdata, rankmodel, ranked
from autotune.tactics import registry

STRATEGIES = ("ranked", "halving", "exhaustive")


@dataclass
class Ranking:
    """The loaded model and, per (problem key, bucket), its plan before the job starts."""

    model: rankmodel.Model
    plans: dict[tuple[str, int], ranked.RankPlan]


def model_path(store, arch: Arch) -> Path | None:
    """The model file next to a SQLite cache (`<cache>.rank-<arch>.json`), if the cache is a file."""
    from autotune.cache.files import parse, sqlite_file
    try:
        f = sqlite_file(parse(store.url))
    except Exception:
        return None
    return rankmodel.path_for(f, arch) if f is not None else None


def load_model(given, store, arch: Arch) -> tuple[rankmodel.Model | None, str]:
    """(model, note). `given` is a Model, a path, or None (the file next to the cache). No model,
    a damaged one, or one without data for `arch`: (None, why), and the search halves as before."""
    if isinstance(given, rankmodel.Model):
        m, where = given, "the given model"
    else:
        path = Path(given) if given else model_path(store, arch)
        if path is None or not path.is_file():
            return None, f"no rank model{f' at {path}' if path else ''} (`autotune cache rank-fit` makes one)"
        try:
            m, where = rankmodel.load(path), str(path)
        except (OSError, ValueError, KeyError) as e:
            return None, f"rank model {path} unusable ({e})"
    if not m.covers(arch):
        return None, f"rank model {where} has no data for {arch.name} (trained on {m.key.get('arch')})"
    return m, f"rank model {where} ({m.key.get('arch')}, {m.key.get('gpu')}, libs {m.key.get('libs')})"


def plans(model: rankmodel.Model, work: Iterable, buckets: Sequence[int], arch: Arch, sms: int, store,
          device_key: str, cfg: ranked.Ranked, lib_keys: dict | None = None) -> dict[tuple[str, int], ranked.RankPlan]:
    """Per (problem, bucket): the kept tactics in predicted order, the default as an extra, and the
    times the cache already holds for them (a resumed search counts those as measured; with
    `lib_keys`, only those measured under these libraries and the code installed here)."""
    out, names = {}, set(model.names)
    for w in work:
        ids = {r.tactic.id for r in w.kept}
        for b in buckets:
            feats = [rankdata.row(w.problem, r.tactic, b, arch, sms, r.verdict.smem_bytes) for r in w.kept]
            preds = model.predict(feats)
            known = {t.tactic_id: t.median_us for t in store.get_trials(w.problem.key, b, device_key)
                     if t.status in ("ok", "dropped") and t.median_us and t.tactic_id in ids
                     and (lib_keys is None or registry.fresh(lib_keys, t))}
            out[(w.problem.key, b)] = ranked.plan_for([r.tactic for r in w.kept], preds,
                                                      [w.default, *_novel(w.kept, feats, preds, names, cfg.min_first)],
                                                      known, cfg)
    return out


def _novel(kept, feats, preds, names: set, n: int) -> list[Tactic]:
    """Up to n tactics (best predicted first) with a categorical feature the model never saw, e.g.
    a member added after it was fitted: measured in the first batch, so a new kernel gets a chance."""
    new = [(p, r.tactic.id, r.tactic) for r, f, p in zip(kept, feats, preds)
           if any("=" in k and k not in names for k in f)]
    return [t for _, _, t in sorted(new)[:n]]


def first_ids(plan: ranked.RankPlan) -> list[str]:
    """The tactic ids a job measures first whatever its neighbours did: the model's top and the
    static extras (the default, novel members). A (problem, bucket) whose winner is stored and
    whose first batch is in the cache is finished: a resumed search measures nothing there, even
    though its neighbours' winners (the warm starts) may have changed since it ran."""
    return [t.id for t in (*plan.order[:ranked.Ranker(plan).first], *plan.extras)]


def first_batches(ranking: Ranking) -> set[tuple[str, str]]:
    """(problem key, tactic id) of every tactic some job measures first (what to compile ahead)."""
    return {(pk, i) for (pk, _), plan in ranking.plans.items() for i in first_ids(plan)}


def with_neighbours(plan: ranked.RankPlan, store, problem: Problem, bucket: int, buckets: Sequence[int],
                    device_key: str, lib_keys: dict) -> ranked.RankPlan:
    """The plan warm-started by the winners stored for the neighbouring buckets (this search's,
    when they finished first, or an earlier search's), where they are candidates here; its stored
    times re-read as the job starts, so the stop rule counts what another search (whose claim this
    one took over) stored after `plans` ran."""
    ids_here = {t.id for t in plan.order}
    known = {t.tactic_id: t.median_us for t in store.get_trials(problem.key, bucket, device_key)
             if t.status in ("ok", "dropped") and t.median_us and t.tactic_id in ids_here
             and registry.fresh(lib_keys, t)}
    bs = sorted(buckets)
    i = bs.index(bucket)
    near = set(bs[max(0, i - 1):i + 2]) - {bucket}
    ids = {w.tactic_id for w in store.winners(device_key) if w.problem_key == problem.key and w.bucket in near
           and registry.fresh(lib_keys, w)}
    extra = [t for t in plan.order if t.id in ids]
    return ranked.RankPlan(plan.order, plan.pred, tuple(dict.fromkeys((*plan.extras, *extra))), known, plan.cfg)


# -- --batch-invariant ------------------------------------------------------------------------

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
                   (d.median_us / mine.median_us) if d else None, pick.code_key)
        store.put_winner(w)
        out.append(w)
    return out, (f"{problem.key}: --batch-invariant: {Tactic.from_json(pick.params_json)} for every M, "
                 f"{cost:.3f}x the per-bucket best batch-invariant tactic (geometric mean)")
