"""`autotune show` and `autotune search --dry-run` print byte-identical output across refactors.

Each golden file is the exact output of one command on committed inputs; it is compared byte for byte
and nothing is normalised. Machine-dependent inputs are pinned instead: no GPU is visible
(CUDA_VISIBLE_DEVICES=""), so the live arch is "cpu" everywhere; the table width is COLUMNS=120; no
AUTOTUNE_* variable leaks in. `python3 tests/test_golden.py ROOT_OF_A_CHECKOUT` regenerates them from
that checkout. A golden changes only on purpose, in its own commit that says why (`git log
tests/data/golden` lists each change and its reason).
"""
from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
SMALL = "tests/data/2026-11-29-h200-glm5-tp8-search.db"
FULL = "{full}"     # docs/data/2026-11-30-h200x2-full-search.db.xz, decompressed into a temporary folder

GLM5 = ["search", "--model", "glm5", "--tp", "8", "--dry-run"]
COMMANDS: dict[str, list[str]] = {
    "show_h200": ["show", "--cache", SMALL],
    "show_h200x2_full": ["show", "--cache", FULL],
    "show_h200_json": ["show", "--json", "--cache", SMALL],
    "search_sm120": GLM5 + ["--arch", "sm120"],
    "search_sm90": GLM5 + ["--arch", "sm90"],
    "search_sm100_cutlass": GLM5 + ["--arch", "sm100", "--families", "cutlass"],
    "search_sm120_cutlass_torch_json": GLM5 + ["--arch", "sm120", "--families", "cutlass,torch", "--json"],
    "search_sm120_list_tactics": GLM5 + ["--arch", "sm120", "--only", "down_proj", "--list-tactics", "triton,torch"],
}


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE_")}
    env.update(PYTHONPATH=str(root), CUDA_VISIBLE_DEVICES="", COLUMNS="120", LC_ALL="C.UTF-8")
    env.pop("TERM", None)
    return env


def _run(root: Path, args: list[str], full: Path) -> bytes:
    args = [str(full) if a == FULL else a for a in args]
    p = subprocess.run([sys.executable, "cli.py", *args], cwd=root, env=_env(root), capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return p.stdout


def _decompressed(root: Path, into: Path) -> Path:
    out = into / "h200x2-glm5-tp8-full.db"
    with lzma.open(root / "docs/data/2026-11-30-h200x2-full-search.db.xz") as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst)
    return out


@pytest.fixture(scope="module")
def full_db(tmp_path_factory) -> Path:
    return _decompressed(ROOT, tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_output_is_byte_identical_to_the_golden(name, full_db):
    want = (GOLDEN / f"{name}.txt").read_bytes()
    got = _run(ROOT, COMMANDS[name], full_db)
    assert got == want, f"`autotune {' '.join(COMMANDS[name])}` output differs from tests/data/golden/{name}.txt"


if __name__ == "__main__":      # capture: python3 tests/test_golden.py ROOT  (writes tests/data/golden/*.txt)
    import tempfile
    src = Path(sys.argv[1]).resolve()
    with tempfile.TemporaryDirectory() as d:
        full = _decompressed(src, Path(d))
        for name, args in COMMANDS.items():
            (GOLDEN / f"{name}.txt").write_bytes(_run(src, args, full))
            print("wrote", name)
