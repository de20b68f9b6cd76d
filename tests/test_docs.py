"""The reference docs hold together: what they point at exists, and their figures are the data's.

Guards, over README.md and every page under docs/ (docs/data/ excluded):
* every relative markdown link names a file of the tree, and every `#anchor` a heading of its page;
* every code pointer `path::Symbol` (in backticks) names a tracked file that defines Symbol (a class,
  function or assignment; `Class.method` for members), and every backticked repository path exists;
* every decision record has its front matter: a status (current, open, superseded-by NNNN naming a
  record), applies-to symbols that resolve, evidence ids that are measurement entries;
* every measurement entry has date, commit, card, command, data (files that exist) and numbers with
  units, and its file name is its date, card and commit;
* every figure span equals what `tools/figures.py` computes from the entries (`--check`).
Prose outside the figure spans is never asserted.
"""
from __future__ import annotations

import ast
import re
import subprocess
import sys
import unicodedata
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import figures  # noqa: E402

TOP = ("autotune/", "tactics/", "cache/", "tests/", "tools/", "bench/", "docs/", ".ci/", ".github/")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
POINTER = re.compile(r"`([\w./-]+\.(?:py|cu|cuh|md|json|sh|toml|cfg))::([\w.]+)`")
PATH = re.compile(r"`((?:%s)[\w./-]*)`" % "|".join(re.escape(t) for t in TOP))


def _pages() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.md") if "data" not in p.relative_to(ROOT / "docs").parts[:1]]
    return [ROOT / "README.md", *sorted(docs)]


def _strip_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    h = re.sub(r"<[^>]+>", "", heading).strip().lower()
    h = "".join(c for c in h if c in " -_" or unicodedata.category(c)[0] in "LN")
    return h.replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _strip_code_blocks(page.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return frozenset(out)


@lru_cache(maxsize=None)
def _defined(path: str) -> frozenset[str]:
    """Qualified names a Python file defines: top-level classes, functions and assignments, and
    Class.member for what a class body defines."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    out: set[str] = set()

    def names(node, prefix: str) -> None:
        for n in ast.iter_child_nodes(node):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(prefix + n.name)
                if isinstance(n, ast.ClassDef):
                    names(n, prefix + n.name + ".")
            elif isinstance(n, ast.Assign):
                for t in n.targets:
                    for e in ast.walk(t):
                        if isinstance(e, ast.Name):
                            out.add(prefix + e.id)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                out.add(prefix + n.target.id)
    names(tree, "")
    return frozenset(out)


def resolve(pointer: str) -> str | None:
    """None when `path::Symbol` (or a bare path) names something of the tree, else why not."""
    path, _, sym = pointer.partition("::")
    if not (ROOT / path).exists():
        return f"{path}: no such file"
    if sym:
        if not path.endswith(".py"):
            return f"{pointer}: a symbol pointer needs a Python file"
        if sym not in _defined(path):
            return f"{pointer}: {path} does not define {sym}"
    return None


def front_matter(path: Path) -> dict:
    return figures.front_matter(path)


def test_every_link_and_anchor_resolves():
    bad = []
    for page in _pages():
        text = re.sub(r"`[^`\n]*`", "", _strip_code_blocks(page.read_text(encoding="utf-8")))
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):         # http:, https:, mailto:
                continue
            file, _, frag = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{page.relative_to(ROOT)}: {target}: no heading #{frag}")
    assert not bad, "\n".join(bad)


def test_every_code_pointer_and_path_resolves():
    bad = []
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for path, sym in POINTER.findall(text):
            if (why := resolve(f"{path}::{sym}")):
                bad.append(f"{page.relative_to(ROOT)}: {why}")
        for path in PATH.findall(text):
            if any(c in path for c in "*{<") or path.endswith("/..."):
                continue
            if (why := resolve(path.rstrip("."))):
                bad.append(f"{page.relative_to(ROOT)}: {why}")
    assert not bad, "\n".join(bad)


def test_no_pointer_names_a_line():
    """Code is pointed at by symbol (`path::Name`), never by line number: an edit moves lines."""
    rx = re.compile(r"\b[\w/.-]+\.(?:py|cu|cuh):\d+\b")
    bad = [f"{page.relative_to(ROOT)}: {m}" for page in _pages() for m in rx.findall(page.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)


def _decisions() -> list[Path]:
    return sorted(p for p in (ROOT / "docs" / "decisions").glob("*.md") if p.name != "README.md")


def test_decision_records_point_at_code_and_evidence_that_exist():
    es = figures.entries()
    numbers = {p.name[:4] for p in _decisions()}
    bad = []
    for p in _decisions():
        if not re.fullmatch(r"\d{4}-[a-z0-9-]+\.md", p.name):
            bad.append(f"{p.name}: not NNNN-title.md")
        fm = front_matter(p)
        status = str(fm.get("status", ""))
        m = re.fullmatch(r"superseded-by (\d{4})", status)
        if status not in ("current", "open") and not m:
            bad.append(f"{p.name}: status {status!r}")
        if m and m.group(1) not in numbers:
            bad.append(f"{p.name}: superseded by {m.group(1)}, which is no record")
        if not fm.get("revisit-when"):
            bad.append(f"{p.name}: no revisit-when")
        for sym in fm.get("applies-to") or [bad.append(f"{p.name}: no applies-to")] or []:
            if (why := resolve(str(sym))):
                bad.append(f"{p.name}: {why}")
        for eid in fm.get("evidence") or [bad.append(f"{p.name}: no evidence")] or []:
            if eid not in es:
                bad.append(f"{p.name}: evidence {eid} is no measurement entry")
    assert not bad, "\n".join(bad)


def test_measurement_entries_are_complete_and_named_by_date_card_commit():
    bad = []
    for eid, fm in figures.entries().items():
        for key in ("date", "commit", "card", "command", "data", "numbers"):
            if key not in fm:
                bad.append(f"{eid}: no {key}")
        if bad:
            continue
        if not eid.startswith(f"{fm['date']}-") or f"-{fm['commit']}-" not in eid:
            bad.append(f"{eid}: the name is not YYYY-MM-DD-<card>-<commit>-<what> of its front matter")
        for f in fm["data"]:
            if not (ROOT / f).exists():
                bad.append(f"{eid}: data {f} does not exist")
        for k, n in fm["numbers"].items():
            if not isinstance(n, dict) or "value" not in n or "unit" not in n:
                bad.append(f"{eid}: number {k} needs a value and a unit")
    assert not bad, "\n".join(bad)


def test_figure_spans_equal_the_measurements():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "figures.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_figures_check_fails_only_on_a_span_that_differs(tmp_path, monkeypatch):
    """--check flags a span whose text differs from its entry and nothing else; --write fixes it."""
    (tmp_path / "docs" / "measurements").mkdir(parents=True)
    (tmp_path / "docs" / "measurements" / "2026-01-02-cpu-abc1234-x.md").write_text(
        "---\ndate: 2026-01-02\ncommit: abc1234\ncard: cpu\ncommand: x\ndata: []\n"
        "numbers:\n  wall: {value: 1.5, unit: s}\n---\n")
    (tmp_path / "README.md").write_text("took <!-- fig:wall -->1.5 s<!-- /fig --> and 9.9 s in prose\n")
    monkeypatch.setattr(figures, "ROOT", tmp_path)
    monkeypatch.setattr(figures, "ENTRIES", tmp_path / "docs" / "measurements")
    assert figures.main(["--check"]) == 0
    (tmp_path / "README.md").write_text("took <!-- fig:wall -->2 s<!-- /fig -->\n")
    assert figures.main(["--check"]) == 1
    assert figures.main(["--write"]) == 0
    assert "<!-- fig:wall -->1.5 s<!-- /fig -->" in (tmp_path / "README.md").read_text()
    (tmp_path / "README.md").write_text("<!-- fig:nothing -->1<!-- /fig -->\n")
    assert figures.main(["--write"]) == 1


def test_a_bare_key_reads_the_day_s_latest_entry_by_time_not_by_commit_hash():
    """Two entries of one day: the one with the later `time:` wins, whatever its id; an entry without
    a time counts as the day's start."""
    def entry(eid, value, time=None):
        return {"date": "2026-01-02", "numbers": {"wall": {"value": value, "unit": "s"}},
                **({"time": time} if time else {})}
    es = {"2026-01-02-cpu-fff0000-x": entry("f", 1.0), "2026-01-02-cpu-0000000-x": entry("0", 2.0, "09:30")}
    assert figures.lookup("wall", es) == "2.0 s"
    es["2026-01-02-cpu-aaa0000-x"] = entry("a", 3.0, "17:05")
    assert figures.lookup("wall", es) == "3.0 s"


@pytest.mark.parametrize("heading, anchor", [
    ("How FP4MoE serves a layer", "how-fp4moe-serves-a-layer"),
    ("`--batch-invariant`", "--batch-invariant"),
    ("The shared expert: folded or apart", "the-shared-expert-folded-or-apart"),
])
def test_anchor_rule_is_github_s(heading, anchor):
    """Anchors are computed as GitHub renders them, so a link that works here works on GitHub."""
    assert slug(heading) == anchor
