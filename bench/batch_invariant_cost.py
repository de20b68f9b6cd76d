"""What `--batch-invariant` costs against per-bucket winners, from a stored full search (offline).

For each problem of the cache: the one batch-invariant tactic the search would store for every M
(autotune.engine.invariant.one_per_problem over the trials of tactics whose family says they are
batch-invariant) against the stored per-bucket winner. Times are the cache's own medians: a tactic
cut by halving in round 1 has a round-1 median (fewer reps) there, so the figures are estimates of
what a `--batch-invariant` search on that machine would store, not a re-measurement.

Split-K W4A16 and moe_decode tactics are batch-invariant since 2026-12-01 (a fixed split, large M
cut into row or token chunks: tactics/triton_fp4/splitk.chunk_rows, MoEDecodeLauncher.chunk_tokens). The committed search predates that: at an M past
chunk_rows its launcher lowered the split instead, so such a stored time is not what the tactic
does now and is left out (the tactic then lacks that bucket and cannot be the pick).

    python3 bench/batch_invariant_cost.py docs/data/h200x2-glm5-tp8-full.db.xz [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.core.tactic import Tactic  # noqa: E402
from autotune.tactics.triton_fp4.moe_decode import chunk_tokens  # noqa: E402
from autotune.tactics.triton_fp4.splitk import chunk_rows  # noqa: E402
from autotune.engine.invariant import invariant, one_per_problem  # noqa: E402
from bench.common import existing  # noqa: E402
from bench.rank_eval import open_store  # noqa: E402


def as_run_now(p, trial) -> bool:
    """False for a split-K time (w4a16_dequant, moe_decode) stored at an M its launcher now cuts
    into chunks (the split was lowered then)."""
    t = Tactic.from_json(trial.params_json)
    if t.family != "triton" or t.get("split_k", 1) == 1:
        return True
    if t.get("kernel") == "w4a16_dequant":
        rows = chunk_rows(t.params, p.n)
        return rows is None or trial.bucket <= rows
    if t.get("kernel") == "moe_decode":
        tokens = chunk_tokens(t.params, p)
        return tokens is None or trial.bucket <= tokens
    return True


def rows(store) -> list[dict]:
    out = []
    for w_dev in sorted({w.device_key for w in store.winners()}):
        wins = [w for w in store.winners(w_dev)]
        for p in store.problems():
            mine = {w.bucket: w for w in wins if w.problem_key == p.key}
            if not mine:
                continue
            buckets = sorted(mine)
            default_id = next(iter(mine.values())).default_tactic_id
            trials = [t for b in buckets for t in store.get_trials(p.key, b, w_dev)
                      if invariant(p, Tactic.from_json(t.params_json)) and as_run_now(p, t)]
            pick, mean_vs_inv = one_per_problem(trials, buckets, default_id)
            if pick is None:
                out.append({"problem": p.key, "device": w_dev, "pick": None})
                continue
            t_of = {t.bucket: t.median_us for t in trials if t.tactic_id == pick.tactic_id}
            ratio = {b: t_of[b] / mine[b].median_us for b in buckets}
            out.append({"problem": p.key, "device": w_dev, "pick": str(Tactic.from_json(pick.params_json)),
                        "buckets": len(buckets),
                        "geomean_vs_winners": math.exp(sum(math.log(r) for r in ratio.values()) / len(ratio)),
                        "worst_vs_winners": max(ratio.values()), "worst_bucket": max(ratio, key=ratio.get),
                        "geomean_vs_best_invariant": mean_vs_inv,
                        "winners_invariant": sum(invariant(p, Tactic.from_json(mine[b].params_json))
                                                 for b in buckets)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=existing, help="a cache file (SQLite, or .xz of one) holding a full search")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(a.db, tmp)
        try:
            rs = rows(store)
        finally:
            store.close()
    print("| problem | buckets | invariant tactic | vs per-bucket winners (geomean) | worst (M) | "
          "per-bucket winners already invariant |")
    print("|---|---:|---|---:|---|---:|")
    for r in rs:
        if r["pick"] is None:
            print(f"| {r['problem']} | | none with a time in every bucket | | | |")
            continue
        print(f"| {r['problem']} | {r['buckets']} | `{r['pick']}` | {r['geomean_vs_winners']:.3f}× | "
              f"{r['worst_vs_winners']:.2f}× ({r['worst_bucket']}) | {r['winners_invariant']} |")
    if a.json:
        Path(a.json).write_text(json.dumps(rs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
