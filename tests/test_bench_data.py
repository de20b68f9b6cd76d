"""docs/data/ keeps to its policy (docs/data/README.md): at most 5 MB, caches only as .db.xz, names
that carry a date (never a count of the work's own rounds), and every file the tools and the
GPU-check record name is present."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "data"
CAP_BYTES = 5 * 1000 * 1000
#: files named without a date: the policy itself, the file of several runs, one a kernel module cites by name
UNDATED = {"README.md", "main-job-summaries.json", "moe-walk-ab-h100.json"}
ORDINAL = re.compile(r"(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
                     r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth)", re.I)


def _files() -> list[Path]:
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "docs/data"], capture_output=True, text=True)
    tracked = [ROOT / p for p in r.stdout.split()] if r.returncode == 0 and r.stdout.strip() else []
    return tracked or [p for p in DATA.rglob("*") if p.is_file()]


def test_docs_data_stays_under_its_cap():
    sizes = {p.relative_to(DATA).as_posix(): p.stat().st_size for p in _files() if p.exists()}
    assert sum(sizes.values()) <= CAP_BYTES, sorted(sizes.items(), key=lambda kv: -kv[1])[:5]


def test_names_carry_a_date_and_caches_are_compressed():
    for p in _files():
        name = p.relative_to(DATA).as_posix()
        assert "/" not in name, f"{name}: docs/data is flat"
        assert not name.endswith((".db", ".tgz", ".tar")), f"{name}: caches are committed as .db.xz"
        assert not ORDINAL.search(name), f"{name}: a name counts rounds; use a date"
        assert name in UNDATED or re.match(r"\d{4}-\d\d-\d\d-", name), f"{name}: no date in its name"


def test_the_tools_and_the_record_name_files_that_exist():
    import sys
    sys.path.insert(0, str(ROOT))
    from tools import fit_rank_models
    for _, path in fit_rank_models.CACHES:
        assert (ROOT / path).is_file(), path
    record = json.loads((ROOT / "tactics" / "cuda" / "gpu_checked.json").read_text())
    for kernel, entry in record.items():
        assert (DATA / entry["log"]).is_file(), (kernel, entry["log"])
