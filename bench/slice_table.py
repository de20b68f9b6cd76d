"""Print the markdown tables of docs/h200-slice.md from a cache written by bench/h200_slice.sh.

    python bench/slice_table.py /path/to/h200.db
"""
import json
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import existing, parser  # noqa: E402


def main(path: str) -> None:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    trials = con.execute("select r.problem_key, r.bucket, r.family, t.params_json, r.status, r.median_us, "
                         "r.smem_model, r.smem_compiled from trials r join tactics t on t.id = r.tactic_id").fetchall()
    winners = {(p, b): (fam, params, med, dmed) for p, b, fam, params, med, dmed in con.execute(
        "select w.problem_key, w.bucket, w.family, t.params_json, w.median_us, w.default_median_us "
        "from winners w join tactics t on t.id = w.tactic_id")}
    best = defaultdict(dict)   # (problem, bucket) -> family -> best median
    for p, b, fam, _, st, med, _, _ in trials:
        if st == "ok":
            cur = best[(p, b)].get(fam)
            best[(p, b)][fam] = med if cur is None else min(cur, med)
    print("| problem | M | winner | µs | default µs | × default | best triton µs | best torch µs |")
    print("|---|---|---|---|---|---|---|---|")
    for (p, b), (fam, params, med, dmed) in sorted(winners.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        prm = json.loads(params)["params"]
        short = ",".join(f"{k}={v}" for k, v in prm.items() if k != "kernel")
        bt, bo = best[(p, b)].get("triton"), best[(p, b)].get("torch")
        print(f"| {p} | {b} | {fam}[{short}] | {med:.1f} | {dmed or float('nan'):.1f} | "
              f"{(dmed / med) if dmed else float('nan'):.2f} | {bt or float('nan'):.1f} | {bo or float('nan'):.1f} |")
    counts = con.execute("select family, status, count(*) from trials group by 1, 2 order by 1, 2").fetchall()
    print("\n| family | status | trials |\n|---|---|---|")
    for f, s, n in counts:
        print(f"| {f} | {s} | {n} |")
    pairs = {(json.loads(pj)["params"].__repr__(), sm, sc) for _, _, fam, pj, _, _, sm, sc in trials
             if fam == "triton" and sc is not None}
    bad = [x for x in pairs if x[1] != x[2]]
    print(f"\nTriton configs compiled for the live GPU: {len(pairs)}; smem model ≠ compiler: {len(bad)}")
    for prm, sm, sc in bad:
        print(f"- {prm}: model {sm}, compiler {sc}")


def cli(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("cache", type=existing, help="a cache written by bench/h200_slice.sh (opened read-only)")
    main(ap.parse_args(argv).cache)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
