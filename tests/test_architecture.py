"""The layers of docs/architecture.md, enforced: import contracts, an acyclic import graph (with
function-local imports counted), what importing the runtime and the cache loads, module size."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("autotune",)         # autotune.tactics, autotune.cache and autotune.cli included
MAX_LINES = 500


def test_import_contracts_hold():
    r = subprocess.run(["lint-imports", str(ROOT / ".importlinter"), "--no-cache"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout
    # the CLI is inside the contracts: on top of the layers, and kept off families and the runtime
    assert "the CLI on top" in r.stdout and "The CLI parses" in r.stdout


def _sccs(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_import_graph_is_acyclic():
    # grimp reads every import statement, function-local ones included
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    assert _sccs(graph) == []


def test_sccs_finds_a_cycle():
    grimp = pytest.importorskip("grimp")
    g = grimp.ImportGraph()
    for a, b in (("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")):
        g.add_import(importer=a, imported=b)
    assert _sccs(g) == [["a", "b", "c"]]


def _loaded_after(stmt: str, block_torch: bool = False) -> set[str]:
    code = ("import sys\n" + ("sys.modules['torch'] = None\n" if block_torch else "") + stmt +
            "\nimport json; print(json.dumps(sorted(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(r.stdout.splitlines()[-1]))


ENGINE = ("autotune.engine", "autotune.api", "autotune.integrations", "autotune.report")


@pytest.mark.parametrize("stmt", ["import autotune.runtime.dispatch", "import autotune.runtime.nn",
                                  "from autotune import dispatch, FP4Linear"])
def test_runtime_loads_no_engine_module(stmt):
    loaded = _loaded_after(stmt)
    assert "autotune.runtime.dispatch" in loaded
    assert sorted(m for m in loaded if m.startswith(ENGINE)) == []


def test_cache_loads_neither_torch_nor_families():
    loaded = _loaded_after("from autotune import cache; from autotune.cache import Store", block_torch=True)
    assert "autotune.cache.store" in loaded
    # torch is blocked (a None entry in sys.modules): any import of it would have raised
    assert sorted(m for m in loaded if m.startswith(("autotune.tactics", "torch.", "triton") + ENGINE)) == []


def test_import_autotune_is_lazy():
    loaded = _loaded_after("import autotune")
    assert sorted(m for m in loaded if m.startswith(("autotune.", "tactics", "cache", "cli", "torch"))) == []


def test_lazy_names_resolve():
    import autotune
    from autotune.api import search
    from autotune.runtime.dispatch import dispatch
    assert autotune.search is search and autotune.dispatch is dispatch
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        autotune.nope  # noqa: B018


def _modules():
    for top in ("autotune", "tactics", "cache", "tools", "bench"):     # rglob does not follow the links
        yield from (ROOT / top).rglob("*.py")
    yield ROOT / "cli.py"


def test_no_module_exceeds_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_module_has_one_line_in_the_module_table():
    """docs/architecture.md's module table names every module of autotune/, tactics/ and cache/ (one
    line of responsibility each) and no module that does not exist."""
    import re
    import subprocess
    doc = (ROOT / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## Modules"):]
    rows = re.findall(r"^\| `([\w/.]+\.py)` \| (.+?) \|$", table, re.M)
    named = [r[0] for r in rows]
    assert len(named) == len(set(named)), "a module is listed twice"
    assert all(r[1].strip() for r in rows), "a row without a responsibility"
    tracked = subprocess.run(["git", "ls-files", "autotune/*.py", "tactics/*.py", "cache/*.py"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    assert sorted(set(tracked) - set(named)) == [], "modules missing from docs/architecture.md's module table"
    assert sorted(set(named) - set(tracked)) == [], "rows of docs/architecture.md naming no module"
