"""Numbers quoted in the docs, recomputed from the committed data (read from /tmp copies)."""
from __future__ import annotations

import json
import shutil
import sqlite3
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "data"


def _ro_copy(src: Path, tmp_path: Path) -> sqlite3.Connection:
    dst = tmp_path / src.name
    shutil.copy(src, dst)
    return sqlite3.connect(dst)


def test_cuda_search_winner_count_matches_the_doc(tmp_path):
    con = _ro_copy(DATA / "cuda-search-h200" / "cuda-search.db", tmp_path)
    fam = dict(con.execute("select family, count(*) from winners group by family").fetchall())
    assert fam == {"cuda": 16, "triton": 12}
    doc = (ROOT / "docs" / "cuda-family.md").read_text()
    assert "cuda wins 16 of 28 buckets" in doc
    for f in [*ROOT.joinpath("docs").glob("*.md"), ROOT / "README.md"]:
        assert "17 of 28" not in f.read_text(), f


def test_nvrtc_median_is_the_median_and_the_doc_quotes_it():
    sys.path.insert(0, str(ROOT / "bench"))
    import cuda_h200
    res = json.loads((DATA / "cuda-h200.json").read_text())
    nv = [r["nvrtc_s"] for r in res["check"]["compile"]]
    assert len(nv) % 2 == 0          # an even count: sorted(nv)[len // 2] is not the median
    text = cuda_h200.render({"check": res["check"]})
    assert "NVRTC per variant: median 0.38 s, max 1.59 s" in text
    assert "NVRTC 0.38 s median (max 1.59 s)" in (ROOT / "docs" / "cuda-family.md").read_text()


def test_rank_run_a_w13_buckets_match_the_doc(tmp_path):
    with tarfile.open(DATA / "h200-rank-caches.tgz") as tf:
        tf.extractall(tmp_path, filter="data")
    a = sqlite3.connect(next(tmp_path.rglob("a.db")))
    w13 = "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8"
    won = {b for (b,) in a.execute("select bucket from winners where problem_key = ?", (w13,))}
    tried = {b for (b,) in a.execute("select bucket from trials where problem_key = ? and bucket > 0",
                                       (w13,))}
    assert len(won) == 13 and tried - won == {1536}
    assert "13 of 21 buckets in 40 s, a 14th (M = 1536) cut mid-job" in (ROOT / "docs" / "search.md").read_text()
