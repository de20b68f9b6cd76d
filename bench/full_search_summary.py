"""The numbers docs/triton-fp4.md quotes for the full H200 search, from its cache (and, for the
M ≥ 4096 comparison with cuBLAS bf16, from bench/w4a4_h200.py's JSON of the same session).

    python3 bench/full_search_summary.py docs/data/h200x2-glm5-tp8-full.db.xz docs/data/w4a4-h200.json

Prints: trial and winner counts, the winners' float64 errors, smem model vs compiler, and per
problem the winning kernels by bucket range, the M = 1 time and tuned-vs-default (geometric mean,
min, max over buckets); then the large-M rows against cuBLAS.
"""
from __future__ import annotations

import collections
import json
import lzma
import math
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import existing, parser  # noqa: E402


def main(db: str, w4a4_json: str | None = None) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        if db.endswith(".xz"):
            with lzma.open(db) as src, open(f"{tmp}/cache.db", "wb") as dst:
                shutil.copyfileobj(src, dst)
            db = f"{tmp}/cache.db"
        c = sqlite3.connect(db)
        try:
            return _summary(c, w4a4_json)
        finally:
            c.close()


def _summary(c: sqlite3.Connection, w4a4_json: str | None) -> int:
    (trials,), = c.execute("select count(*) from trials where bucket > 0")
    statuses = dict(c.execute("select status, count(*) from trials group by 1"))
    print(f"trials measured: {trials}; by status: {statuses}")
    n, lo, hi = c.execute("""select count(*), min(t.rel_err), max(t.rel_err) from winners w join trials t
                             on t.problem_key = w.problem_key and t.bucket = w.bucket and t.tactic_id = w.tactic_id
                             and t.status = 'ok'""").fetchone()
    print(f"winners: {n}; their float64 relative error {lo:.3g} .. {hi:.3g}")
    eq, tot = c.execute("""select sum(smem_model = smem_compiled), count(*) from trials where family = 'triton'
                           and smem_compiled is not null and smem_model is not null""").fetchone()
    print(f"smem model = compiler: {eq} of {tot} compiled Triton trials")
    rows = c.execute("""select w.problem_key, w.bucket, w.median_us, w.speedup, t.params_json
                        from winners w join tactics t on t.id = w.tactic_id order by 1, 2""").fetchall()
    kinds = collections.Counter()
    by_problem: dict[str, list] = collections.defaultdict(list)
    for key, b, us, sp, pj in rows:
        kernel = json.loads(pj)["params"].get("kernel", json.loads(pj)["family"])
        kinds[kernel] += 1
        by_problem[key].append((b, us, sp, kernel))
    print("winners by kernel:", dict(kinds))
    for key, rs in by_problem.items():
        spans = collections.defaultdict(list)
        for b, _, _, kernel in rs:
            spans[kernel].append(b)
        sp = [r[2] for r in rs]
        g = math.exp(sum(map(math.log, sp)) / len(sp))
        span = "; ".join(f"{k} M {min(v)}..{max(v)}" for k, v in spans.items())
        print(f"{key}: {span}; M=1 {rs[0][1]:.1f} us; tuned vs default geomean {g:.2f} ({min(sp):.2f}..{max(sp):.2f})")
    if w4a4_json:
        cublas = {(r["n"], r["k"], r["m"]): r["cublas_bf16_us"] for r in json.load(open(w4a4_json))["rows"]}
        print("M >= 4096, search winner vs cuBLAS bf16 (bench/w4a4_h200.py run):")
        for key, rs in by_problem.items():
            if not key.startswith("dense:"):
                continue
            n_, k_ = (int(x[1:]) for x in key.split(":")[-2:])
            for b, us, _, _ in rs:
                if b >= 4096 and (n_, k_, b) in cublas:
                    print(f"  n{n_} k{k_} M={b}: {us:.1f} vs {cublas[(n_, k_, b)]:.1f} us = {cublas[(n_, k_, b)] / us:.2f}x")
    return 0


def cli(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("cache", type=existing, help="the full search's cache (SQLite, or .xz of one)")
    ap.add_argument("w4a4_json", type=existing, nargs="?", help="bench/w4a4_h200.py's JSON of the same session")
    a = ap.parse_args(argv)
    return main(a.cache, a.w4a4_json)


if __name__ == "__main__":
    sys.exit(cli())
