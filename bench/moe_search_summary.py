"""The routed-MoE search on the H200 from its cache: trials, winners per problem and bucket, tuned
vs the designated default (docs/moe-decode.md).

    python3 bench/moe_search_summary.py docs/data/moe-search-h200.db
"""
from __future__ import annotations

import json
import math
import sqlite3
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import existing, parser  # noqa: E402


def short(p: dict) -> str:
    if p.get("kernel") == "moe_decode":
        return f"{p['route'][0]} {p['block_m']}×{p['block_n']}×{p['block_k']} s{p['split_k']} st{p['num_stages']}"
    if p.get("kernel") == "moe_w4a16":
        return f"moe_w4a16 {p['block_m']}×{p['block_n']}×{p['block_k']} st{p['num_stages']}"
    return json.dumps(p)


def summary(path: str) -> str:
    c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)      # a committed cache: read, never written
    params = {i: json.loads(j).get("params", {}) for i, j in c.execute("select id, params_json from tactics")}
    out = []
    st = dict(c.execute("select status, count(*) from trials group by status").fetchall())
    errs = [r[0] for r in c.execute("select rel_err from trials where rel_err is not null")]
    smem = c.execute("select count(*), sum(smem_model = smem_compiled) from trials "
                     "where smem_compiled is not null and smem_model is not null").fetchone()
    check = f"float64 check {min(errs):.2e}–{max(errs):.2e}" if errs else "no rel_err stored"
    out.append(f"Trials: {st.get('ok', 0) + st.get('dropped', 0)} checked and timed ({st.get('dropped', 0)} dropped "
               f"by successive halving), {st.get('failed', 0)} failed, {st.get('rejected', 0)} static rejections; "
               f"{check}; smem model = compiled on {smem[1]} of {smem[0]}.")
    rows = defaultdict(list)
    for key, b, tid, us, dus, sp, did in c.execute("select problem_key, bucket, tactic_id, median_us, default_median_us, "
                                                   "speedup, default_tactic_id from winners order by problem_key, bucket"):
        rows[key].append((b, params[tid], us, dus, sp, did))
    for key, rs in rows.items():
        sps = [r[4] for r in rs if r[4] is not None]     # None: the default has no time in that bucket
        missing = len(rs) - len(sps)
        if sps:
            geo = math.exp(sum(math.log(x) for x in sps) / len(sps))
            head = (f"**{key}**: tuned vs default, geomean over {len(sps)} buckets {geo:.2f}× "
                    f"(min {min(sps):.2f}, max {max(sps):.2f})")
            if missing:
                head += f"; {missing} bucket{'s' if missing > 1 else ''} without a speedup (no default time) left out"
        else:
            head = f"**{key}**: no speedup in any of its {len(rs)} buckets (no default time)"
        out += ["", head, "", "| M | winner | µs | default µs | default |", "|---:|---|---:|---:|---|"]
        out += [f"| {b} | {short(p)} | {us:.1f} | {'—' if dus is None else f'{dus:.1f}'} | {short(params[d])} |"
                for b, p, us, dus, _, d in rs]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("cache", type=existing, help="the routed-MoE search's cache (SQLite, opened read-only)")
    print(summary(ap.parse_args(argv).cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
