"""The connection every table of the Store shares: opening (and upgrading) a cache, short write
transactions retried on "database is locked", reads, and selecting a record's columns from a file
of any schema (a column newer than the file reads as its default)."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Callable, TypeVar
from urllib.parse import quote

from sqlalchemy import create_engine, event, func, inspect, literal, select
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from autotune.core import jsonread
from autotune.core.layer import parse_key
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

from autotune.cache.columns import Column
from autotune.cache.files import (CacheError, check_header, immutable_ok, is_locked, is_sqlite, one_line, parse, probe_dir,
                                  sqlite_file, to_url)
from autotune.cache.guard import check_plain
from autotune.cache.migrations import MigrationError, upgrade
from autotune.cache.schema import SCHEMA_VERSION, Base, ProblemRow, SchemaVersion
from autotune.cache.upsert import upsert

T = TypeVar("T")
_RETRIES = 6
_BACKOFF_S = 0.05


def row_json(text) -> object:
    """A JSON column of a row (a device record, a libset), bounded: a hostile file's row may be
    a deeply nested or huge document (ValueError, one line)."""
    if not isinstance(text, str):
        raise TypeError(f"a JSON column holds {type(text).__name__}, not text")
    return jsonread.loads(text, "a cache row's JSON", max_bytes=1 << 20)


def problem_row(p: Problem) -> dict:
    return {"key": p.key, **p.to_dict()}


def tactic_row(params_json: str, expect_id: str | None = None) -> dict:
    try:
        t = Tactic.from_json(params_json)
    except (ValueError, TypeError) as e:
        raise CacheError(f"tactic parameters are not a tactic: {one_line(e)}") from None
    if expect_id is not None and t.id != expect_id:
        raise CacheError(f"tactic id {expect_id} does not match its parameters (hash {t.id})")
    return {"id": t.id, "family": t.family, "params_json": t.to_json()}


def put_problem_key(s: Session, key: str) -> None:
    """The problem row of a stored key (a key that is not a Problem's: nothing, the row is still stored)."""
    try:
        p = parse_key(key)
    except ValueError:
        return
    upsert(s, ProblemRow, problem_row(p), ["key"], "ignore")


class Db:
    """An open cache. `url` is a path or SQLAlchemy URL (default: default_url())."""

    def __init__(self, url: str | os.PathLike | None = None, *, readonly: bool = False,
                 immutable: bool | None = None):
        """immutable (read-only only): True opens with SQLite's immutable=1 (no locks, no -wal/-shm
        files: for caches baked into images); None decides (see _immutable_ok)."""
        self.url = to_url(url)
        self.readonly = readonly
        u = parse(self.url)
        self._sqlite = is_sqlite(u)
        self.path: Path | None = sqlite_file(u) if self._sqlite else None
        self._where = str(self.path) if self.path else u.render_as_string(hide_password=True)
        engine_url, kw = self._engine_args(u, immutable)
        try:
            self.engine: Engine = create_engine(engine_url, **kw)
        except Exception as e:  # unknown dialect, missing driver ...
            raise CacheError(f"cannot open cache {self._where}: {one_line(e)}") from None
        if self._sqlite:
            event.listen(self.engine, "connect", self._sqlite_pragmas)
        try:
            self._init_schema()
        except CacheError:
            self.engine.dispose()
            raise
        except SQLAlchemyError as e:
            self.engine.dispose()
            msg = one_line(e)
            if "not a database" in msg or "malformed" in msg or "encrypted" in msg:
                raise CacheError(f"{self._where} is not an fp4-autotune cache: {msg}") from None
            raise CacheError(f"cannot open cache {self._where}: {msg}") from None

    # -- setup
    def _engine_args(self, u: URL, immutable: bool | None) -> tuple[URL | str, dict]:
        """(the URL, create_engine's keywords) this open connects with: an in-memory SQLite one
        shared pool; a SQLite file read-only through a `mode=ro` (and, where allowed, immutable=1)
        URI, which must exist; a writable one's directory made; an existing file's header, schema
        and table sizes checked before any row is read (CacheError, one line)."""
        if self._sqlite and self.path is None:
            return u, {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        p = self.path
        if p is None:
            return u, {}
        engine_url: URL | str = u
        query: dict[str, str] = {}
        if self.readonly:
            if not p.is_file():
                raise CacheError(f"no cache at {p}" + (" (it is a directory)" if p.is_dir() else ""))
            query = {"mode": "ro", "uri": "true"}
            if immutable or (immutable is None and immutable_ok(p)):
                query["immutable"] = "1"
            engine_url = URL.create("sqlite", database="file:" + quote(str(p)), query=query)
        else:
            if p.is_dir():
                raise CacheError(f"cache path {p} is a directory")
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise CacheError(f"cannot create cache directory {p.parent}: {e.strerror or e}") from None
        if p.exists():
            check_header(p)
            if p.stat().st_size:     # a plain schema and bounded tables before any row is read
                check_plain(p, immutable="immutable" in query)
        return engine_url, {}

    def _sqlite_pragmas(self, dbapi_conn, _record) -> None:
        cur = dbapi_conn.cursor()
        try:
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            if not self.readonly and self.path is not None:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=NORMAL")
        finally:
            cur.close()

    def _init_schema(self) -> None:
        self.schema_version = SCHEMA_VERSION
        with self.engine.connect() as c:
            tables = set(inspect(c).get_table_names())
            if tables and "schema_version" not in tables:
                raise CacheError(f"{self._where} is not an fp4-autotune cache: no schema_version table "
                                 f"(has {', '.join(sorted(tables)[:5])})")
            if "schema_version" in tables:
                v = c.execute(select(func.max(SchemaVersion.version))).scalar()
                self.schema_version = v if v is not None else SCHEMA_VERSION
                if v is not None and v > SCHEMA_VERSION:
                    raise CacheError(f"{self._where} was written by a newer fp4-autotune "
                                     f"(schema {v} > supported {SCHEMA_VERSION})")
            elif self.readonly:
                raise CacheError(f"{self._where} is not an fp4-autotune cache: empty database")
        if self.readonly:
            return
        self.schema_version = SCHEMA_VERSION        # a writable open upgrades (or creates) it
        for attempt in range(_RETRIES):  # several processes may create the same new file at once
            try:
                try:
                    upgrade(self.engine)     # an older cache: its versioned steps (cache/migrations.py)
                except MigrationError as e:
                    raise CacheError(f"cannot upgrade {self._where}: {e}") from None
                Base.metadata.create_all(self.engine)
                with Session(self.engine) as s, s.begin():
                    if s.execute(select(func.count()).select_from(SchemaVersion)).scalar() == 0:
                        upsert(s, SchemaVersion, {"version": SCHEMA_VERSION}, ["version"], "ignore")
                return
            except OperationalError as e:
                retry = is_locked(e) or "already exists" in one_line(e)
                if not retry or attempt == _RETRIES - 1:
                    raise
                time.sleep(_BACKOFF_S * (1 + random.random()))

    @staticmethod
    def check_writable(url: str | os.PathLike | None = None) -> None:
        """Raise CacheError unless the cache can be created/written. Creates nothing."""
        s = to_url(url)
        u = parse(s)
        if not is_sqlite(u):
            return  # a server database: only connecting can tell
        path = sqlite_file(u)
        if path is None:
            return
        if path.is_dir():
            raise CacheError(f"cache path {path} is a directory")
        if path.exists():
            if not path.is_file():
                raise CacheError(f"cache path {path} is not a regular file")
            try:
                open(path, "r+b").close()
            except OSError as e:
                raise CacheError(f"cache {path} is not writable: {e.strerror or e}") from None
            check_header(path)
            probe_dir(path.parent, path)  # WAL needs -wal/-shm files beside it
            return
        anc = path.parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        if not anc.is_dir():
            raise CacheError(f"cannot create cache {path}: {anc} is not a directory")
        probe_dir(anc, path)

    # -- plumbing
    def _write(self, fn: Callable[[Session], None]) -> None:
        if self.readonly:
            raise CacheError(f"cache {self._where} is open read-only")
        delay = _BACKOFF_S
        for attempt in range(_RETRIES):
            try:
                with Session(self.engine) as s, s.begin():
                    fn(s)
                return
            except OperationalError as e:
                if is_locked(e) and attempt < _RETRIES - 1:
                    time.sleep(delay * (1 + random.random()))
                    delay *= 2
                    continue
                raise CacheError(f"cache write failed ({self._where}): {one_line(e)}") from None
            except SQLAlchemyError as e:
                raise CacheError(f"cache write failed ({self._where}): {one_line(e)}") from None

    def _read(self, fn: Callable[[Session], T]) -> T:
        try:
            with Session(self.engine) as s:
                return fn(s)
        except SQLAlchemyError as e:
            raise CacheError(f"cache read failed ({self._where}): {one_line(e)}") from None

    def _cols(self, row, cols: tuple[Column, ...]) -> list:
        """The columns `cols` of a row class as a select list; a column newer than this file
        reads as its default."""
        return [getattr(row, c.name) if c.present_in(self.schema_version)
                else literal(c.default).label(c.name) for c in cols]

    def close(self) -> None:
        self.engine.dispose()
