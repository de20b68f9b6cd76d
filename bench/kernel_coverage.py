"""Which kernels a search left unmeasured where it measured them elsewhere, from its cache (no GPU).

    python3 bench/kernel_coverage.py CACHE [--json OUT]

CACHE is a search's cache (.db, or .db.xz as committed under docs/data/). A kernel is a family and,
where it has several, its `kernel` parameter (strategy.kernel_of). For every (problem, bucket) the
cache measured (trials ok or dropped by halving), each kernel the search measured at another bucket
of the same problem but not at this one is a gap: counted per kernel, with the (problem, bucket)
list in --json. The fourteenth main job's count is what made the ranked search put every kernel
into its first batches (docs/search.md).
"""
from __future__ import annotations

import json
import lzma
import sqlite3
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import common  # noqa: E402


def gaps(con: sqlite3.Connection) -> tuple[int, dict[str, list[tuple[str, int]]]]:
    """(jobs measured, kernel → the (problem, bucket) where it was measured at another bucket only)."""
    from autotune.core.tactic import Tactic
    from autotune.engine.strategy import kernel_of
    done: dict[tuple[str, int], set[str]] = defaultdict(set)
    for pk, b, pj in con.execute("select t.problem_key, t.bucket, x.params_json from trials t join tactics x "
                                 "on x.id = t.tactic_id where t.status in ('ok', 'dropped')"):
        done[(pk, b)].add("/".join(filter(None, kernel_of(Tactic.from_json(pj)))))
    per_problem: dict[str, set[str]] = defaultdict(set)
    for (pk, _), ks in done.items():
        per_problem[pk] |= ks
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for (pk, b), ks in sorted(done.items()):
        for k in sorted(per_problem[pk] - ks):
            out[k].append((pk, b))
    return len(done), dict(out)


def main(argv=None) -> int:
    ap = common.parser(__doc__)
    ap.add_argument("cache", type=common.existing)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    path = Path(a.cache)
    with tempfile.TemporaryDirectory() as d:
        if path.suffix == ".xz":
            db = Path(d) / "c.db"
            db.write_bytes(lzma.decompress(path.read_bytes()))
            path = db
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            jobs, out = gaps(con)
        finally:
            con.close()
    counts = Counter({k: len(v) for k, v in out.items()})
    print(f"{a.cache}: {jobs} (problem, bucket) measured; a kernel measured at another bucket of the problem "
          f"but not there: {sum(counts.values())} — " + ", ".join(f"{k} {n}" for k, n in counts.most_common()))
    if a.json:
        a.json.write_text(json.dumps({"cache": str(a.cache), "jobs": jobs, "gaps": out}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
