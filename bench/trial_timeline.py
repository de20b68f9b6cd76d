"""Where a search's wall time went, from the commit stamps of its trials (every trial commits on
its own): per problem, first and last stamp and count of measured trials, plus the stamp of the
static rejections. Used for the H200 stage table in docs/search.md.

    python3 bench/trial_timeline.py docs/data/h200-glm5-tp8.db
"""
from __future__ import annotations

import sqlite3
import sys
from datetime import datetime


def main(path: str) -> None:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ts = lambda s: datetime.fromisoformat(s)  # noqa: E731
    (r0, r1, nrej), = con.execute("select min(created_at), max(created_at), count(*) from trials where status = 'rejected'")
    print(f"static rejections: {nrej}, stored {r0} .. {r1}")
    prev = ts(r1)
    rows = con.execute("select problem_key, min(created_at), max(created_at), count(*), count(distinct bucket) "
                       "from trials where bucket > 0 group by 1 order by 2").fetchall()
    print("| problem | starts after previous | wall | trials | buckets with trials |\n|---|---:|---:|---:|---:|")
    for key, a, b, n, nb in rows:
        print(f"| {key} | {(ts(a) - prev).total_seconds():.0f} s | {(ts(b) - ts(a)).total_seconds():.0f} s | {n} | {nb} |")
        prev = ts(b)
    for status, n in con.execute("select status, count(*) from trials group by 1 order by 1"):
        print(f"{status}: {n}")


if __name__ == "__main__":
    main(sys.argv[1])
