"""The repository speaks of the software, not of the rounds of work that made it.

Guards: no tracked file (code, docs, tests, data names) labels anything by a round of work — an
ordinal word before "session"/"round" ("the fourteenth session"), "session N", "this session",
a "part N" citation of a document ("moe-decode.md part 13"), or an ordinal round word in a file
name ("main-job-h100-nineteenth.db.xz"). Dates (2026-12-07) and commits (f4cc350) say when.
Ordinary English ("the first round of halving" is not one: "first round" is flagged, so such text
says "the first halving round") stays out of the patterns or on ALLOWED, a short reviewed list
whose every entry must still match something (test_each_allowed_entry_still_matches).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_ORD = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|"
        "fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\\d+(?:st|nd|rd|th)")
#: what a round label looks like in a file's text
TEXT = {
    "ordinal round": re.compile(rf"\b(?:{_ORD})[- ](?:session|round)s?\b", re.I),
    "session N": re.compile(r"\bsessions? \d+\b", re.I),
    "this session": re.compile(r"\b(?:this|next|last|previous|same) session\b", re.I),
    "part N of a doc": re.compile(r"\bparts? \d+(?:[–-]\d+)?\b(?![\^.]\d| ?[x×%])", re.I),
}
#: an ordinal round word in a tracked path (first/second are ordinary names: tests/strategies/first.py)
NAME = re.compile(r"(?<![a-z])(?:third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
                  r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth)"
                  r"(?![a-z])", re.I)

#: (path prefix, pattern the hit's line must match, why it stays). Reviewed; keep it short.
ALLOWED: list[tuple[str, str, str]] = [
    ("tests/data/cuda_base/", r"docs/moe-decode\.md part|// part \d+\)", "the kernel texts of f4cc350 as they "
                              "were, the base tools/cuda_sass_same.py and tests/test_cuda_base_gpu.py build"),
    ("tests/test_round_labels.py", r".", "this test spells the patterns it looks for"),
]


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def _allowed(path: str, line: str) -> bool:
    return any(path.startswith(pre) and re.search(pat, line) for pre, pat, _ in ALLOWED)


def _hits(paths: list[str]) -> list[tuple[str, str, str]]:
    """(path, what, the line) for every round label in these files' text and names."""
    hits = []
    for path in paths:
        if NAME.search(path):
            hits.append((path, "ordinal word in a file name", path))
        try:
            text = (ROOT / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue                    # binary (caches, pictures): only its name is text
        for line in text.splitlines():
            for what, rx in TEXT.items():
                if rx.search(line):
                    hits.append((path, what, line.strip()[:160]))
    return hits


def test_no_tracked_file_counts_the_work_s_rounds():
    bad = [h for h in _hits(_tracked()) if not _allowed(h[0], h[2])]
    assert not bad, "round labels (use a date and a commit):\n" + "\n".join(f"{p}: {w}: {l}" for p, w, l in bad)


def test_each_allowed_entry_still_matches():
    """An allow-list entry that no longer matches anything is stale: remove it."""
    hits = _hits(_tracked())
    stale = [(pre, pat) for pre, pat, _ in ALLOWED
             if not any(p.startswith(pre) and re.search(pat, line) for p, _, line in hits)]
    assert not stale, f"allow-list entries that match nothing: {stale}"


def test_the_patterns_catch_what_they_are_for():
    """The patterns flag the labels they exist for and leave ordinary English alone."""
    flagged = ["the fourteenth session's run", "in the 19th round", "session 12", "no device time this session",
               "docs/moe-decode.md part 13", "see parts 16–17"]
    ordinary = ["the first call compiles", "a second pass over the rows", "the SQLAlchemy session is closed",
                "rounds that halve the field", "part of every code key", "every part 10^4 x slower",
                "the measuring part 2.0× faster"]
    for s in flagged:
        assert any(rx.search(s) for rx in TEXT.values()), s
    for s in ordinary:
        assert not any(rx.search(s) for rx in TEXT.values()), s
    assert NAME.search("docs/data/main-job-h100-nineteenth.db.xz") and not NAME.search("tests/strategies/first.py")
