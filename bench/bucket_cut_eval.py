"""`--strategy ranked`'s bucket cut (autotune/engine/strategies/ranked/cut.py) replayed offline.

Leave one problem out (bench/rank_eval.py's lopo): per held-out problem a rank model is fitted on
the others, then each setting (every, unsure, split) is replayed on the problem's M ladder with each
measurement replaced by the stored time: the buckets `cut.measured` picks by the ranked replay
(ascending, warm-started by the nearest measured pick below); the others, ascending, by one round over
the model's first choice, the default and the picks at the nearest decided buckets (`cut.verify`) —
or in full where the picks at the nearest measured buckets differ in kernel / tactic (split). Per
(problem, bucket) the gap is the pick's stored time over the committed winner's, less 1. every = 1
is the no-cut baseline; the recommendation is the setting measuring the fewest tactics with >= 97 %
within 3 % and a worst gap within --slack of the baseline's.

Biases: the held-out problem has no bests (Model.bests), which the search's verifying round
includes; a cache that timed some tactics per bucket (a ranked main job) leaves candidates untimed
(counted as failed, as batches.simulate does); an exhaustive search (the H200 one) has no such gap.

    python3 bench/bucket_cut_eval.py docs/data/2026-11-30-h200x2-full-search.db.xz --json out.json
    python3 bench/bucket_cut_eval.py docs/data/2026-12-07-h100-5d44fcb-main-job.db.xz \\
        docs/data/2026-12-07-h100-961f0e7-main-job.db.xz --rounds 150 --every 1 3 4 --unsure 0 0.1 \\
        --split none tactic
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import harness  # noqa: E402
from bench.harness import existing  # noqa: E402
from bench.rank_eval import loaded, open_store  # noqa: E402

from autotune.engine.strategies.ranked import batches as ranked, cut, plans as strategy, rows as rankdata  # noqa: E402
from autotune.engine.strategies.ranked import model as rankmodel  # noqa: E402

TARGET_GAP, TARGET_HITS, SLACK = 0.03, 0.97, 0.01
EVERY, UNSURE, SPLIT = (1, 2, 3, 4, 5), (0.0, 0.05, 0.1, 0.2), ("none", "kernel", "tactic")


def settings(every=EVERY, unsure=UNSURE, split=SPLIT) -> list[tuple[int, float, str]]:
    """The grid, the baseline (every = 1: every bucket measured, `unsure` and `split` moot) first."""
    out = [(1, 0.0, "none")] + [(e, u, x) for e in every if e > 1 for u in unsure for x in split]
    return list(dict.fromkeys(out))


class Ladder:
    """One held-out (source, problem): per bucket its group, winner, kept tactics and their predictions."""

    def __init__(self, groups, win, model, memo):
        self.g = {g.bucket: g for g in groups if (g.source, g.problem.key, g.bucket) in win}
        self.w = {b: win[(g.source, g.problem.key, b)] for b, g in self.g.items()}
        self.buckets = sorted(self.g)
        self.kept, self._top = {}, {}
        for b, g in self.g.items():
            ids, feats, _ = memo[g.key]
            kept = [(i, f) for i, f in zip(ids, feats) if i in g.timed or (i in g.negative and i not in g.rejected)]
            self.kept[b] = ([g.tactics[i] for i, _ in kept], model.predict([f for _, f in kept]) if kept else [])

    def plan(self, b: int, extras, cfg: ranked.Ranked) -> ranked.RankPlan:
        """rank_eval.replay's plan at bucket b: the default and `extras` (tactic ids) as extras."""
        g, tactics = self.g[b], self.kept[b]
        ids = [self.w[b].default_tactic_id, *extras]
        return strategy.every_member(ranked.plan_for(tactics[0], tactics[1], [g.tactics[i] for i in ids
                                                                               if i in g.tactics], cfg=cfg), g.problem)

    def measured_set(self, every: int, unsure: float, cfg: ranked.Ranked) -> frozenset[int]:
        """`cut.measured` on the ladder, from the first family and top-two margin of each bucket's plan."""
        if self._top.get("cfg") != cfg:
            self._top = {"cfg": cfg, **{b: cut.top_two(self.plan(b, [], cfg)) for b in self.buckets}}
        return cut.measured(self.buckets, {b: self._top[b][0] for b in self.buckets},
                            {b: self._top[b][1] for b in self.buckets}, every, unsure)

    def row(self, b: int, measured: list[str], pick, **extra) -> dict:
        g, w = self.g[b], self.w[b]
        gap = g.timed[pick] / g.timed[w.tactic_id] - 1 if pick in g.timed and w.tactic_id in g.timed else None
        return {"source": g.source, "problem": g.problem.key, "bucket": b, "kept": len(self.kept[b][0]),
                "measured": len(measured), "winner": pick, "committed": w.tactic_id, "gap": gap, **extra}


def splits(lad: Ladder, b: int, picks: dict, full: set[int], split: str) -> bool:
    """Whether verify bucket b is measured in full: its nearest measured picks differ — in kernel by the
    engine's rule (cut.split), or in tactic id; a missing pick against a pick differs."""
    lo, hi = cut.nearest(b, sorted(full))
    if split == "none" or lo is None or hi is None:
        return False
    tl, th = lad.g[lo].tactics.get(picks[lo]), lad.g[hi].tactics.get(picks[hi])
    if split == "tactic" or tl is None or th is None:
        return picks[lo] != picks[hi]
    return cut.split(tl, th, strategy.kernel_of)


def run_cut(lad: Ladder, full: frozenset[int], cfg: ranked.Ranked, split: str = "none") -> list[dict]:
    """One setting on one ladder: `full` by the ranked replay, then the rest by one verify round (or in full: split)."""
    picks: dict[int, str | None] = {}
    meas, out = set(), []

    def replay(b: int, **tag) -> None:
        lo, _ = cut.nearest(b, sorted(meas))
        measured, picks[b] = ranked.simulate(lad.plan(b, [] if lo is None else [picks[lo]], cfg),
                                             lad.g[b].timed, lad.w[b].default_tactic_id)
        meas.add(b)
        out.append(lad.row(b, measured, picks[b], full=True, **tag))
    for b in sorted(full):
        replay(b)
    for b in sorted(set(lad.buckets) - full):
        if splits(lad, b, picks, meas, split):
            replay(b, promoted=True)
            continue
        g, default = lad.g[b], lad.w[b].default_tactic_id
        near = [picks[x] for x in cut.nearest(b, sorted(picks)) if x is not None and picks[x] is not None]
        base = lad.plan(b, [], cfg)
        plan = cut.verify(base, [g.tactics[default]] if default in g.tactics else [], near)
        measured, picks[b] = ranked.simulate(plan, g.timed, default)
        cands = list(dict.fromkeys([*(t.id for t in plan.order[:1]), *(t.id for t in plan.extras)]))
        out.append(lad.row(b, measured, picks[b], full=False, candidates=cands))
    return sorted(out, key=lambda r: r["bucket"])


def evaluate(stores, rounds: int, grid: list[tuple[int, float, str]], cfg: ranked.Ranked = ranked.Ranked(),
             names=None, limit: int | None = None) -> list[dict]:
    """Rows per (source, bucket) with a committed winner, per held-out problem (lopo; first `limit`) and setting."""
    srcs, dev, gs, win = loaded(stores, names)
    rows, memo = [], {}
    for p in sorted({g.problem.key for g in gs})[:limit]:
        held = [g for g in gs if g.problem.key == p]
        model = rankdata.train_many(srcs, [g for g in gs if g.problem.key != p], rounds, memo)
        for g in held:
            memo.setdefault(g.key, rankdata.rows(g, *dev[g.source]))
        for src in dict.fromkeys(g.source for g in held):
            lad = Ladder([g for g in held if g.source == src], win, model, memo)
            for every, unsure, split in grid:
                full = lad.measured_set(every, unsure, cfg)
                rows += [{"every": every, "unsure": unsure, "split": split, **r}
                         for r in run_cut(lad, full, cfg, split)]
    return rows


def label(every: int, unsure: float, split: str = "none") -> str:
    return "every=1 (no cut)" if every <= 1 else f"every={every} unsure={unsure:g} split={split}"


def stats(rs: list[dict], base: list[dict]) -> dict:
    """A setting's summary over rows `rs`; `base`: the baseline's rows over the same groups."""
    n, bm = len(rs), sum(r["measured"] for r in base)
    full, meas = sum(r["full"] for r in rs), sum(r["measured"] for r in rs)
    w3 = sum(r["gap"] is not None and r["gap"] <= TARGET_GAP for r in rs)
    w1 = sum(r["gap"] is not None and r["gap"] <= 0.01 for r in rs)
    gaps = sorted((r for r in rs if r["gap"] is not None), key=lambda r: -r["gap"])
    return {"groups": n, "full": full, "full_share": full / n, "promoted": sum(r.get("promoted", False) for r in rs),
            "measured": meas, "baseline_measured": bm,
            "share_of_baseline": meas / bm if bm else float("nan"),
            "same": sum(r["winner"] == r["committed"] for r in rs),
            "within3": w3, "within3_share": w3 / n, "within1": w1, "within1_share": w1 / n,
            "worst_gap": gaps[0]["gap"] if gaps else float("nan"), "no_gap": n - len(gaps),
            "worst5": [(r["source"], r["problem"], r["bucket"], r["gap"]) for r in gaps[:5]]}


def _line(label_: str, s: dict) -> str:
    promoted = f", {s['promoted']} by split" if s["promoted"] else ""
    return (f"| {label_} | {s['groups']} | {s['full']} ({s['full_share']:.0%}{promoted}) | {s['measured']} "
            f"({s['share_of_baseline']:.1%}) | {s['same']} | {s['within3']} ({s['within3_share']:.1%}) "
            f"| {s['within1']} ({s['within1_share']:.1%}) | {s['worst_gap']:+.1%} |")


def summarize(rows: list[dict]) -> dict:
    """Per setting label: its stats over every source, and per source under "by_source" when several."""
    grid = list(dict.fromkeys((r["every"], r["unsure"], r["split"]) for r in rows))
    srcs = list(dict.fromkeys(r["source"] for r in rows))
    base = [r for r in rows if r["every"] <= 1]
    out = {}
    for e, u, x in grid:
        rs = [r for r in rows if (r["every"], r["unsure"], r["split"]) == (e, u, x)]
        s = stats(rs, base)
        s["every"], s["unsure"], s["split"] = e, u, x
        if len(srcs) > 1:
            s["by_source"] = {src: stats([r for r in rs if r["source"] == src], [r for r in base if r["source"] == src])
                              for src in srcs}
        out[label(e, u, x)] = s
    return out


def recommend(summary: dict, slack: float = SLACK) -> list[str]:
    """Settings with >= TARGET_HITS within TARGET_GAP, worst gap <= the baseline's + `slack`; cheapest first."""
    base = next(s for s in summary.values() if s["every"] <= 1)
    ok = [k for k, s in summary.items() if s["within3_share"] >= TARGET_HITS
          and s["worst_gap"] <= base["worst_gap"] + slack]
    return sorted(ok, key=lambda k: (summary[k]["measured"], -summary[k]["within3_share"], summary[k]["every"]))


def table(summary: dict) -> str:
    out = ["| setting | (problem, bucket) | measured in full | tactics measured (of baseline) | same winner "
           "| within 3 % | within 1 % | worst gap |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for k, s in summary.items():
        out.append(_line(k, s))
        for src, ss in s.get("by_source", {}).items():
            out.append(_line(f"{k}: {src}", ss))
    return "\n".join(out)


def worst_lists(summary: dict, keys: list[str]) -> str:
    return "\n".join(f"\nworst 5 at {k}:\n" + "\n".join(f"  {p} @ M={b}: {g:+.1%} ({src})" for src, p, b, g in
                                                      summary[k]["worst5"]) for k in keys)


def _args(argv):
    ap = harness.parser(__doc__)
    ap.add_argument("db", nargs="+", type=existing, help="caches of one arch (SQLite, or .xz of one)")
    ap.add_argument("--every", type=int, nargs="+", default=list(EVERY), help="measure every n-th bucket in full")
    ap.add_argument("--unsure", type=float, nargs="+", default=list(UNSURE), help="top-two margin (log2)")
    ap.add_argument("--split", nargs="+", choices=SPLIT, default=list(SPLIT), help="neighbours' picks differ in")
    ap.add_argument("--rounds", type=int, default=None, help="boosting rounds (default: the model's)")
    ap.add_argument("--limit", type=int, default=None, help="hold out the first n problems only (CI: fewer folds)")
    ap.add_argument("--slack", type=float, default=SLACK, help="worst gap allowed above the baseline's")
    ap.add_argument("--json", help="write the rows and the summary here")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    a = _args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(len(a.db)):
            (Path(tmp) / str(i)).mkdir()
        stores = [open_store(db, f"{tmp}/{i}") for i, db in enumerate(a.db)]
        try:
            rows = evaluate(stores, a.rounds or rankmodel.ROUNDS, settings(a.every, a.unsure, a.split), ranked.Ranked(),
                            {i: Path(db).name for i, db in enumerate(a.db)}, a.limit)
        finally:
            for st in stores:
                st.close()
    summary = summarize(rows)
    best, hits = recommend(summary, a.slack), recommend(summary, float("inf"))
    print(table(summary))
    # the baseline, the best three settings, and the cheapest that keeps the hits whatever its worst gap
    print(worst_lists(summary, list(dict.fromkeys([k for k in summary if summary[k]["every"] <= 1]
                                                  + best[:3] + hits[:1]))))
    print(f"\n{time.perf_counter() - t0:.1f} s; recommended (fewest tactics with >= {TARGET_HITS:.0%} within "
          f"{TARGET_GAP:.0%}, worst gap <= baseline + {a.slack:.0%}): {best[0] if best else 'none'}")
    if a.json:
        harness.write(a, {"summary": summary, "recommended": best, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
