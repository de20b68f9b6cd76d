"""The timer's precision stop (TimerConfig.precision) replayed offline on stored main jobs.

Each stored trial's samples are modelled as normal with sigma = IQR / 1.349 (a median of n has
standard error 1.2533 sigma / sqrt(n)). Per (problem, bucket) the finalists' estimates are drawn
many times with the samples the rule would take (per request max(first, (1.2533 sigma / (precision
median))^2), `cycles` requests, capped at the stored count) and with the stored counts (the budget
rule); the pick is the fastest estimate, its regret its stored median over the fastest's, less 1.
Printed per precision: the share of jobs whose pick is > 1 % and > 3 % slower, the worst mean regret,
and the samples' GPU time (samples x (median x the graph's calls + the spin)) against the budget
rule's. Left out: the halving rounds' drops and the winner rule's default margin.

    python3 bench/stop_rule_eval.py docs/data/2026-12-06-h100-2d14637-main-job.db.xz
    python3 bench/stop_rule_eval.py A.db.xz B.db.xz --precision 0.005 0.0025 0.001 --json out.json
"""
from __future__ import annotations

import json
import lzma
import math
import random
import shutil
import sqlite3
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import harness  # noqa: E402

from autotune.core import inputs  # noqa: E402
from autotune.core.problem import Problem  # noqa: E402

L2_BYTES = 50 << 20          # the H100's L2 (the H200's too): sizes a graph's rotation of input sets
LEAD_US = 20.0               # TimerConfig.lead_us: the spin ahead of each sample
SE = 1.2533 / 1.349          # standard error of a median of n normal samples per unit IQR, times sqrt(n)


def rows(db: str, tmp: str) -> list[tuple]:
    """(problem_key, bucket, tactic_id, status, median_us, iqr_us, reps) of every ok or dropped trial."""
    path = db
    if db.endswith(".xz"):
        path = str(Path(tmp) / Path(db).name[:-3])
        with lzma.open(db) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute("SELECT problem_key, bucket, tactic_id, status, median_us, iqr_us, reps FROM trials "
                           "WHERE status IN ('ok', 'dropped') AND median_us > 0 AND reps > 0").fetchall()
    finally:
        con.close()


def calls(problem_key: str, bucket: int) -> int:
    """How many calls a graph of this (problem, bucket) holds: the rotation of input sets that makes
    twice the L2 (autotune.engine.timing.sets_for_cold_l2 on a 50 MB L2)."""
    p = Problem.from_key(problem_key)
    return max(1, min(256, math.ceil(2 * L2_BYTES / max(1, inputs.set_bytes(p, bucket)))))


def rule_samples(median: float, iqr: float, reps: int, precision: float, first: int, requests: int) -> int:
    """Samples the precision stop takes over `requests` requests, capped at the stored count."""
    if precision <= 0:
        return reps
    per = max(first, math.ceil((SE * iqr / (precision * median)) ** 2))
    return min(reps, requests * per)


def evaluate(trials: list[tuple], precisions: list[float], first: int, cycles: int, draws: int,
             seed: int = 0) -> list[dict]:
    jobs: dict[tuple, list[tuple]] = defaultdict(list)
    for t in trials:
        jobs[(t[0], t[1])].append(t)
    rng = random.Random(seed)
    out = []
    for prec in [0.0, *precisions]:
        over1 = over3 = worst = gpu_s = 0.0
        n_jobs = 0
        for (key, bucket), ts in jobs.items():
            n_calls = calls(key, bucket)
            for t in ts:
                n = rule_samples(t[4], t[5], t[6], prec, first, cycles if t[3] == "ok" else 2)
                gpu_s += n * (t[4] * n_calls + LEAD_US) * 1e-6
            fin = [t for t in ts if t[3] == "ok"]
            if len(fin) < 2:
                continue
            n_jobs += 1
            best = min(t[4] for t in fin)
            regrets = []
            for _ in range(draws):
                est = [(t[4] + rng.gauss(0.0, SE * t[5] / math.sqrt(rule_samples(t[4], t[5], t[6], prec, first, cycles))),
                        t[4]) for t in fin]
                regrets.append(min(est)[1] / best - 1)
            mean = sum(regrets) / draws
            over1 += sum(r > 0.01 for r in regrets) / draws
            over3 += sum(r > 0.03 for r in regrets) / draws
            worst = max(worst, mean)
        out.append({"precision": prec, "jobs": n_jobs, "over_1pct": over1 / max(1, n_jobs),
                    "over_3pct": over3 / max(1, n_jobs), "worst_mean_regret": worst, "samples_gpu_s": gpu_s})
    return out


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("caches", nargs="+", type=harness.existing)
    ap.add_argument("--precision", nargs="+", type=float, default=[0.005, 0.0025, 0.001])
    ap.add_argument("--first", type=int, default=5, help="the first batch's samples per request")
    ap.add_argument("--cycles", type=int, default=5, help="requests a finalist gets (the interleaved final)")
    ap.add_argument("--draws", type=int, default=200)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for db in a.caches:
            res = evaluate(rows(db, tmp), a.precision, a.first, a.cycles, a.draws)
            report[db] = res
            base = res[0]["samples_gpu_s"]
            print(f"{db}: {res[0]['jobs']} jobs with two or more finalists")
            print(f"  {'precision':>9}  {'>1 % slower':>11}  {'>3 % slower':>11}  {'worst mean':>10}  {'samples GPU s':>13}")
            for r in res:
                name = "budget" if r["precision"] == 0 else f"{r['precision']:.2%}"
                print(f"  {name:>9}  {r['over_1pct']:>11.2%}  {r['over_3pct']:>11.2%}  {r['worst_mean_regret']:>10.2%}  "
                      f"{r['samples_gpu_s']:>8.1f} ({r['samples_gpu_s'] / base:.0%})")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
