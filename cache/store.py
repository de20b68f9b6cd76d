"""Store: the persistent tactic cache (SQLite by default, any SQLAlchemy URL accepted).

Every method takes and returns the plain records of autotune.core.records; ORM rows never leave this
module. Writes are short transactions (one per trial) retried on "database is locked", so
several tuning processes can share one SQLite file in WAL mode.
"""
from __future__ import annotations

import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable, TypeVar
from urllib.parse import quote

from sqlalchemy import create_engine, event, func, inspect, select
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from autotune.core import settings
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Miss, Trial, Winner
from autotune.core.tactic import Tactic, canonical_json

from cache.schema import (SCHEMA_VERSION, Base, DeviceRow, LibsetRow, Meta, MissRow, ProblemRow,
                          SchemaVersion, TacticRow, TrialRow, WinnerRow, utcnow)

T = TypeVar("T")
SQLITE_MAGIC = b"SQLite format 3\x00"
_RETRIES = 6
_BACKOFF_S = 0.05
_TRIAL_COLS = ("problem_key", "bucket", "tactic_id", "family", "device_key", "lib_key", "status", "reason",
               "median_us", "iqr_us", "reps", "rel_err", "smem_model", "smem_compiled", "exit_signal")
_TRIAL_KEY = ["problem_key", "bucket", "tactic_id", "device_key", "lib_key"]
_WINNER_KEY = ["problem_key", "bucket", "device_key"]


class CacheError(Exception):
    """Any cache failure, with a one-line message fit for the user."""


def _one_line(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    text = str(orig if orig is not None else e) or type(e).__name__
    return text.strip().splitlines()[0] if text.strip() else type(e).__name__


# ---------------------------------------------------------------------------------------- URLs

def _path_url(p: str | os.PathLike) -> str:
    return "sqlite:///" + os.path.abspath(os.path.expanduser(os.fspath(p)))


def default_url() -> str:
    """$AUTOTUNE_CACHE (a file path or any SQLAlchemy URL), else the per-user cache file."""
    env = settings.cache_url()
    if env:
        return env if "://" in env else _path_url(env)
    import platformdirs
    return _path_url(Path(platformdirs.user_cache_dir("fp4-autotune")) / "cache.db")


def _to_url(url: str | os.PathLike | None) -> str:
    if url is None:
        return default_url()
    if isinstance(url, os.PathLike):
        return _path_url(url)
    s = str(url).strip()
    if not s:
        raise CacheError("empty cache location")
    return s if "://" in s else _path_url(s)


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError as e:
        raise CacheError(f"not a database URL or path: {url!r} ({_one_line(e)})") from None


def _is_sqlite(u: URL) -> bool:
    return u.get_backend_name() == "sqlite"


def _sqlite_file(u: URL) -> Path | None:
    """The file behind a SQLite URL, None for an in-memory database."""
    db = u.database or ""
    if not db or db == ":memory:" or u.query.get("mode") == "memory":
        return None
    if db.startswith("file:"):
        from urllib.parse import unquote
        db = unquote(db[5:].split("?", 1)[0])
    return Path(os.path.abspath(os.path.expanduser(db)))


def _check_header(path: Path) -> None:
    """Refuse a file that is not SQLite, or a SQLite file shorter than its header says."""
    try:
        size = path.stat().st_size
        if size == 0:
            return
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise CacheError(f"cannot read cache {path}: {e.strerror or e}") from None
    if len(head) < 100 or not head.startswith(SQLITE_MAGIC):
        raise CacheError(f"{path} is not an fp4-autotune cache: not a SQLite database")
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    valid = head[24:28] == head[92:96]
    # with a -wal file present a writer may be mid-checkpoint: the header can run ahead of the file
    if valid and pages and not Path(str(path) + "-wal").exists() and size < pages * page:
        raise CacheError(f"{path} is not an fp4-autotune cache: truncated ({size} of {pages * page} bytes)")


def _immutable_ok(p: Path) -> bool:
    """Can a read-only open skip SQLite's locking? Yes when nothing can be writing the file: no
    -wal beside it and either its directory is not writable (a WAL reader could not create -shm)
    or it is in rollback-journal mode (every Store writer switches a file to WAL first, and
    exports are written in rollback mode)."""
    if Path(str(p) + "-wal").exists():
        return False
    if not os.access(p.parent, os.W_OK):
        return True
    try:
        with open(p, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[18] == 1 and head[19] == 1


def _probe_dir(d: Path, target: Path) -> None:
    """Can files be created in d? Creates and removes one temp file (nothing is left behind)."""
    if not os.access(d, os.W_OK | os.X_OK):
        raise CacheError(f"cannot write cache {target}: no write permission on {d}")
    try:
        fd, name = tempfile.mkstemp(prefix=".fp4-autotune-probe-", dir=d)
    except OSError as e:
        raise CacheError(f"cannot write cache {target}: cannot create files in {d} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(name)


def _is_locked(e: OperationalError) -> bool:
    msg = _one_line(e).lower()
    return "locked" in msg or "busy" in msg


# --------------------------------------------------------------------------------------- upsert

def _upsert(s: Session, model, row: dict, keys: list[str], mode: str = "replace", add: str | None = None) -> None:
    """INSERT ... ON CONFLICT for SQLite/PostgreSQL, select-then-write elsewhere.

    mode: "replace" (overwrite the other columns), "ignore" (keep the existing row),
    "add" (existing[add] += row[add]).
    """
    table = model.__table__
    dialect = s.get_bind().dialect.name
    if dialect in ("sqlite", "postgresql"):
        if dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        stmt = insert(table).values(**row)
        if mode == "ignore":
            stmt = stmt.on_conflict_do_nothing(index_elements=keys)
        elif mode == "add":
            stmt = stmt.on_conflict_do_update(index_elements=keys,
                                              set_={add: table.c[add] + stmt.excluded[add]})
        else:
            stmt = stmt.on_conflict_do_update(
                index_elements=keys, set_={c: stmt.excluded[c] for c in row if c not in keys})
        s.execute(stmt)
        return
    cond = [table.c[k] == row[k] for k in keys]
    existing = s.execute(select(table).where(*cond).with_for_update()).first()
    if existing is None:
        s.execute(table.insert().values(**row))
    elif mode == "add":
        s.execute(table.update().where(*cond).values({add: table.c[add] + row[add]}))
    elif mode == "replace":
        s.execute(table.update().where(*cond).values({c: v for c, v in row.items() if c not in keys}))


def _problem_row(p: Problem) -> dict:
    return {"key": p.key, **p.to_dict()}


def _tactic_row(params_json: str, expect_id: str | None = None) -> dict:
    try:
        t = Tactic.from_json(params_json)
    except (ValueError, TypeError) as e:
        raise CacheError(f"tactic parameters are not a tactic: {_one_line(e)}") from None
    if expect_id is not None and t.id != expect_id:
        raise CacheError(f"tactic id {expect_id} does not match its parameters (hash {t.id})")
    return {"id": t.id, "family": t.family, "params_json": t.to_json()}


# ---------------------------------------------------------------------------------------- Store

class Store:
    """The tactic cache. `url` is a path or SQLAlchemy URL (default: default_url())."""

    def __init__(self, url: str | os.PathLike | None = None, *, readonly: bool = False,
                 immutable: bool | None = None):
        """immutable (read-only only): True opens with SQLite's immutable=1 (no locks, no -wal/-shm
        files: for caches baked into images); None decides (see _immutable_ok)."""
        self.url = _to_url(url)
        self.readonly = readonly
        u = _parse(self.url)
        self._sqlite = _is_sqlite(u)
        self.path: Path | None = _sqlite_file(u) if self._sqlite else None
        self._where = str(self.path) if self.path else u.render_as_string(hide_password=True)
        engine_url: URL | str = u
        kw: dict = {}
        if self._sqlite and self.path is None:
            kw = {"poolclass": StaticPool, "connect_args": {"check_same_thread": False}}
        elif self.path is not None:
            p = self.path
            if readonly:
                if not p.is_file():
                    raise CacheError(f"no cache at {p}" + (" (it is a directory)" if p.is_dir() else ""))
                query = {"mode": "ro", "uri": "true"}
                if immutable or (immutable is None and _immutable_ok(p)):
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
                _check_header(p)
        try:
            self.engine: Engine = create_engine(engine_url, **kw)
        except Exception as e:  # unknown dialect, missing driver ...
            raise CacheError(f"cannot open cache {self._where}: {_one_line(e)}") from None
        if self._sqlite:
            event.listen(self.engine, "connect", self._sqlite_pragmas)
        try:
            self._init_schema()
        except CacheError:
            self.engine.dispose()
            raise
        except SQLAlchemyError as e:
            self.engine.dispose()
            msg = _one_line(e)
            if "not a database" in msg or "malformed" in msg or "encrypted" in msg:
                raise CacheError(f"{self._where} is not an fp4-autotune cache: {msg}") from None
            raise CacheError(f"cannot open cache {self._where}: {msg}") from None

    # -- setup
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
        with self.engine.connect() as c:
            tables = set(inspect(c).get_table_names())
            if tables and "schema_version" not in tables:
                raise CacheError(f"{self._where} is not an fp4-autotune cache: no schema_version table "
                                 f"(has {', '.join(sorted(tables)[:5])})")
            if "schema_version" in tables:
                v = c.execute(select(func.max(SchemaVersion.version))).scalar()
                if v is not None and v > SCHEMA_VERSION:
                    raise CacheError(f"{self._where} was written by a newer fp4-autotune "
                                     f"(schema {v} > supported {SCHEMA_VERSION})")
            elif self.readonly:
                raise CacheError(f"{self._where} is not an fp4-autotune cache: empty database")
        if self.readonly:
            return
        for attempt in range(_RETRIES):  # several processes may create the same new file at once
            try:
                from cache.migrations import MigrationError, upgrade
                try:
                    upgrade(self.engine)     # an older cache: its versioned steps (cache/migrations.py)
                except MigrationError as e:
                    raise CacheError(f"cannot upgrade {self._where}: {e}") from None
                Base.metadata.create_all(self.engine)
                with Session(self.engine) as s, s.begin():
                    if s.execute(select(func.count()).select_from(SchemaVersion)).scalar() == 0:
                        _upsert(s, SchemaVersion, {"version": SCHEMA_VERSION}, ["version"], "ignore")
                return
            except OperationalError as e:
                retry = _is_locked(e) or "already exists" in _one_line(e)
                if not retry or attempt == _RETRIES - 1:
                    raise
                time.sleep(_BACKOFF_S * (1 + random.random()))

    @staticmethod
    def check_writable(url: str | os.PathLike | None = None) -> None:
        """Raise CacheError unless the cache can be created/written. Creates nothing."""
        s = _to_url(url)
        u = _parse(s)
        if not _is_sqlite(u):
            return  # a server database: only connecting can tell
        path = _sqlite_file(u)
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
            _check_header(path)
            _probe_dir(path.parent, path)  # WAL needs -wal/-shm files beside it
            return
        anc = path.parent
        while not anc.exists() and anc != anc.parent:
            anc = anc.parent
        if not anc.is_dir():
            raise CacheError(f"cannot create cache {path}: {anc} is not a directory")
        _probe_dir(anc, path)

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
                if _is_locked(e) and attempt < _RETRIES - 1:
                    time.sleep(delay * (1 + random.random()))
                    delay *= 2
                    continue
                raise CacheError(f"cache write failed ({self._where}): {_one_line(e)}") from None
            except SQLAlchemyError as e:
                raise CacheError(f"cache write failed ({self._where}): {_one_line(e)}") from None

    def _read(self, fn: Callable[[Session], T]) -> T:
        try:
            with Session(self.engine) as s:
                return fn(s)
        except SQLAlchemyError as e:
            raise CacheError(f"cache read failed ({self._where}): {_one_line(e)}") from None

    # -- environment, problems, tactics
    def put_environment(self, env: Env, depends_on: tuple[str, ...]) -> None:
        dev = {"device_key": env.device_key, "gpu_name": env.gpu_name, "cc": env.cc, "sm_count": env.sm_count,
               "record_json": canonical_json(env.to_dict())}
        lib = {"lib_key": env.lib_key(depends_on), "versions_json": canonical_json(env.lib_versions(depends_on))}
        self._write(lambda s: (_upsert(s, DeviceRow, dev, ["device_key"]),
                               _upsert(s, LibsetRow, lib, ["lib_key"], "ignore")))

    def _put_device_record(self, s: Session, rec: dict) -> None:
        row = {"device_key": rec["device_key"], "gpu_name": rec["gpu_name"], "cc": rec["cc"],
               "sm_count": rec["sm_count"], "record_json": canonical_json(rec)}
        _upsert(s, DeviceRow, row, ["device_key"], "ignore")

    def put_problem(self, problem: Problem) -> None:
        self._write(lambda s: _upsert(s, ProblemRow, _problem_row(problem), ["key"], "ignore"))

    def put_tactic(self, tactic: Tactic) -> None:
        row = {"id": tactic.id, "family": tactic.family, "params_json": tactic.to_json()}
        self._write(lambda s: _upsert(s, TacticRow, row, ["id"], "ignore"))

    def tactic(self, tactic_id: str) -> Tactic | None:
        row = self._read(lambda s: s.get(TacticRow, tactic_id))
        return Tactic.from_json(row.params_json) if row else None

    def problems(self) -> list[Problem]:
        rows = self._read(lambda s: s.scalars(select(ProblemRow).order_by(ProblemRow.key)).all())
        return [Problem(r.kind, r.a_fmt, r.w_fmt, r.out_dtype, r.n, r.k, r.experts, r.top_k) for r in rows]

    def device(self, device_key: str) -> dict | None:
        row = self._read(lambda s: s.get(DeviceRow, device_key))
        return json.loads(row.record_json) if row else None

    def devices(self) -> list[dict]:
        rows = self._read(lambda s: s.scalars(select(DeviceRow).order_by(DeviceRow.device_key)).all())
        return [json.loads(r.record_json) for r in rows]

    def libset(self, lib_key: str) -> dict | None:
        row = self._read(lambda s: s.get(LibsetRow, lib_key))
        return json.loads(row.versions_json) if row else None

    # -- trials
    @staticmethod
    def _put_problem_key(s: Session, key: str) -> None:
        try:
            p = Problem.from_key(key)
        except ValueError:
            return  # not a Problem key: the trial is still stored
        _upsert(s, ProblemRow, _problem_row(p), ["key"], "ignore")

    def put_trial(self, trial: Trial) -> None:
        tac = _tactic_row(trial.params_json, trial.tactic_id)
        row = {c: getattr(trial, c) for c in _TRIAL_COLS}
        row["created_at"] = utcnow()

        def go(s: Session) -> None:
            _upsert(s, TacticRow, tac, ["id"], "ignore")
            self._put_problem_key(s, trial.problem_key)
            _upsert(s, TrialRow, row, _TRIAL_KEY)
        self._write(go)

    def get_trials(self, problem_key: str, bucket: int, device_key: str) -> list[Trial]:
        q = (select(TrialRow, TacticRow.params_json).join(TacticRow, TacticRow.id == TrialRow.tactic_id)
             .where(TrialRow.problem_key == problem_key, TrialRow.bucket == bucket,
                    TrialRow.device_key == device_key).order_by(TrialRow.id))
        rows = self._read(lambda s: s.execute(q).all())
        return [Trial(params_json=pj, **{c: getattr(r, c) for c in _TRIAL_COLS}) for r, pj in rows]

    def trials(self, device_key: str | None = None) -> list[Trial]:
        """Every stored trial (of one device, or all), oldest first: for reports."""
        q = select(TrialRow, TacticRow.params_json).join(TacticRow, TacticRow.id == TrialRow.tactic_id)
        if device_key is not None:
            q = q.where(TrialRow.device_key == device_key)
        rows = self._read(lambda s: s.execute(q.order_by(TrialRow.id)).all())
        return [Trial(params_json=pj, **{c: getattr(r, c) for c in _TRIAL_COLS}) for r, pj in rows]

    def trial_keys(self, device_key: str) -> set[tuple[str, int, str, str]]:
        q = (select(TrialRow.problem_key, TrialRow.bucket, TrialRow.tactic_id, TrialRow.lib_key)
             .where(TrialRow.device_key == device_key))
        return {tuple(r) for r in self._read(lambda s: s.execute(q).all())}

    # -- winners
    def put_winner(self, w: Winner) -> None:
        self._write(lambda s: self._put_winner(s, w))

    def _put_winner(self, s: Session, w: Winner) -> None:
        _upsert(s, TacticRow, _tactic_row(w.params_json, w.tactic_id), ["id"], "ignore")
        self._put_problem_key(s, w.problem_key)
        row = {"problem_key": w.problem_key, "bucket": w.bucket, "device_key": w.device_key,
               "tactic_id": w.tactic_id, "family": w.family, "lib_key": w.lib_key, "median_us": w.median_us,
               "default_tactic_id": w.default_tactic_id, "default_median_us": w.default_median_us,
               "speedup": w.speedup, "updated_at": utcnow()}
        _upsert(s, WinnerRow, row, _WINNER_KEY)

    def winners(self, device_key: str | None = None) -> list[Winner]:
        q = select(WinnerRow, TacticRow.params_json).join(TacticRow, TacticRow.id == WinnerRow.tactic_id)
        if device_key is not None:
            q = q.where(WinnerRow.device_key == device_key)
        q = q.order_by(WinnerRow.device_key, WinnerRow.problem_key, WinnerRow.bucket)
        return [Winner(r.problem_key, r.bucket, r.device_key, r.tactic_id, r.family, pj, r.lib_key, r.median_us,
                       r.default_tactic_id, r.default_median_us, r.speedup)
                for r, pj in self._read(lambda s: s.execute(q).all())]

    def delete_winner(self, problem_key: str, bucket: int, device_key: str) -> None:
        t = WinnerRow.__table__
        self._write(lambda s: s.execute(t.delete().where(
            t.c.problem_key == problem_key, t.c.bucket == bucket, t.c.device_key == device_key)))

    # -- misses
    def record_misses(self, misses: Iterable[Miss]) -> None:
        rows = [{"problem_key": m.problem_key, "m": m.m, "device_key": m.device_key, "count": m.count}
                for m in misses]
        if rows:
            self._write(lambda s: [_upsert(s, MissRow, r, ["problem_key", "m", "device_key"], "add", "count")
                                   for r in rows])

    def misses(self, device_key: str | None = None) -> list[Miss]:
        q = select(MissRow)
        if device_key is not None:
            q = q.where(MissRow.device_key == device_key)
        q = q.order_by(MissRow.device_key, MissRow.problem_key, MissRow.m)
        return [Miss(r.problem_key, r.m, r.device_key, r.count) for r in self._read(lambda s: s.scalars(q).all())]

    # -- meta (exports)
    def _meta(self) -> dict[str, str]:
        return {r.key: r.value for r in self._read(lambda s: s.scalars(select(Meta)).all())}

    def meta(self) -> dict[str, str]:
        return self._meta()

    def put_meta(self, key: str, value: str) -> None:
        """One free-form key/value row (e.g. measured roofline ceilings, see autotune.report)."""
        self._write(lambda s: _upsert(s, Meta, {"key": key, "value": value}, ["key"]))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._where!r}{', readonly=True' if self.readonly else ''})"
