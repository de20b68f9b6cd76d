"""tools/keys_moved.py on a real temporary git repository: the project's sources committed, then one
launch file and one family module edited in the working tree; exactly the members and GPU-check
digests whose declared sources hold them are reported, and a bad BASE is one line and exit 2."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from autotune.tactics import registry
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import checked as CK

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("keys_moved", ROOT / "tools" / "keys_moved.py")
KM = importlib.util.module_from_spec(spec)
spec.loader.exec_module(KM)  # type: ignore[union-attr]

#: the project's code a probe imports (autotune/tactics and autotune/cache link to the last two)
PARTS = ("autotune", "tactics", "cache", "cli.py")
EDITED = ("autotune.tactics.torch_ref", "autotune.tactics.cuda.moe_tok")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    r = tmp_path_factory.mktemp("keys-moved") / "repo"
    r.mkdir()
    for p in PARTS:
        src = ROOT / p
        if src.is_dir():
            shutil.copytree(src, r / p, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, r / p)
    _git(r, "init", "-q")
    _git(r, "add", "-A")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    for mod in EDITED:                  # a code edit (a comment would keep the key)
        f = r.joinpath(*mod.split(".")[1:]).with_suffix(".py")
        f.write_text(f.read_text() + "\n_KEYS_MOVED_EDIT = 1\n")
    return r


def test_reports_exactly_what_the_edit_moved(repo, capsys):
    assert KM.main(["HEAD", "--repo", str(repo)]) == 0
    text = capsys.readouterr().out
    want = sorted(c.member for f in registry.names() for c in registry.get(f).codes()
                  if set(EDITED) & set(c.modules))
    want_gpu = sorted(k for k in B.SOURCES if set(EDITED) & set(CK.code(k).modules))
    assert "torch" in want and want_gpu                   # the edit reaches both kinds
    rows = [ln.split()[0] for ln in text.splitlines() if ln.startswith("  ")]
    assert rows == want + want_gpu, text
    assert all("needs its GPU tests" in ln for ln in text.splitlines() if ln.split()[:1] and ln.split()[0] in want_gpu)
    head = _git(repo, "rev-parse", "HEAD").strip()
    assert f"({head[:12]})" in text and f"{len(want)} of " in text and "not compared" not in text


def test_nothing_moves_against_the_tree_itself(repo, capsys):
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "stash", "-q")
    try:
        assert KM.main(["HEAD", "--repo", str(repo), "--json"]) == 0
    finally:
        _git(repo, "stash", "pop", "-q")
    out = capsys.readouterr().out
    import json
    d = json.loads(out)
    assert d["members"] == [] and d["gpu"] == [] and d["errors"] == [] and d["of"] >= 5


def test_a_bad_base_is_one_line(repo, capsys):
    assert KM.main(["no-such-rev", "--repo", str(repo)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no-such-rev" in err


def test_moved_includes_a_member_on_one_side_only():
    base = {"members": {"a": {"family": "f", "digest": "1", "key": "k1"}, "gone": {"family": "f", "digest": "2",
                                                                                   "key": "k2"}},
            "gpu": {"x": {"digest": "d", "recorded": "d"}}, "errors": []}
    tree = {"members": {"a": {"family": "f", "digest": "1", "key": "k1"}, "new": {"family": "g", "digest": "3",
                                                                                  "key": "k3"}},
            "gpu": {"x": {"digest": "e", "recorded": "d"}}, "errors": ["family h: ImportError: x"]}
    d = KM.moved(base, tree)
    assert d["members"] == [("gone", "f", "2", None), ("new", "g", None, "3")]
    assert d["gpu"] == [("x", "d", "e", "d")] and d["errors"] == ["tree: family h: ImportError: x"] and d["of"] == 3
