"""Schema migrations: a versioned list of steps, applied in order when a writable Store opens an
older cache.

`STEPS[v]` upgrades a cache from version v-1 to v; each step runs in one transaction together with
the `schema_version` row it writes, so a failed step leaves the cache exactly as it was. A cache
newer than this code is refused (Store does that before anything here runs); read-only opens never
migrate. `V1_DDL` is the first released schema, frozen: tests build a cache from it and check that
upgrading yields what `autotune.cache.schema` declares, so a change to schema.py without a step fails CI.

To change the schema: bump SCHEMA_VERSION in cache/schema.py, add `STEPS[new] = fn(conn)` here
(plain DDL/DML through `conn.exec_driver_sql`, nothing evaluated from the database), and keep
V1_DDL untouched.
"""
from __future__ import annotations

from typing import Callable, Mapping

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError

from autotune.cache.schema import SCHEMA_VERSION

Step = Callable[[Connection], None]



def _v2_claims(c: Connection) -> None:
    """Schema 2: the claims table (concurrent searches share the work; cache/claims.py). Plain
    types that SQLite and PostgreSQL both take (FLOAT is double precision on PostgreSQL)."""
    c.exec_driver_sql(
        "CREATE TABLE claims (problem_key VARCHAR(200) NOT NULL, bucket INTEGER NOT NULL, "
        "device_key VARCHAR(32) NOT NULL, lib_set VARCHAR(32) NOT NULL, owner VARCHAR(200) NOT NULL, "
        "claimed_at FLOAT NOT NULL, expires_at FLOAT NOT NULL, state VARCHAR(16) NOT NULL, "
        "PRIMARY KEY (problem_key, bucket, device_key, lib_set))")
    c.exec_driver_sql("CREATE INDEX ix_claims_owner ON claims (owner)")


_TRIALS_V3 = (
    "CREATE TABLE {name} (id INTEGER NOT NULL, problem_key VARCHAR(200) NOT NULL, bucket INTEGER NOT NULL, "
    "tactic_id VARCHAR(32) NOT NULL, family VARCHAR(64) NOT NULL, device_key VARCHAR(32) NOT NULL, "
    "lib_key VARCHAR(32) NOT NULL, code_key VARCHAR(32) DEFAULT '' NOT NULL, status VARCHAR(16) NOT NULL, "
    "reason TEXT NOT NULL, median_us FLOAT, iqr_us FLOAT, reps INTEGER NOT NULL, rel_err FLOAT, "
    "smem_model INTEGER, smem_compiled INTEGER, exit_signal INTEGER, created_at DATETIME NOT NULL, "
    "PRIMARY KEY (id), CONSTRAINT uq_trial UNIQUE (problem_key, bucket, tactic_id, device_key, lib_key, code_key), "
    "FOREIGN KEY(tactic_id) REFERENCES tactics (id))")
_V2_TRIAL_COLS = ("id, problem_key, bucket, tactic_id, family, device_key, lib_key, status, reason, median_us, "
                  "iqr_us, reps, rel_err, smem_model, smem_compiled, exit_signal, created_at")


def _v3_code_keys(c: Connection) -> None:
    """Schema 3: the code key on trials (part of their unique key) and winners, and the
    compiler_figures table. Rows stored before get code_key '': no code certified them, so they
    stay readable (show, report, rank-fit) and are never served or counted as measured."""
    if c.dialect.name == "sqlite":       # SQLite cannot change a table's constraints: rebuild trials
        c.exec_driver_sql(_TRIALS_V3.format(name="trials_v3"))
        c.exec_driver_sql(f"INSERT INTO trials_v3 ({_V2_TRIAL_COLS}, code_key) SELECT {_V2_TRIAL_COLS}, '' FROM trials")
        c.exec_driver_sql("DROP TABLE trials")
        c.exec_driver_sql("ALTER TABLE trials_v3 RENAME TO trials")
        c.exec_driver_sql("CREATE INDEX ix_trials_device_key ON trials (device_key)")
    else:
        c.exec_driver_sql("ALTER TABLE trials ADD COLUMN code_key VARCHAR(32) DEFAULT '' NOT NULL")
        c.exec_driver_sql("ALTER TABLE trials DROP CONSTRAINT uq_trial")
        c.exec_driver_sql("ALTER TABLE trials ADD CONSTRAINT uq_trial "
                          "UNIQUE (problem_key, bucket, tactic_id, device_key, lib_key, code_key)")
    c.exec_driver_sql("ALTER TABLE winners ADD COLUMN code_key VARCHAR(32) DEFAULT '' NOT NULL")
    c.exec_driver_sql(
        "CREATE TABLE compiler_figures (compiler VARCHAR(64) NOT NULL, arch VARCHAR(16) NOT NULL, "
        "w_fmt VARCHAR(8) NOT NULL, tactic_id VARCHAR(32) NOT NULL, code VARCHAR(32) NOT NULL, shared INTEGER, "
        "tmem INTEGER, error TEXT, PRIMARY KEY (compiler, arch, w_fmt, tactic_id, code))")


def _v4_replay_checked(c: Connection) -> None:
    """Schema 4: `replay_checked` on trials and winners (the replay check, autotune.engine.replay).
    Rows stored before it are not replay-checked (False): `show`, `report` and `verify` mark them."""
    for table in ("trials", "winners"):
        c.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN replay_checked BOOLEAN DEFAULT false NOT NULL")


def _v5_predicted(c: Connection) -> None:
    """Schema 5: winners marked predicted (`--strategy predict`); every stored one was measured."""
    c.exec_driver_sql("ALTER TABLE winners ADD COLUMN predicted BOOLEAN DEFAULT false NOT NULL")


#: version -> the step that brings a cache from version-1 to version
STEPS: dict[int, Step] = {2: _v2_claims, 3: _v3_code_keys, 4: _v4_replay_checked, 5: _v5_predicted}

#: schema version 1 as released (commit 942ee7f), SQLite dialect
V1_DDL = """
CREATE TABLE devices (device_key VARCHAR(32) NOT NULL, gpu_name VARCHAR(200) NOT NULL, cc VARCHAR(16) NOT NULL,
    sm_count INTEGER NOT NULL, record_json TEXT NOT NULL, PRIMARY KEY (device_key));
CREATE TABLE libsets (lib_key VARCHAR(32) NOT NULL, versions_json TEXT NOT NULL, PRIMARY KEY (lib_key));
CREATE TABLE meta ("key" VARCHAR(64) NOT NULL, value TEXT NOT NULL, PRIMARY KEY ("key"));
CREATE TABLE misses (problem_key VARCHAR(200) NOT NULL, m INTEGER NOT NULL, device_key VARCHAR(32) NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (problem_key, m, device_key));
CREATE TABLE problems ("key" VARCHAR(200) NOT NULL, kind VARCHAR(16) NOT NULL, a_fmt VARCHAR(8) NOT NULL,
    w_fmt VARCHAR(8) NOT NULL, out_dtype VARCHAR(8) NOT NULL, n INTEGER NOT NULL, k INTEGER NOT NULL,
    experts INTEGER NOT NULL, top_k INTEGER NOT NULL, PRIMARY KEY ("key"));
CREATE TABLE schema_version (version INTEGER NOT NULL, PRIMARY KEY (version));
CREATE TABLE tactics (id VARCHAR(32) NOT NULL, family VARCHAR(64) NOT NULL, params_json TEXT NOT NULL,
    PRIMARY KEY (id));
CREATE INDEX ix_tactics_family ON tactics (family);
CREATE TABLE trials (id INTEGER NOT NULL, problem_key VARCHAR(200) NOT NULL, bucket INTEGER NOT NULL,
    tactic_id VARCHAR(32) NOT NULL, family VARCHAR(64) NOT NULL, device_key VARCHAR(32) NOT NULL,
    lib_key VARCHAR(32) NOT NULL, status VARCHAR(16) NOT NULL, reason TEXT NOT NULL, median_us FLOAT,
    iqr_us FLOAT, reps INTEGER NOT NULL, rel_err FLOAT, smem_model INTEGER, smem_compiled INTEGER,
    exit_signal INTEGER, created_at DATETIME NOT NULL, PRIMARY KEY (id),
    CONSTRAINT uq_trial UNIQUE (problem_key, bucket, tactic_id, device_key, lib_key),
    FOREIGN KEY(tactic_id) REFERENCES tactics (id));
CREATE INDEX ix_trials_device_key ON trials (device_key);
CREATE TABLE winners (problem_key VARCHAR(200) NOT NULL, bucket INTEGER NOT NULL, device_key VARCHAR(32) NOT NULL,
    tactic_id VARCHAR(32) NOT NULL, family VARCHAR(64) NOT NULL, lib_key VARCHAR(32) NOT NULL,
    median_us FLOAT NOT NULL, default_tactic_id VARCHAR(32) NOT NULL, default_median_us FLOAT, speedup FLOAT,
    updated_at DATETIME NOT NULL, PRIMARY KEY (problem_key, bucket, device_key),
    FOREIGN KEY(tactic_id) REFERENCES tactics (id));
INSERT INTO schema_version (version) VALUES (1);
"""


class MigrationError(Exception):
    pass


def version(conn: Connection) -> int | None:
    """The cache's schema version; None for an empty database."""
    if "schema_version" not in inspect(conn).get_table_names():
        return None
    return conn.execute(text("SELECT max(version) FROM schema_version")).scalar()


def upgrade(engine: Engine, steps: Mapping[int, Step] | None = None, target: int = SCHEMA_VERSION) -> list[int]:
    """Apply the steps from the cache's version up to `target`; returns the versions applied.
    A fresh (empty) database needs none: `create_all` builds the current schema directly."""
    steps = STEPS if steps is None else steps
    with engine.connect() as c:
        v = version(c)
    if v is None or v >= target:
        return []
    missing = [n for n in range(v + 1, target + 1) if n not in steps]
    if missing:
        raise MigrationError(f"no migration step to schema {missing[0]} (cache is at {v}, code at {target})")
    done = []
    for n in range(v + 1, target + 1):
        try:
            with engine.begin() as c:          # one transaction: the step and its version row
                if version(c) != n - 1:        # another process migrated meanwhile
                    continue
                # the version row goes first: pysqlite opens its transaction at the first DML, and DDL
                # issued after that is part of it, so a failing step rolls back its DDL too
                c.execute(text("INSERT INTO schema_version (version) VALUES (:v)"), {"v": n})
                steps[n](c)
        except IntegrityError:
            # two processes opened the same old cache at once: both read n-1, the other committed
            # version n first, this one's version row then collides; its step was rolled back
            with engine.connect() as c:
                if (version(c) or 0) < n:
                    raise
            continue
        done.append(n)
    return done


def create_v1(engine: Engine) -> None:
    """Build an empty cache exactly as version 1 wrote it (for tests and for upgrade checks)."""
    with engine.begin() as c:
        for stmt in filter(None, (s.strip() for s in V1_DDL.split(";"))):
            c.exec_driver_sql(stmt)
