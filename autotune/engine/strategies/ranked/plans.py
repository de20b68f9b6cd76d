"""The ranked strategy's plans (autotune/engine/strategies/ranked/strategy.py: the ranking model's
top candidates, warm starts, adaptive stop: autotune.engine.strategies.ranked.batches) — loading the model, the plans,
the first batches, the neighbours' warm start (`--batch-invariant`: autotune.engine.invariant).

The ranked and predict strategies call these steps; none of them names a family.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine.strategies.base import kept_at
from autotune.engine.strategies.ranked import batches, model as rankmodel, rows
from autotune.tactics import registry

@dataclass
class Ranking:
    """The loaded model and, per (problem key, bucket), its plan before the job starts."""

    model: rankmodel.Model
    plans: dict[tuple[str, int], batches.RankPlan]


#: rank models shipped inside the package, `<arch>-<libs>.json.gz` (tools/fit_rank_models.py writes them)
SHIPPED = Path(__file__).resolve().parent / "rank_models"


def model_path(store, arch: Arch) -> Path | None:
    """The model file next to a SQLite cache (`<cache>.rank-<arch>.json`), if the cache is a file."""
    from autotune.cache.files import parse, sqlite_file
    try:
        f = sqlite_file(parse(store.url))
    except Exception:
        return None
    return rankmodel.path_for(f, arch) if f is not None else None


def shipped_name(model: rankmodel.Model) -> str:
    """`sm90-cupy14.2.0-torch2.11.0-triton3.6.0.json.gz`: the arch and the library versions of its key."""
    libs = "-".join(f"{k}{v}".replace(",", "+") for k, v in sorted((model.key.get("libs") or {}).items()))
    return f"{model.key['arch']}{'-' + libs if libs else ''}.json.gz"


def shipped(arch: Arch, libs: Mapping[str, str | None] | None = None) -> Path | None:
    """The shipped model file for `arch`: of several, the one whose key's library versions match
    the installed ones most often (then the newest name). None when the package has none."""
    paths = sorted(SHIPPED.glob(f"{arch.name}-*.json.gz")) + sorted(SHIPPED.glob(f"{arch.name}.json.gz"))
    if len(paths) < 2:
        return paths[0] if paths else None
    have = {k: v for k, v in (libs or {}).items() if v}

    def matches(p: Path) -> int:
        try:
            key = rankmodel.load(p).key
        except (OSError, ValueError, KeyError):
            return -1
        return sum(have.get(k) in str(v).split(",") for k, v in (key.get("libs") or {}).items())
    return max(paths, key=lambda p: (matches(p), p.name))


def shipped_archs() -> list[str]:
    """The archs the package ships a model for (from the file names, `<arch>-<libs>.json.gz`)."""
    return sorted({p.name.split("-")[0].removesuffix(".json.gz") for p in SHIPPED.glob("*.json.gz")})


def _usable(path: Path, arch: Arch) -> tuple[rankmodel.Model | None, str]:
    try:
        m = rankmodel.load(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"rank model {path} unusable ({e})"
    if not m.covers(arch):
        return None, f"rank model {path} has no data for {arch.name} (trained on {m.key.get('arch')})"
    return m, ""


def _said(m: rankmodel.Model, where: str) -> str:
    return f"rank model {where} ({m.key.get('arch')}, {m.key.get('gpu')}, libs {m.key.get('libs')})"


def default_model(store, arch: Arch, libs: Mapping[str, str | None] | None = None
                  ) -> tuple[rankmodel.Model | None, str]:
    """(model, note) of a search given no `--rank-model`: the cache's own model
    (`<cache>.rank-<arch>.json`, what `autotune cache rank-fit` writes from the user's trials) wins
    over the model shipped for `arch` in the package (fitted on the committed H200 searches); with
    neither, (None, why), and the search halves. A damaged or other-arch file next to the cache is
    said in the note and the shipped model is used."""
    own, why = model_path(store, arch), []
    if own is not None and own.is_file():
        m, bad = _usable(own, arch)
        if m is not None:
            return m, _said(m, f"{own} (the cache's own: it takes precedence over the shipped one)")
        why.append(bad)
    ship = shipped(arch, libs)
    if ship is not None:
        m, bad = _usable(ship, arch)
        if m is not None:
            return m, "; ".join([*why, _said(m, f"shipped for {arch.name} ({ship.name})")])
        why.append(bad)
    have = shipped_archs()
    why.append(f"no rank model for {arch.name} ("
               + (f"the package ships one for {', '.join(have)} only, which does not apply here" if have else "none shipped")
               + f", none next to the cache{f' at {own}' if own else ''}; `autotune cache rank-fit` makes one)")
    return None, "; ".join(why)


def load_model(given, store, arch: Arch, libs: Mapping[str, str | None] | None = None
               ) -> tuple[rankmodel.Model | None, str]:
    """(model, note). `given` is a Model, a path (`--rank-model`: used whatever else exists), or None
    (`default_model`). No model, a damaged one, or one without data for `arch`: (None, why), and the
    search halves as before."""
    if given is None:
        return default_model(store, arch, libs)
    if isinstance(given, rankmodel.Model):
        if not given.covers(arch):
            return None, f"rank model the given model has no data for {arch.name} (trained on {given.key.get('arch')})"
        return given, _said(given, "the given model")
    path = Path(given)
    if not path.is_file():
        return None, f"no rank model at {path}"
    m, bad = _usable(path, arch)
    return (m, _said(m, str(path))) if m is not None else (None, bad)


def plans(model: rankmodel.Model, work: Iterable, buckets: Sequence[int], arch: Arch, sms: int, store,
          device_key: str, cfg: batches.Ranked, lib_keys: dict | None = None) -> dict[tuple[str, int], batches.RankPlan]:
    """Per (problem, bucket): the kept tactics useful there (`kept_at`) in predicted order; as extras the default, the
    fastest tactics the model's own data timed there (Model.bests, then its siblings': Model.sibling_bests) and novel
    members; and the
    times the cache already holds for them (a resumed search counts those as measured; with
    `lib_keys`, only those measured under these libraries and the code installed here). One
    prediction over every (problem, bucket, tactic) row: the tree walk costs per call, not per row."""
    out, names = {}, set(model.names)
    work = list(work)
    useful = {(w.problem.key, b): kept_at(w, b) for w in work for b in buckets}
    feats = {(w.problem.key, b): [rows.row(w.problem, r.tactic, b, arch, sms, r.verdict.smem_bytes)
                                  for r in useful[(w.problem.key, b)]] for w in work for b in buckets}
    flat = model.predict([f for fs in feats.values() for f in fs])
    preds, i = {}, 0
    for k, fs in feats.items():
        preds[k], i = flat[i:i + len(fs)], i + len(fs)
    for w in work:
        for b in buckets:
            kept = useful[(w.problem.key, b)]
            by_id = {r.tactic.id: r.tactic for r in kept}
            f, p = feats[(w.problem.key, b)], preds[(w.problem.key, b)]
            known = {t.tactic_id: t.median_us for t in store.get_trials(w.problem.key, b, device_key)
                     if t.status in ("ok", "dropped") and t.median_us and t.tactic_id in by_id
                     and (lib_keys is None or registry.fresh(lib_keys, t))}
            best = [by_id[i] for i in dict.fromkeys((*model.bests(w.problem.key, b), *model.sibling_bests(w.problem, b)))
                    if i in by_id]
            out[(w.problem.key, b)] = every_member(batches.plan_for(
                [r.tactic for r in kept], p, [w.default, *best, *_novel(kept, f, p, names, cfg.min_first)], known, cfg),
                w.problem)
    return out


def firsts(model: rankmodel.Model, work: Iterable, buckets: Sequence[int], arch: Arch,
           sms: int) -> dict[tuple[str, int], Tactic]:
    """Per (problem, bucket): the model's first choice among the kept tactics useful there (`kept_at`),
    ties to the smaller tactic id — `plans(...)[key].order[0]`, without what only a timed search reads
    (stored times, the model's bests, extras, the whole order): `--strategy predict`'s plan. One
    prediction over every row."""
    work = list(work)
    useful = {(w.problem.key, b): kept_at(w, b) for w in work for b in buckets}
    preds = iter(model.predict([rows.row(w.problem, r.tactic, b, arch, sms, r.verdict.smem_bytes)
                                for w in work for b in buckets for r in useful[(w.problem.key, b)]]))
    out = {}
    for key, kept in useful.items():
        p = [next(preds) for _ in kept]
        if kept:
            low = min(p)
            out[key] = min((r.tactic for r, v in zip(kept, p) if v == low), key=lambda t: t.id)
    return out


def kernel_of(t: Tactic) -> tuple[str, str]:
    """A tactic's kernel: its family and, where the family has several, its `kernel` parameter."""
    return t.family, str(t.params.get("kernel", ""))


def every_member(plan: batches.RankPlan, problem: Problem | None = None) -> batches.RankPlan:
    """Each kernel the job keeps tactics of gets its best-predicted one into the first batch. The
    trees rank configs of one kernel better than kernels against each other: without this rule the
    H200 main job of 2026-12-05 never measured moe_mma on w2:reduce from M = 32 up (its first batches
    held moe_tok and Triton only), and served Triton there at 215 µs (M = 128) where the unfused w2's
    cuda winner took 122 (docs/decisions/0007-every-kernel-in-the-first-batch.md). Adds nothing where every kernel is in the first batch already, or
    with `Ranked(every_kernel=False)`. With `problem`, a family may decline the slot there
    (Family.first_batch_member: the torch reference's grouped MoE)."""
    if not plan.cfg.every_kernel:
        return plan
    first = batches.Ranker(plan).first
    have = {kernel_of(t) for t in (*plan.order[:first], *plan.extras)}
    tops: dict[tuple[str, str], Tactic] = {}
    member = {f: problem is None or registry.first_batch_member(problem, f) for f in {t.family for t in plan.order}}
    for t in plan.order:                    # predicted order: the first of each kernel is its best
        if member[t.family]:
            tops.setdefault(kernel_of(t), t)
    add = [t for m, t in tops.items() if m not in have]
    return replace(plan, extras=tuple(dict.fromkeys((*plan.extras, *add)))) if add else plan


def _novel(kept, feats, preds, names: set, n: int) -> list[Tactic]:
    """Up to n tactics (best predicted first) with a categorical feature the model never saw, e.g.
    a member added after it was fitted: measured in the first batch, so a new kernel gets a chance."""
    new = [(p, r.tactic.id, r.tactic) for r, f, p in zip(kept, feats, preds)
           if any("=" in k and k not in names for k in f)]
    return [t for _, _, t in sorted(new)[:n]]


def first_ids(plan: batches.RankPlan) -> list[str]:
    """The tactic ids a job measures first whatever its neighbours did: the model's top and the
    static extras (the default, the model's bests, novel members). A (problem, bucket) whose winner is stored and
    whose first batch is in the cache is finished: a resumed search measures nothing there, even
    though its neighbours' winners (the warm starts) may have changed since it ran."""
    return [t.id for t in (*plan.order[:batches.Ranker(plan).first], *plan.extras)]


def first_batches(ranking: Ranking) -> set[tuple[str, str]]:
    """(problem key, tactic id) of every tactic some job measures first (what to compile ahead)."""
    return {(pk, i) for (pk, _), plan in ranking.plans.items() for i in first_ids(plan)}


def winners(store, problem: Problem, device_key: str, lib_keys: dict) -> dict[int, Tactic]:
    """Bucket -> the measured winner stored for `problem` under these libraries and code."""
    return {w.bucket: Tactic.from_json(w.params_json) for w in store.winners(device_key)
            if w.problem_key == problem.key and not w.predicted and registry.fresh(lib_keys, w)}


def with_neighbours(plan: batches.RankPlan, store, problem: Problem, bucket: int, buckets: Sequence[int],
                    device_key: str, lib_keys: dict) -> batches.RankPlan:
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
    return batches.RankPlan(plan.order, plan.pred, tuple(dict.fromkeys((*plan.extras, *extra))), known, plan.cfg)
