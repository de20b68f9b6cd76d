"""Where a search's wall time went, from the commit stamps of its trials (every trial commits on
its own): per problem, first and last stamp and count of measured trials, plus the stamp of the
static rejections, trial and winner counts, and the trials spent on rejected tactics. Used for the H200 stage table in docs/search.md.

    python3 bench/trial_timeline.py docs/data/h200-glm5-tp8.db
"""
from __future__ import annotations

import sqlite3
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import existing, parser  # noqa: E402


def spent_on_rejected(con: sqlite3.Connection) -> int:
    """Trials other than the rejection itself for tactics whose verdict rejected them (must be 0)."""
    return con.execute("""select count(*) from trials t where t.status != 'rejected' and exists
                          (select 1 from trials r where r.tactic_id = t.tactic_id and r.problem_key = t.problem_key
                           and r.status = 'rejected')""").fetchone()[0]


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
    for fam, status, n in con.execute("select family, status, count(*) from trials group by 1, 2 order by 1, 2"):
        print(f"{fam} {status}: {n}")
    print("winners by family:", con.execute("select family, count(*) from winners group by 1").fetchall())
    print("trials spent on rejected tactics:", spent_on_rejected(con))
    fails = con.execute("select substr(reason, 1, 60), count(*) from trials where status = 'failed' "
                        "group by 1 order by 2 desc limit 5").fetchall()
    print("most common failure reasons:", fails)


def cli(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("cache", type=existing, help="a search's cache (SQLite, opened read-only)")
    main(ap.parse_args(argv).cache)
    return 0


if __name__ == "__main__":
    sys.exit(cli())
