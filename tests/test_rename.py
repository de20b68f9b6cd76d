"""tools/rename_namespace.py: what it rewrites, what it leaves alone, a second run changes
nothing, and this tree needs no rewrite (nothing imports the old top-level names)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "rename_namespace.py"

BEFORE = {
    "autotune/__init__.py": "",
    "tactics/__init__.py": "",
    "tactics/registry.py": 'FAMILIES = {"torch": "tactics.torch_ref:TorchFamily"}\n',
    "tactics/torch_ref.py": "from tactics.base import FamilyBase\n",
    "tactics/base.py": "",
    "cache/__init__.py": "from cache.store import Store\n__all__ = ['Store']\n",
    "cache/store.py": "",
    "cache/rows.py": "",
    "cli.py": "def main(): pass\n",
    "app.py": ('import cache\n'
               'import cache as c\n'
               'from cli import main\n'
               'from tactics import registry  # the families\n'
               'PATCH = "cache.store.Store"      # cache.store, see cache.Store\n'
               'DB = "cache.db"; t = tactics.get(1); cache.store.close()\n'
               'CMD = [sys.executable, "-m", "cli", "show"]\n'
               'CODE = "import cache; s = cache.Store(p)"\n'
               'print("a cache of tactics: cache.db, tactics/base.py, cli.py")\n'),
    "run.sh": 'python3 -m cli search\npython3 -c "from tactics import registry; print(1)"\n',
    "doc.md": "Rows pass `cache.rows`; a family subclasses `tactics.base.FamilyBase`; `cache.Store`.\n",
    "setup.cfg": ("[options]\npackages = find:\npy_modules = cli\n\n[options.packages.find]\ninclude =\n"
                  "    autotune\n    autotune.*\n    tactics\n    tactics.*\n    cache\n    cache.*\n\n"
                  "[options.entry_points]\nconsole_scripts =\n    autotune = cli:main\n"),
    ".importlinter": ("[importlinter]\nroot_packages =\n    autotune\n    tactics\n    cache\n\n"
                      "[importlinter:contract:c]\nname = The cache imports core only\nlayers =\n"
                      "    cache\n    tactics | autotune.models\n"),
}

AFTER = {
    "tactics/registry.py": 'FAMILIES = {"torch": "autotune.tactics.torch_ref:TorchFamily"}\n',
    "tactics/torch_ref.py": "from autotune.tactics.base import FamilyBase\n",
    "cache/__init__.py": "from autotune.cache.store import Store\n__all__ = ['Store']\n",
    "app.py": ('from autotune import cache\n'
               'from autotune import cache as c\n'
               'from autotune.cli import main\n'
               'from autotune.tactics import registry  # the families\n'
               'PATCH = "autotune.cache.store.Store"      # autotune.cache.store, see autotune.cache.Store\n'
               'DB = "cache.db"; t = tactics.get(1); cache.store.close()\n'
               'CMD = [sys.executable, "-m", "autotune.cli", "show"]\n'
               'CODE = "from autotune import cache; s = cache.Store(p)"\n'
               'print("a cache of tactics: cache.db, tactics/base.py, cli.py")\n'),
    "run.sh": ('python3 -m autotune.cli search\n'
               'python3 -c "from autotune.tactics import registry; print(1)"\n'),
    "doc.md": ("Rows pass `autotune.cache.rows`; a family subclasses `autotune.tactics.base.FamilyBase`; "
               "`autotune.cache.Store`.\n"),
    "setup.cfg": ("[options]\npackages = find:\n\n[options.packages.find]\ninclude =\n"
                  "    autotune\n    autotune.*\n\n"
                  "[options.entry_points]\nconsole_scripts =\n    autotune = autotune.cli:main\n"),
    ".importlinter": ("[importlinter]\nroot_packages =\n    autotune\n\n"
                      "[importlinter:contract:c]\nname = The cache imports core only\nlayers =\n"
                      "    autotune.cache\n    autotune.tactics | autotune.models\n"),
}


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), str(root), *args], capture_output=True, text=True,
                          timeout=120)


def test_rewrites_imports_and_module_paths_only_and_is_idempotent(tmp_path):
    for rel, text in BEFORE.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert _run(tmp_path, "--check").returncode == 1
    assert _run(tmp_path).returncode == 0
    for rel, text in BEFORE.items():
        assert (tmp_path / rel).read_text() == AFTER.get(rel, text), rel
    for link, target in (("tactics", "../tactics"), ("cache", "../cache"), ("cli.py", "../cli.py")):
        assert str((tmp_path / "autotune" / link).readlink()) == target
    r = _run(tmp_path)                     # the second run changes nothing
    assert r.returncode == 0 and r.stdout == "", r.stdout
    assert _run(tmp_path, "--check").returncode == 0


def test_this_tree_imports_no_old_top_level_name():
    r = _run(ROOT, "--check")
    assert r.returncode == 0, r.stdout
