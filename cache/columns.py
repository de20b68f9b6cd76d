"""The cache's columns, derived once from the record dataclasses (autotune.core.records).

Every reader and writer of a trial, winner or miss row takes its column names from here: the Store
(what it writes and selects), the export format (what a payload carries and what an entry must
hold), the row checks (which fields must be text) and the ORM (its keys); tests/test_cache_columns.py
checks that the ORM's tables hold exactly these columns. A new column is a field of the record
(`added(since, default)` in core/records.py), its `mapped_column` in cache/schema.py and a
migration step (cache/migrations.py); nothing else names it.
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any

from autotune.core.records import FIRST_FORM, Miss, Trial, Winner


@dataclass(frozen=True)
class Column:
    """One column of a record's table."""

    name: str
    since: int          # the schema (and export form) that added it
    default: Any        # what a cache or export of an older form loads it as (MISSING: none)
    text: bool          # declared `str`: a row holding anything else is malformed

    def present_in(self, schema: int) -> bool:
        """Whether a cache or export of `schema` has this column."""
        return schema >= self.since

    @property
    def required(self) -> bool:
        """Whether every export must carry it (a column of the first form); a later one is left
        out while it holds its default, so a row's payload from before the column is unchanged."""
        return self.since <= FIRST_FORM


def columns_of(record: type) -> tuple[Column, ...]:
    """The stored columns of a record class, in field order (joined fields left out)."""
    out = []
    for f in fields(record):
        if f.metadata.get("joined"):
            continue
        out.append(Column(f.name, f.metadata.get("since", FIRST_FORM), f.default, f.type == "str"))
    return tuple(out)


def names(cols: tuple[Column, ...]) -> tuple[str, ...]:
    return tuple(c.name for c in cols)


TRIAL = columns_of(Trial)
WINNER = columns_of(Winner)
MISS = columns_of(Miss)

#: the keys of each table (the ORM declares them from these)
TRIAL_KEY = ("problem_key", "bucket", "tactic_id", "device_key", "lib_key", "code_key")
WINNER_KEY = ("problem_key", "bucket", "device_key")
MISS_KEY = ("problem_key", "m", "device_key")
#: columns a table holds beyond its record's (row bookkeeping, never part of a record)
TRIAL_EXTRA = ("id", "created_at")
WINNER_EXTRA = ("updated_at",)
MISS_EXTRA: tuple[str, ...] = ()


def to_row(record: Any, cols: tuple[Column, ...]) -> dict:
    """The column values of a record."""
    return {c.name: getattr(record, c.name) for c in cols}


def export_dict(record: Any, cols: tuple[Column, ...]) -> dict:
    """A record as an export carries it: every column of the first form, a later one only when it
    differs from its default (see Column.required)."""
    return {c.name: v for c in cols for v in (getattr(record, c.name),) if c.required or v != c.default}


def from_export(entry: dict, cols: tuple[Column, ...]) -> dict | None:
    """The column values of an export entry (a later column absent: its default), or None when a
    required one is missing."""
    if not all(c.name in entry for c in cols if c.required):
        return None
    return {c.name: entry[c.name] if c.name in entry else c.default for c in cols}


for _cols in (TRIAL, WINNER, MISS):          # a later column must say what older rows load it as
    for _c in _cols:
        if not _c.required and _c.default is MISSING:
            raise TypeError(f"column {_c.name} added by schema {_c.since} has no default")
