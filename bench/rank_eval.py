"""Offline evaluation of `--strategy ranked` on a stored full search (the committed H200 data).

For each fold a ranking model is fitted without the held-out data, then the ranked strategy
(autotune/engine/strategies/ranked/batches.py: Ranker, the same code the search runs) is replayed on every held-out
(problem, bucket) with each measurement replaced by the stored time:

* leave-one-problem-out (lopo): train on the other problems; the buckets of the held-out problem
  are replayed in ascending order, each warm-started by the winner the replay picked one bucket
  below (as a one-worker search does);
* leave-one-bucket-out (lobo): train on every other bucket of every problem; the extras are the
  committed winners of the neighbouring buckets.

Per held-out (problem, bucket): the share of its kept tactics measured (extras counted) and the
gap between the stored time of the replay's winner and of the committed winner.

Several caches of one arch are evaluated together (the data of the shipped model,
tools/fit_rank_models.py): a fold holds its problem or bucket out of every cache, each cache's
groups keep their own labels and committed winners, and the table has a row per cache too.

    python3 bench/rank_eval.py docs/data/2026-11-30-h200x2-full-search.db.xz            # every fold
    python3 bench/rank_eval.py docs/data/2026-11-30-h200x2-full-search.db.xz tests/data/2026-12-01-h200-cuda-search.db \
        tests/data/2026-12-01-h200-moe-search.db --lobo-every 3                              # the shipped model's data
    python3 bench/rank_eval.py docs/data/2026-11-30-h200x2-full-search.db.xz --lobo-every 5 --json out.json
    python3 bench/rank_eval.py docs/data/2026-11-30-h200x2-full-search.db.xz --lobo-every 4 --learner sklearn

`--learner sklearn` swaps LightGBM for scikit-learn's HistGradientBoostingRegressor with the same
settings (the comparison that chose the library; the search itself only reads LightGBM models).
"""
from __future__ import annotations

import lzma
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import harness  # noqa: E402
from bench.harness import existing  # noqa: E402

from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, batches as ranked, plans as strategy  # noqa: E402
from autotune.cache.store import Store  # noqa: E402

TARGET_SHARE, TARGET_GAP, TARGET_HITS = 0.10, 0.03, 0.95


def open_store(db: str, tmp: str) -> Store:
    if db.endswith(".xz"):
        out = Path(tmp) / (Path(db).name[:-3] or "cache.db")
        with lzma.open(db) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return Store(str(out))
    return Store(db, readonly=True)         # a committed or user cache is only read: never written


def replay(model, g, memo, default_id, extras, cfg):
    """(kept, measured, winner id) of the ranked strategy on one stored group."""
    ids, feats, _ = memo[g.key]
    kept = [(i, f) for i, f in zip(ids, feats) if i in g.timed or (i in g.negative and i not in g.rejected)]
    plan = strategy.every_member(ranked.plan_for([g.tactics[i] for i, _ in kept], model.predict([f for _, f in kept]),
                                                 [g.tactics[i] for i in [default_id, *extras] if i in g.tactics], cfg=cfg),
                                 g.problem)
    measured, pick = ranked.simulate(plan, g.timed, default_id)
    return len(kept), len(measured), pick


def sources(stores, names=None) -> list[rankdata.Source]:
    """One source per store: its (first) device, named by the given name or its position."""
    return [rankdata.Source(st, st.devices()[0]["device_key"], (names or {}).get(i, str(i)))
            for i, st in enumerate(stores)]


def loaded(stores, names=None) -> tuple:
    """(sources, (arch, sms) per source, their groups, their committed winners by (source, problem, bucket))."""
    srcs = sources(stores if isinstance(stores, (list, tuple)) else [stores], names)
    gs = rankdata.source_groups(srcs)
    win = {(s.name, w.problem_key, w.bucket): w for s in srcs for w in s.store.winners(s.device_key)}
    return srcs, {s.name: rankdata.device_arch(s.store, s.device_key)[:2] for s in srcs}, gs, win


def evaluate(stores, rounds: int, lobo_every: int, cfg: ranked.Ranked, folds=("lopo", "lobo"),
             names=None) -> list[dict]:
    """Per held-out group: kept, measured, the replay's and the committed winner, the gap. A group
    without a committed winner (a search cut mid-job) is trained on but not replayed."""
    srcs, dev, gs, win = loaded(stores, names)
    rows, memo = [], {}
    problems = sorted({g.problem.key for g in gs})
    buckets = sorted({g.bucket for g in gs})
    for fold in folds:
        held_sets = ([[g for g in gs if g.problem.key == p] for p in problems] if fold == "lopo" else
                     [[g for g in gs if g.bucket == b] for b in buckets[::lobo_every]])
        for held in held_sets:
            out = {g.key for g in held}
            train = [g for g in gs if g.key not in out]
            model = rankdata.train_many(srcs, train, rounds, memo)
            for g in held:
                memo.setdefault(g.key, rankdata.rows(g, *dev[g.source]))
            prev: dict[tuple, str] = {}
            for g in sorted(held, key=lambda g: g.key):
                w = win.get((g.source, g.problem.key, g.bucket))
                if w is None:
                    continue
                pk = (g.source, g.problem.key)
                if fold == "lopo":
                    extras = [prev[pk]] if pk in prev else []
                else:
                    bs = sorted(b for s, p, b in win if (s, p) == pk)
                    i = bs.index(g.bucket)
                    extras = [win[(*pk, b)].tactic_id for b in bs[max(0, i - 1):i + 2] if b != g.bucket]
                n, m, pick = replay(model, g, memo, w.default_tactic_id, extras, cfg)
                prev[pk] = pick
                gap = g.timed[pick] / g.timed[w.tactic_id] - 1 if pick in g.timed and w.tactic_id in g.timed else None
                rows.append({"fold": fold, "source": g.source, "problem": g.problem.key, "bucket": g.bucket,
                             "kept": n, "measured": m, "winner": pick, "committed": w.tactic_id, "gap": gap})
    return rows


def _line(label: str, rs: list[dict]) -> tuple[str, dict]:
    kept, meas = sum(r["kept"] for r in rs), sum(r["measured"] for r in rs)
    same = sum(r["winner"] == r["committed"] for r in rs)
    close = sum(r["gap"] is not None and r["gap"] <= TARGET_GAP for r in rs)
    worst = max((r["gap"] for r in rs if r["gap"] is not None), default=float("nan"))
    s = {"groups": len(rs), "kept": kept, "measured": meas, "share": meas / kept,
         "same": same, "within": close / len(rs), "worst_gap": worst}
    return (f"| {label} | {len(rs)} | {kept} | {meas} | {meas / kept:.1%} | {same} | {close} ({close / len(rs):.1%}) "
            f"| {worst:+.1%} |"), s


def table(rows: list[dict]) -> tuple[str, dict]:
    """The table (a row per fold; with several caches also a row per fold and cache) and the
    summary per fold (the targets are checked on these); per cache under summary["by_source"]."""
    out = ["| fold | held-out (problem, bucket) | kept | measured (extras counted) | share | same winner "
           "| within 3 % | worst gap |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    summary, by_source = {}, {}
    srcs = list(dict.fromkeys(r.get("source", "") for r in rows))
    for fold in dict.fromkeys(r["fold"] for r in rows):
        rs = [r for r in rows if r["fold"] == fold]
        line, summary[fold] = _line(fold, rs)
        out.append(line)
        for src in srcs if len(srcs) > 1 else ():
            line, by_source[f"{fold} {src}"] = _line(f"{fold}: {src}", [r for r in rs if r.get("source", "") == src])
            out.append(line)
    if by_source:
        summary["by_source"] = by_source
    return "\n".join(out), summary


class _Sklearn:
    """scikit-learn's histogram GBDT on the same features and labels, for the library comparison."""

    def __init__(self, names, est):
        self.names, self.est = names, est

    def predict(self, rows):
        import numpy as np
        return self.est.predict(np.array([rankmodel.Model(self.names, "", {}).vector(r) for r in rows])).tolist()

    @classmethod
    def fit(cls, rows, labels, key, info=None, rounds=rankmodel.ROUNDS):
        import numpy as np
        from sklearn.ensemble import HistGradientBoostingRegressor
        names = sorted({n for r in rows for n in r})
        m = rankmodel.Model(names, "", key)
        X = np.array([m.vector(r) for r in rows])
        p = rankmodel.PARAMS
        est = HistGradientBoostingRegressor(max_iter=rounds, learning_rate=p["learning_rate"],
                                            max_leaf_nodes=p["num_leaves"], min_samples_leaf=p["min_data_in_leaf"],
                                            l2_regularization=p["lambda_l2"], random_state=0)
        return cls(names, est.fit(X, np.array(labels)))


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("db", nargs="+", type=existing, help="cache files of one arch (SQLite, or .xz of one) holding searches")
    ap.add_argument("--rounds", type=int, default=None, help="boosting rounds (default: the model's)")
    ap.add_argument("--lobo-every", type=int, default=1, help="hold out every n-th bucket only (CI: fewer folds)")
    ap.add_argument("--folds", default="lopo,lobo")
    ap.add_argument("--json", help="write the per-group rows here")
    ap.add_argument("--learner", choices=["lightgbm", "sklearn"], default="lightgbm")
    a = ap.parse_args(argv)
    fit = rankmodel.fit
    if a.learner == "sklearn":
        rankmodel.fit = _Sklearn.fit      # this call only: rankdata.train fits through rankmodel.fit
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            stores = []
            try:
                for i, db in enumerate(a.db):
                    d = Path(tmp) / str(i)
                    d.mkdir()
                    stores.append(open_store(db, str(d)))
                rows = evaluate(stores, a.rounds or rankmodel.ROUNDS, a.lobo_every, ranked.Ranked(),
                                a.folds.split(","), {i: Path(db).name for i, db in enumerate(a.db)})
            finally:
                for st in stores:
                    st.close()
    finally:
        rankmodel.fit = fit               # callers in this process (CI runs main() in-process) get LightGBM back
    text, summary = table(rows)
    print(text)
    print(f"\n{time.perf_counter() - t0:.1f} s; targets: share <= {TARGET_SHARE:.0%}, within {TARGET_GAP:.0%} "
          f"on >= {TARGET_HITS:.0%}")
    if a.json:
        harness.write(a, {"summary": summary, "rows": rows})
    met = all(s["share"] <= TARGET_SHARE and s["within"] >= TARGET_HITS for f, s in summary.items() if f != "by_source")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
