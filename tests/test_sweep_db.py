"""The committed moe_mma sweep cache (a source of the shipped rank model) is what
tools/sweep_db_from_json.py rebuilds from the run's committed JSON: the same trials, keyed by the
same device, libraries and code of the revision that measured. CPU only; needs the git history."""
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLS = ("problem_key", "bucket", "tactic_id", "family", "device_key", "lib_key", "code_key", "status",
        "median_us", "smem_model")


def _rows(db: Path) -> list:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return sorted(con.execute(f"select {', '.join(COLS)} from trials").fetchall())
    finally:
        con.close()


def test_the_committed_sweep_cache_is_the_rebuild_of_the_committed_json(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import sweep_db_from_json as S
    rev = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%H", "--", S.JSON],
                         capture_output=True, text=True)
    shallow = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True).stdout.strip() == "true"
    if rev.returncode != 0 or not rev.stdout.strip() or shallow:
        pytest.skip("no full git history here: the measuring revision's code keys cannot be computed")
    out = tmp_path / "sweep.db"
    assert S.main(["--out", str(out)]) == 0
    from tools.fit_rank_models import copy
    committed, rebuilt = _rows(copy(ROOT / S.OUT, tmp_path / "committed.db")), _rows(out)
    assert len(committed) == 122 and committed == rebuilt
    assert len({r[6] for r in rebuilt}) == 1                   # one revision's code measured every trial
    assert not list(out.parent.glob("sweep.db-*"))             # self-contained: no -wal / -shm beside it
    with pytest.raises(SystemExit, match="exists"):
        S.main(["--out", str(out)])                            # never replaces a cache unless --force
