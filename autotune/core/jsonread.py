"""JSON from outside (config.json, import files, rank models, rows of a cache), bounded in size and
depth, every failure one line naming where it came from.

The standard decoder recurses once per nesting level: a file of 100 000 `[` raises RecursionError
(a traceback, not a message), and integers past 4300 digits raise a ValueError that names neither
the file nor the field. Here the text is size-checked before parsing, the depth is checked on the
result (iteratively), and an integer too long to be a size parses as `HugeInt` so the field's own
check can name it.
"""
from __future__ import annotations

import json
from typing import Any

#: nesting no file of ours comes near (exports: 4, config.json: ~5)
MAX_DEPTH = 64
#: digits of an integer kept as an int (int64 has 19); longer ones become HugeInt, never converted
MAX_INT_DIGITS = 100


class JSONLimitError(ValueError):
    """JSON that is not valid, too large or too deep: one line naming its source."""


class HugeInt(str):
    """An integer literal too long to be any size (kept as its digits, never converted)."""

    def __repr__(self) -> str:
        return f"a {len(self.lstrip('-'))}-digit integer"


def _int(s: str) -> int | HugeInt:
    return HugeInt(s) if len(s.lstrip("-")) > MAX_INT_DIGITS else int(s)


def depth(doc: Any, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of a parsed document (a scalar is 0), counting no further than limit + 1."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        if d > limit:
            return d
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def loads(text: str | bytes, src: str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `text` from `src` (a path or a name for messages); JSONLimitError for anything wrong."""
    if len(text) > max_bytes:
        size = f"{max_bytes >> 20} MiB" if max_bytes >= 1 << 20 and not max_bytes % (1 << 20) else f"{max_bytes:,} bytes"
        raise JSONLimitError(f"{src}: larger than {size}; refused")
    try:
        doc = json.loads(text, parse_int=_int)
    except RecursionError:
        raise JSONLimitError(f"{src}: JSON nested deeper than {max_depth} levels; refused") from None
    except json.JSONDecodeError as e:
        raise JSONLimitError(f"{src}: not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise JSONLimitError(f"{src}: not valid JSON ({str(e).splitlines()[0][:120]})") from None
    if depth(doc, max_depth) > max_depth:
        raise JSONLimitError(f"{src}: JSON nested deeper than {max_depth} levels; refused")
    return doc


def read(path, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """`loads` of a file, reading at most max_bytes + 1 bytes (a device file never ends)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise JSONLimitError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise JSONLimitError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    return loads(text, str(path), max_bytes=max_bytes, max_depth=max_depth)
