"""Re-aim every `file.py:N` pointer of docs/architecture.md at the line defining the name written
before it (what tests/test_architecture.py checks): run after code moves.

    python3 tools/fix_arch_pointers.py [--check]
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
POINTER = re.compile(r"`([\w/]+\.py):(\d+)`")


def defining_line(path: Path, name: str, near: int) -> int | None:
    """The line defining `name` nearest to `near` (a name defined twice, e.g. a protocol's method
    and its implementation, keeps the one the pointer was written for)."""
    found = [i for i, line in enumerate(path.read_text().splitlines(), 1)
             if re.match(rf"\s*(async\s+)?(def|class) {re.escape(name)}\b", line)]
    return min(found, key=lambda i: abs(i - near)) if found else None


def name_before(doc: str, start: int) -> str | None:
    names = [n for n in re.findall(r"`([\w.]+)(?:\([^`]*\))?`", doc[max(0, start - 200):start]) if not n.endswith(".py")]
    return names[-1].split(".")[-1] if names else None


def fixed(doc: str) -> tuple[str, list[str]]:
    out, pos, wrong = [], 0, []
    for m in POINTER.finditer(doc):
        name, path = name_before(doc, m.start()), ROOT / m[1]
        line = defining_line(path, name, int(m[2])) if name and path.exists() else None
        out.append(doc[pos:m.start()])
        if line is not None and line != int(m[2]):
            wrong.append(f"{m[0]} ({name}) -> {line}")
        out.append(f"`{m[1]}:{line if line is not None else m[2]}`")
        pos = m.end()
    out.append(doc[pos:])
    return "".join(out), wrong


def main() -> int:
    new, wrong = fixed(DOC.read_text())
    if "--check" in sys.argv:
        print("\n".join(wrong) or "every pointer is at its name's definition")
        return 1 if wrong else 0
    DOC.write_text(new)
    print(f"{len(wrong)} pointers re-aimed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
