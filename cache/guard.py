"""The check every SQLite cache file gets before anything reads its rows (import, merge, show,
report, the Dispatcher's cache, a search's own cache): a plain schema, bounded work.

A file from outside can hold SQL that runs when it is read: a VIEW named `winners` that recurses
forever (and fills the temp directory), a trigger, a virtual table backed by a module, a generated
column. So before SQLAlchemy or a signature check touches a row, `check_plain` opens the file
read-only through the standard library with SQLite limits set low and a progress handler
counting the virtual machine's steps, and requires:

  * no view, trigger or virtual table; no table or column an fp4-autotune schema never had
    (`autotune.cache.schema`'s tables, each column of a file a subset of the current one: older schemas
    only lack columns), no hidden or generated column;
  * at most MAX_ROWS rows per table (counted with a LIMIT, so the count itself is bounded).

Every refusal is one CacheError line naming the file and what was found. `bound_connection`
puts the same step budget on each statement a read-only Store runs afterwards.
"""
from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

from autotune.cache.files import CacheError

#: rows per table a cache file may hold (a large search stores ~1e5 trials; this is 50x that)
MAX_ROWS = 5_000_000
#: virtual-machine steps one statement may take (a full read of a MAX_ROWS table takes ~1e9)
MAX_STEPS = 4_000_000_000
#: the progress handler runs every this many steps
STEP = 10_000
#: SQLite limits on the checking connection: nothing a plain cache needs comes near them
LIMITS = {
    "SQLITE_LIMIT_LENGTH": 16 << 20,          # bytes of one string or blob (a row value)
    "SQLITE_LIMIT_SQL_LENGTH": 1 << 20,       # bytes of one statement, schema entries included
    "SQLITE_LIMIT_COLUMN": 64,
    "SQLITE_LIMIT_EXPR_DEPTH": 64,
    "SQLITE_LIMIT_COMPOUND_SELECT": 8,
    "SQLITE_LIMIT_FUNCTION_ARG": 8,
    "SQLITE_LIMIT_ATTACHED": 0,
    "SQLITE_LIMIT_LIKE_PATTERN_LENGTH": 256,
    "SQLITE_LIMIT_TRIGGER_DEPTH": 1,
}
#: tables SQLite keeps itself (AUTOINCREMENT, ANALYZE)
_INTERNAL = {"sqlite_sequence", "sqlite_stat1", "sqlite_stat2", "sqlite_stat3", "sqlite_stat4"}


def expected() -> dict[str, set[str]]:
    """Table -> columns of the current schema (autotune.cache.schema): what a file may hold at most."""
    from autotune.cache.schema import Base
    return {t.name: {c.name for c in t.columns} for t in Base.metadata.sorted_tables}


class _Budget:
    """A progress handler: aborts the running statement once it has taken `steps` VM steps."""

    def __init__(self, steps: int):
        self.left, self.steps, self.spent = steps // STEP, steps, False

    def reset(self) -> None:
        self.left = self.steps // STEP

    def __call__(self) -> int:
        self.left -= 1
        if self.left < 0:
            self.spent = True
            return 1            # nonzero: SQLite interrupts the statement
        return 0


def bound_connection(dbapi_conn, steps: int | None = None) -> _Budget:
    """Put a per-statement step budget on a sqlite3 connection (the caller resets it per statement)."""
    b = _Budget(MAX_STEPS if steps is None else steps)
    dbapi_conn.set_progress_handler(b, STEP)
    return b


def _uri(path: Path, immutable: bool) -> str:
    return f"file:{quote(str(path))}?mode=ro" + ("&immutable=1" if immutable else "")


def check_plain(path: str | Path, immutable: bool = False, *, max_rows: int | None = None,
                max_steps: int | None = None) -> None:
    """Refuse (CacheError, one line) a SQLite file whose schema is not a plain fp4-autotune cache
    or whose tables are larger than max_rows. Reads the schema and bounded counts only."""
    path = Path(path)
    max_rows = MAX_ROWS if max_rows is None else max_rows
    try:
        conn = sqlite3.connect(_uri(path, immutable), uri=True, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as e:
        raise CacheError(f"cannot open cache {path}: {e}") from None
    budget = bound_connection(conn, MAX_STEPS if max_steps is None else max_steps)
    try:
        for name, value in LIMITS.items():
            conn.setlimit(getattr(sqlite3, name), value)
        try:
            _check(conn, path, max_rows, budget)
        except sqlite3.Error as e:
            if budget.spent:
                raise CacheError(f"{path} is not an fp4-autotune cache: reading its schema took more than "
                                 f"{budget.steps:,} SQLite steps") from None
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise CacheError(f"{path} is not an fp4-autotune cache: {msg}") from None
        except UnicodeDecodeError as e:     # a damaged schema: sqlite3 decodes its text as UTF-8
            raise CacheError(f"{path} is not an fp4-autotune cache: its schema is not UTF-8 text "
                             f"({e.reason} at byte {e.start}; a damaged file)") from None
    finally:
        conn.close()


def _check(conn: sqlite3.Connection, path: Path, max_rows: int, budget: _Budget) -> None:
    entries = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
    want = expected()
    tables = [(n, sql) for t, n, _, sql in entries if t == "table"]
    if tables and "schema_version" not in {n for n, _ in tables}:
        names = sorted(n for n, _ in tables)
        raise CacheError(f"{path} is not an fp4-autotune cache: no schema_version table (has {', '.join(names[:5])})")
    for kind, name, tbl, sql in entries:
        if kind in ("view", "trigger"):
            raise CacheError(f"{path} is not a plain fp4-autotune cache: it has a {kind} {name!r} (SQL that runs "
                             "when the file is read or written); refused")
        if kind == "table" and (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise CacheError(f"{path} is not a plain fp4-autotune cache: {name!r} is a virtual table; refused")
        if kind == "table" and name not in want and name not in _INTERNAL:
            raise CacheError(f"{path} is not a plain fp4-autotune cache: it has a table {name!r} no fp4-autotune "
                             "schema has; refused")
        if kind == "index" and tbl not in want:
            raise CacheError(f"{path} is not a plain fp4-autotune cache: index {name!r} on {tbl!r}; refused")
    for name, _ in tables:
        if name in _INTERNAL:
            continue
        budget.reset()
        cols = conn.execute(f'PRAGMA table_xinfo("{name}")').fetchall()   # name is one of ours: no quoting issue
        extra = sorted(c[1] for c in cols if c[1] not in want[name])
        hidden = sorted(c[1] for c in cols if c[6] != 0)
        if extra:
            raise CacheError(f"{path} is not a plain fp4-autotune cache: table {name!r} has column(s) "
                             f"{', '.join(map(repr, extra[:3]))} no fp4-autotune schema has; refused")
        if hidden:
            raise CacheError(f"{path} is not a plain fp4-autotune cache: table {name!r} has hidden or generated "
                             f"column(s) {', '.join(map(repr, hidden[:3]))}; refused")
        budget.reset()
        n = conn.execute(f'SELECT count(*) FROM (SELECT 1 FROM "{name}" LIMIT ?)', (max_rows + 1,)).fetchone()[0]
        if n > max_rows:
            raise CacheError(f"{path} is not an fp4-autotune cache this build reads: table {name!r} has more than "
                             f"{max_rows:,} rows (the limit is autotune.cache.guard.MAX_ROWS)")
