"""Figures in the README and docs/ come from the measurement entries, never typed by hand.

A figure is a marked span, `<!-- fig:NAME -->246.6 s<!-- /fig -->`; NAME is a number's key in the
front matter of a measurement entry (docs/measurements/YYYY-MM-DD-<card>-<commit>-<what>.md). A bare
key takes the newest entry that records it (by date, then the entry's optional `time:` in UTC — an
entry without one counts as the day's start — then id); `ENTRY-ID#key` names one entry.

    python3 tools/figures.py --check   # exit 1 and list every span whose text differs from its entry
    python3 tools/figures.py --write   # rewrite those spans from the entries

A span naming no recorded number is an error in both modes. Text outside the spans is never read.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
ENTRIES = ROOT / "docs" / "measurements"
SPAN = re.compile(r"<!-- fig:([A-Za-z0-9_.#-]+) -->(.*?)<!-- /fig -->", re.S)
#: units written against the number, with no space
TIGHT = {"×", "%"}


def front_matter(path: Path) -> dict:
    """The YAML between the leading `---` lines of a markdown file, or ValueError."""
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n") or "\n---\n" not in text[4:]:
        raise ValueError(f"{path.relative_to(ROOT)}: no front matter (--- … ---)")
    data = yaml.safe_load(text[4:text.index("\n---\n", 4)])
    if not isinstance(data, dict):
        raise ValueError(f"{path.relative_to(ROOT)}: front matter is not a mapping")
    return data


def entries(root: Path | None = None) -> dict[str, dict]:
    """Every measurement entry by id (its file's stem)."""
    return {p.stem: front_matter(p) for p in sorted((root or ENTRIES).glob("*.md")) if p.name != "README.md"}


def render(number: dict) -> str:
    """A number's text: `text` where the entry gives one, else value and unit."""
    if "text" in number:
        return str(number["text"])
    v, unit = number["value"], number.get("unit", "")
    s = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
    return s + unit if unit in TIGHT or not unit else f"{s} {unit}"


def lookup(name: str, es: dict[str, dict]) -> str:
    """The text of figure NAME (a key, or ENTRY-ID#key), or KeyError."""
    if "#" in name:
        eid, key = name.split("#", 1)
        return render(es[eid]["numbers"][key])
    have = [(str(e["date"]), str(e.get("time", "00:00")), eid) for eid, e in es.items()
            if name in (e.get("numbers") or {})]
    if not have:
        raise KeyError(name)
    return render(es[max(have)[2]]["numbers"][name])


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def run(write: bool) -> list[str]:
    """Every span that differs (rewritten with write=True) or names nothing, as lines to print."""
    es, out = entries(), []
    for doc in documents():
        text = doc.read_text(encoding="utf-8")

        def one(m: re.Match) -> str:
            try:
                want = lookup(m.group(1), es)
            except KeyError:
                out.append(f"{doc.relative_to(ROOT)}: fig:{m.group(1)} names no recorded number")
                return m.group(0)
            if m.group(2) != want:
                out.append(f"{doc.relative_to(ROOT)}: fig:{m.group(1)} reads {m.group(2)!r}, the entry gives {want!r}")
            return f"<!-- fig:{m.group(1)} -->{want}<!-- /fig -->"
        new = SPAN.sub(one, text)
        if write and new != text:
            doc.write_text(new, encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail when a span differs from its entry")
    mode.add_argument("--write", action="store_true", help="rewrite the spans from the entries")
    args = ap.parse_args(argv)
    problems = run(write=args.write)
    for line in problems:
        print(line)
    unknown = [p for p in problems if "names no recorded number" in p]
    return 1 if (unknown or (problems and args.check)) else 0


if __name__ == "__main__":
    sys.exit(main())
