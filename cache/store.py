"""Store: the persistent tactic cache (SQLite by default, any SQLAlchemy URL accepted).

Every method takes and returns the plain records of autotune.core.records; ORM rows never leave this
module. Writes are short transactions (one per trial) retried on "database is locked", so
several tuning processes can share one SQLite file in WAL mode.
"""
from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence, TypeVar
from urllib.parse import quote

from sqlalchemy import and_, create_engine, delete, event, func, inspect, literal, not_, or_, select, true
from sqlalchemy.engine import URL, Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session
from sqlalchemy.pool import StaticPool

from autotune.core import jsonread
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Miss, Trial, Winner
from autotune.core.tactic import Tactic, canonical_json

from autotune.cache.files import (CacheError, check_header, immutable_ok, is_locked, is_sqlite, one_line, parse, probe_dir,
                         sqlite_file, to_url)
from autotune.cache.guard import check_plain
from autotune.cache.migrations import MigrationError, upgrade
from autotune.cache.schema import (SCHEMA_VERSION, Base, DeviceRow, LibsetRow, Meta, MissRow, ProblemRow,
                          SchemaVersion, TacticRow, TrialRow, WinnerRow, utcnow)
from autotune.cache.upsert import upsert, upsert_many
from autotune.cache.coderows import _CODE_KEYS, _TRIAL_COLS, CodeKeyRows

T = TypeVar("T")
_RETRIES = 6
_BACKOFF_S = 0.05
_TRIAL_KEY = ["problem_key", "bucket", "tactic_id", "device_key", "lib_key", "code_key"]
_WINNER_KEY = ["problem_key", "bucket", "device_key"]
_WINNER_COLS = ("problem_key", "bucket", "device_key", "tactic_id", "family", "lib_key", "median_us",
                "default_tactic_id", "default_median_us", "speedup", "code_key", "predicted")
_PREDICTED = 4      # the schema version that marks predicted winners


def _row_json(text) -> object:
    """A JSON column of a row (a device record, a libset), bounded: a hostile file's row may be
    a deeply nested or huge document (ValueError, one line)."""
    if not isinstance(text, str):
        raise TypeError(f"a JSON column holds {type(text).__name__}, not text")
    return jsonread.loads(text, "a cache row's JSON", max_bytes=1 << 20)


def _problem_row(p: Problem) -> dict:
    return {"key": p.key, **p.to_dict()}


def _tactic_row(params_json: str, expect_id: str | None = None) -> dict:
    try:
        t = Tactic.from_json(params_json)
    except (ValueError, TypeError) as e:
        raise CacheError(f"tactic parameters are not a tactic: {one_line(e)}") from None
    if expect_id is not None and t.id != expect_id:
        raise CacheError(f"tactic id {expect_id} does not match its parameters (hash {t.id})")
    return {"id": t.id, "family": t.family, "params_json": t.to_json()}


# ---------------------------------------------------------------------------------------- Store

class Store(CodeKeyRows):
    """The tactic cache. `url` is a path or SQLAlchemy URL (default: default_url())."""

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
                    check_plain(p, immutable=readonly and "immutable" in query)
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

    # -- environment, problems, tactics
    def put_environment(self, env: Env, depends_on: tuple[str, ...]) -> None:
        dev = {"device_key": env.device_key, "gpu_name": env.gpu_name, "cc": env.cc, "sm_count": env.sm_count,
               "record_json": canonical_json(env.to_dict())}
        lib = {"lib_key": env.lib_key(depends_on), "versions_json": canonical_json(env.lib_versions(depends_on))}
        self._write(lambda s: (upsert(s, DeviceRow, dev, ["device_key"]),
                               upsert(s, LibsetRow, lib, ["lib_key"], "ignore")))

    def put_problem(self, problem: Problem) -> None:
        self._write(lambda s: upsert(s, ProblemRow, _problem_row(problem), ["key"], "ignore"))

    def put_tactic(self, tactic: Tactic) -> None:
        row = {"id": tactic.id, "family": tactic.family, "params_json": tactic.to_json()}
        self._write(lambda s: upsert(s, TacticRow, row, ["id"], "ignore"))

    def tactic(self, tactic_id: str) -> Tactic | None:
        row = self._read(lambda s: s.get(TacticRow, tactic_id))
        return Tactic.from_json(row.params_json) if row else None

    def problems(self) -> list[Problem]:
        """Every stored problem this version can read. The epilogue (`:swiglu` / `:reduce`) is in
        the key only (the row's columns predate it), so problems are read from their keys; a key
        this version does not parse (a newer kind or epilogue) is left out, never misread as the
        plain problem of its columns."""
        rows = self._read(lambda s: s.scalars(select(ProblemRow.key).order_by(ProblemRow.key)).all())
        out = []
        for key in rows:
            try:
                out.append(Problem.from_key(key))
            except ValueError:
                continue
        return out

    def device(self, device_key: str) -> dict | None:
        row = self._read(lambda s: s.get(DeviceRow, device_key))
        return _row_json(row.record_json) if row else None

    def devices(self) -> list[dict]:
        rows = self._read(lambda s: s.scalars(select(DeviceRow).order_by(DeviceRow.device_key)).all())
        return [_row_json(r.record_json) for r in rows]

    def device_records(self) -> dict[str, dict]:
        """Device records by key; a damaged record (not JSON, or naming another key) is left out."""
        rows = self._read(lambda s: s.execute(select(DeviceRow.device_key, DeviceRow.record_json)).all())
        out = {}
        for key, rec in rows:
            try:
                d = _row_json(rec)
            except (TypeError, ValueError):
                continue
            if isinstance(d, dict) and d.get("device_key") == key:
                out[key] = d
        return out

    def libset(self, lib_key: str) -> dict | None:
        row = self._read(lambda s: s.get(LibsetRow, lib_key))
        return _row_json(row.versions_json) if row else None

    # -- trials
    @staticmethod
    def _put_problem_key(s: Session, key: str) -> None:
        try:
            p = Problem.from_key(key)
        except ValueError:
            return  # not a Problem key: the trial is still stored
        upsert(s, ProblemRow, _problem_row(p), ["key"], "ignore")

    def put_trial(self, trial: Trial) -> None:
        self.put_trials([trial])

    def put_trials(self, trials: Sequence[Trial]) -> None:
        """All in one transaction (a search's static rejections: ~1,200 rows, one commit, not 1,200)."""
        rows = []
        for trial in trials:
            row = {c: getattr(trial, c) for c in _TRIAL_COLS}
            row["created_at"] = utcnow()
            rows.append((_tactic_row(trial.params_json, trial.tactic_id), trial.problem_key, row))

        def go(s: Session) -> None:
            for pk in dict.fromkeys(pk for _, pk, _ in rows):
                self._put_problem_key(s, pk)
            upsert_many(s, TacticRow, list({tac["id"]: tac for tac, _, _ in rows}.values()), ["id"], "ignore")
            upsert_many(s, TrialRow, [row for _, _, row in rows], _TRIAL_KEY)
        if rows:
            self._write(go)

    def _cols(self, row, names):
        """The columns `names` of a row class; code_key as '' in a file older than code keys, predicted
        as false in one older than predicted winners."""
        old = {"code_key": (_CODE_KEYS, ""), "predicted": (_PREDICTED, False)}
        return [getattr(row, c) if c not in old or self.schema_version >= old[c][0]
                else literal(old[c][1]).label(c) for c in names]

    def get_trials(self, problem_key: str, bucket: int, device_key: str) -> list[Trial]:
        q = (select(*self._cols(TrialRow, _TRIAL_COLS), TacticRow.params_json)
             .join(TacticRow, TacticRow.id == TrialRow.tactic_id)
             .where(TrialRow.problem_key == problem_key, TrialRow.bucket == bucket,
                    TrialRow.device_key == device_key).order_by(TrialRow.id))
        rows = self._read(lambda s: s.execute(q).all())
        return [Trial(params_json=r.params_json, **{c: getattr(r, c) for c in _TRIAL_COLS}) for r in rows]

    def trials(self, device_key: str | None = None) -> list[Trial]:
        """Every stored trial (of one device, or all), oldest first: for reports. A trial whose
        tactic row is missing comes back with params_json "" (autotune.cache.rows.check_trial names it)."""
        q = (select(*self._cols(TrialRow, _TRIAL_COLS), TacticRow.params_json)
             .outerjoin(TacticRow, TacticRow.id == TrialRow.tactic_id))
        if device_key is not None:
            q = q.where(TrialRow.device_key == device_key)
        rows = self._read(lambda s: s.execute(q.order_by(TrialRow.id)).all())
        return [Trial(params_json=r.params_json or "", **{c: getattr(r, c) for c in _TRIAL_COLS}) for r in rows]

    def trial_keys(self, device_key: str) -> set[tuple[str, int, str, str]]:
        q = (select(TrialRow.problem_key, TrialRow.bucket, TrialRow.tactic_id, TrialRow.lib_key)
             .where(TrialRow.device_key == device_key))
        return {tuple(r) for r in self._read(lambda s: s.execute(q).all())}

    # -- winners
    def put_winner(self, w: Winner) -> None:
        self._write(lambda s: self._put_winner(s, w))

    def _put_winner(self, s: Session, w: Winner) -> None:
        if w.predicted:     # a prediction never replaces a measured winner (a measured one replaces it)
            held = s.execute(select(WinnerRow.predicted).where(
                WinnerRow.problem_key == w.problem_key, WinnerRow.bucket == w.bucket,
                WinnerRow.device_key == w.device_key)).first()
            if held is not None and not held[0]:
                return
        upsert(s, TacticRow, _tactic_row(w.params_json, w.tactic_id), ["id"], "ignore")
        self._put_problem_key(s, w.problem_key)
        row = {c: getattr(w, c) for c in _WINNER_COLS}
        row["updated_at"] = utcnow()
        upsert(s, WinnerRow, row, _WINNER_KEY)

    def winners(self, device_key: str | None = None) -> list[Winner]:
        """Every stored winner, as stored: no row is dropped here (a missing tactic row gives
        params_json ""), so each reader counts what it skips by autotune.cache.rows.check_winner."""
        q = (select(*self._cols(WinnerRow, _WINNER_COLS), TacticRow.params_json)
             .outerjoin(TacticRow, TacticRow.id == WinnerRow.tactic_id))
        if device_key is not None:
            q = q.where(WinnerRow.device_key == device_key)
        q = q.order_by(WinnerRow.device_key, WinnerRow.problem_key, WinnerRow.bucket)
        return [Winner(r.problem_key, r.bucket, r.device_key, r.tactic_id, r.family, r.params_json or "", r.lib_key,
                       r.median_us, r.default_tactic_id, r.default_median_us, r.speedup, r.code_key,
                       bool(r.predicted))
                for r in self._read(lambda s: s.execute(q).all())]

    def put_winners(self, winners: Iterable[Winner], devices: Iterable[dict] = (),
                    libsets: Mapping[str, dict] | None = None) -> None:
        """Winners with the device records ({"device_key", "gpu_name", "cc", "sm_count", ...}) and
        libsets ({lib_key: versions}) they refer to, in one transaction (an import: all or nothing).
        A device or libset already stored is kept; a winner replaces the stored one of its
        (problem, bucket, device). Check rows first (autotune.cache.rows): nothing is validated here."""
        winners, devices = list(winners), list(devices)

        def go(s: Session) -> None:
            for rec in devices:
                row = {"device_key": rec["device_key"], "gpu_name": rec["gpu_name"], "cc": rec["cc"],
                       "sm_count": rec["sm_count"], "record_json": canonical_json(rec)}
                upsert(s, DeviceRow, row, ["device_key"], "ignore")
            for key, versions in (libsets or {}).items():
                upsert(s, LibsetRow, {"lib_key": key, "versions_json": canonical_json(versions)}, ["lib_key"], "ignore")
            for w in winners:
                self._put_winner(s, w)
        if winners or devices or libsets:
            self._write(go)

    def delete_winner(self, problem_key: str, bucket: int, device_key: str) -> None:
        t = WinnerRow.__table__
        self._write(lambda s: s.execute(t.delete().where(
            t.c.problem_key == problem_key, t.c.bucket == bucket, t.c.device_key == device_key)))

    # -- misses
    def record_misses(self, misses: Iterable[Miss]) -> None:
        rows = [{"problem_key": m.problem_key, "m": m.m, "device_key": m.device_key, "count": m.count}
                for m in misses]
        if rows:
            self._write(lambda s: [upsert(s, MissRow, r, ["problem_key", "m", "device_key"], "add", "count")
                                   for r in rows])

    def misses(self, device_key: str | None = None) -> list[Miss]:
        q = select(MissRow)
        if device_key is not None:
            q = q.where(MissRow.device_key == device_key)
        q = q.order_by(MissRow.device_key, MissRow.problem_key, MissRow.m)
        return [Miss(r.problem_key, r.m, r.device_key, r.count) for r in self._read(lambda s: s.scalars(q).all())]

    # -- meta (exports)
    def meta(self) -> dict[str, str]:
        return {r.key: r.value for r in self._read(lambda s: s.scalars(select(Meta)).all())}

    def put_meta(self, key: str, value: str) -> None:
        """One free-form key/value row (e.g. measured roofline ceilings, see autotune.report)."""
        self.put_meta_items({key: value})

    def put_meta_items(self, items: Mapping[str, str]) -> None:
        """Several key/value rows in one transaction (an export's format, checksum, signature)."""
        self._write(lambda s: [upsert(s, Meta, {"key": k, "value": v}, ["key"]) for k, v in items.items()])

    def make_self_contained(self) -> None:
        """A SQLite file in rollback-journal mode: one file, no -wal beside it (for shipping)."""
        if self._sqlite and self.path is not None:
            with self.engine.connect() as c:
                c.exec_driver_sql("PRAGMA journal_mode=DELETE")

    # -- pruning
    def families(self) -> set[str]:
        """The families named by any stored trial or winner."""
        q = select(TrialRow.family).union(select(WinnerRow.family))
        return {f for (f,) in self._read(lambda s: s.execute(q).all())}

    def prune(self, *, keep_devices: set[str] | None = None, drop_devices: Iterable[str] = (),
              stale: tuple[str, Mapping[str, str | None]] | None = None, drop_misses: bool = False,
              dry_run: bool = False) -> dict[str, int]:
        """Delete trials, winners and misses (and device rows) of unwanted environments; return the
        counts per table ("trials", "winners", "misses", "devices"), deleting nothing on dry_run.

        keep_devices: keep only these device keys; drop_devices: drop these; stale:
        (device_key, {family: wanted lib_key or None}) drops that device's rows whose lib_key is not
        the wanted one of their family (all of a family mapped to None, or missing from the map);
        drop_misses: all misses of the kept devices too."""
        drop_devices = sorted(drop_devices)

        def cond(t):
            parts = []
            if keep_devices is not None:
                parts.append(not_(t.device_key.in_(sorted(keep_devices))))
            if drop_devices:
                parts.append(t.device_key.in_(drop_devices))
            if stale is not None and hasattr(t, "lib_key"):
                dev, want = stale
                parts.append(and_(t.device_key == dev, t.family.not_in(sorted(f for f, k in want.items() if k))))
                parts += [and_(t.device_key == dev, t.family == f, t.lib_key != k) for f, k in want.items() if k]
            if drop_misses and t is MissRow:
                parts.append(true())
            return or_(*parts) if parts else None
        plan = {"trials": (TrialRow, cond(TrialRow)), "winners": (WinnerRow, cond(WinnerRow)),
                "misses": (MissRow, cond(MissRow)), "devices": (DeviceRow, None)}
        if keep_devices is not None or drop_devices:
            plan["devices"] = (DeviceRow, cond(DeviceRow))
        counts = {name: 0 if c is None else self._read(
            lambda s, t=t, c=c: s.execute(select(func.count()).select_from(t).where(c)).scalar())
            for name, (t, c) in plan.items()}
        if not dry_run and any(counts.values()):
            self._write(lambda s: [s.execute(delete(t).where(c)) for t, c in plan.values() if c is not None])
        return counts

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Store({self._where!r}{', readonly=True' if self.readonly else ''})"

