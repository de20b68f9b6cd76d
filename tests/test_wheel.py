"""The built wheel installs only names under `autotune` (autotune.tactics, autotune.cache,
autotune.cli; no top-level tactics/cache/cli) and works from outside the repository next to
decoy modules with those generic names (docs/architecture.md, "Import names")."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SKIP = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "*.db")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """(the wheel, the folder it is installed into), built once from a copy of the tree (the
    build writes build/ and *.egg-info next to setup.cfg: not into the checkout under test)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=SKIP)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp / "dist").glob("fp4_autotune-*.whl")
    target = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q",
                    "--target", str(target), str(wheel)], check=True, capture_output=True, timeout=600)
    return wheel, target


def test_wheel_holds_only_the_autotune_namespace(installed):
    wheel, target = installed
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"autotune"}, tops
    for f in ("autotune/tactics/registry.py", "autotune/cache/store.py", "autotune/cli.py",
              "autotune/tactics/cutlass/smem_truth.json", "autotune/tactics/cuda/w4a16_mma.cu"):
        assert f in names, f
    shipped = sorted(p.name for p in (ROOT / "autotune" / "engine" / "strategies" / "ranked" / "rank_models").iterdir())
    assert shipped and all(f"autotune/engine/strategies/ranked/rank_models/{n}" in names for n in shipped)   # the rank models
    # the links are followed: files, not links, in the wheel and once installed
    assert not (target / "autotune" / "tactics").is_symlink()
    assert "def main" in (target / "autotune" / "cli.py").read_text()
    assert not {"tactics", "cache", "cli", "cli.py"} & {p.name for p in target.iterdir()}
    (info,) = target.glob("fp4_autotune-*.dist-info")
    assert (info / "top_level.txt").read_text().split() == ["autotune"]
    assert "autotune = autotune.cli:main" in (info / "entry_points.txt").read_text()


PROBE = """
import json, sys
import autotune.tactics, autotune.cache, autotune.cli
from autotune.tactics import registry
from autotune.cache import Store
import cache, tactics, cli                     # the decoys beside the script
print(json.dumps({"tactics": autotune.tactics.__file__, "cache": autotune.cache.__file__,
                  "cli": autotune.cli.__file__, "registry": registry.__file__,
                  "decoys": [cache.DECOY, tactics.DECOY, cli.DECOY],
                  "families": registry.FAMILIES["torch"], "store": Store.__module__}))
"""


def test_installed_names_resolve_outside_the_repository_beside_decoys(installed, tmp_path):
    _, target = installed
    for name in ("cache", "tactics", "cli"):
        (tmp_path / f"{name}.py").write_text(f"DECOY = {name!r}\n")
    (tmp_path / "probe.py").write_text(PROBE)
    # the script's folder (with the decoys) comes first on sys.path, then the installed wheel;
    # the editable install of the repository (if any) comes after both
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([sys.executable, "probe.py"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(r.stdout.splitlines()[-1])
    for key in ("tactics", "cache", "cli", "registry"):
        assert Path(got[key]).is_relative_to(target), (key, got[key])
    assert got["decoys"] == ["cache", "tactics", "cli"]
    assert got["families"] == "autotune.tactics.torch_ref:TorchFamily"
    assert got["store"] == "autotune.cache.store"


def test_console_script_runs_from_the_wheel(installed, tmp_path):
    _, target = installed
    (tmp_path / "cli.py").write_text("raise SystemExit('the decoy ran')\n")
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([str(target / "bin" / "autotune"), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "search" in r.stdout and "cache" in r.stdout
