"""ORM tables of the tactic cache (SQLAlchemy 2.x declarative style).

Only plain records (autotune.core.records) leave the cache package; these row classes stay inside.
Keys follow anchors.md §2: a trial is keyed by (problem, bucket, tactic, device, libs), a winner
by (problem, bucket, device) and carries the lib_key it was measured under, so each entry can be
validated on its own. Schema 3 adds the code key (autotune.core.codekey) to both: the library key
joined with the digest of the member's sources, part of a trial's key. Schema 4 adds
`replay_checked` to both: the trial passed the replay check (autotune.engine.replay). Schema 5 marks a winner
predicted (the rank model's checked first choice, never timed: `--strategy predict`).

The trials, winners and misses tables hold the columns of their records (autotune.cache.columns,
derived from autotune.core.records) plus row bookkeeping; tests/test_cache_columns.py checks that
these classes declare exactly those, so a field added to a record without its column here (or the
reverse) fails.
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.sql.expression import false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from autotune.cache.columns import TRIAL_KEY

#: bump with every change to the tables below, and add the step to cache/migrations.py (STEPS);
#: tests/test_migrations.py upgrades a cache built with the first released schema and compares
SCHEMA_VERSION = 5


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class Meta(Base):
    """Free-form key/value rows; exports record their format and payload checksum here."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class DeviceRow(Base):
    __tablename__ = "devices"
    device_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    gpu_name: Mapped[str] = mapped_column(String(200))
    cc: Mapped[str] = mapped_column(String(16))
    sm_count: Mapped[int] = mapped_column(Integer)
    #: full Env.to_dict() (driver, CUDA runtime, package ...): recorded, not keyed
    record_json: Mapped[str] = mapped_column(Text)


class LibsetRow(Base):
    __tablename__ = "libsets"
    lib_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    versions_json: Mapped[str] = mapped_column(Text)


class ProblemRow(Base):
    __tablename__ = "problems"
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    a_fmt: Mapped[str] = mapped_column(String(8))
    w_fmt: Mapped[str] = mapped_column(String(8))
    out_dtype: Mapped[str] = mapped_column(String(8))
    n: Mapped[int] = mapped_column(Integer)
    k: Mapped[int] = mapped_column(Integer)
    experts: Mapped[int] = mapped_column(Integer, default=1)
    top_k: Mapped[int] = mapped_column(Integer, default=1)


class TacticRow(Base):
    __tablename__ = "tactics"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    family: Mapped[str] = mapped_column(String(64), index=True)
    params_json: Mapped[str] = mapped_column(Text)


class TrialRow(Base):
    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint(*TRIAL_KEY, name="uq_trial"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    problem_key: Mapped[str] = mapped_column(String(200))
    bucket: Mapped[int] = mapped_column(Integer)
    tactic_id: Mapped[str] = mapped_column(ForeignKey("tactics.id"))
    family: Mapped[str] = mapped_column(String(64))
    device_key: Mapped[str] = mapped_column(String(32), index=True)
    lib_key: Mapped[str] = mapped_column(String(32))
    #: schema 3: lib_key joined with the member's sources (autotune.core.codekey); '' before
    code_key: Mapped[str] = mapped_column(String(32), default="", server_default="")
    status: Mapped[str] = mapped_column(String(16))          # 'ok' | 'dropped' | 'rejected' | 'failed'
    reason: Mapped[str] = mapped_column(Text, default="")
    median_us: Mapped[float | None] = mapped_column(Float)
    iqr_us: Mapped[float | None] = mapped_column(Float)
    reps: Mapped[int] = mapped_column(Integer, default=0)
    rel_err: Mapped[float | None] = mapped_column(Float)
    smem_model: Mapped[int | None] = mapped_column(Integer)
    smem_compiled: Mapped[int | None] = mapped_column(Integer)
    exit_signal: Mapped[int | None] = mapped_column(Integer)
    #: schema 4: passed the replay check (served path, CUDA-graph replay; autotune.engine.replay)
    replay_checked: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WinnerRow(Base):
    __tablename__ = "winners"
    problem_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    tactic_id: Mapped[str] = mapped_column(ForeignKey("tactics.id"))
    family: Mapped[str] = mapped_column(String(64))
    lib_key: Mapped[str] = mapped_column(String(32))
    median_us: Mapped[float] = mapped_column(Float)
    default_tactic_id: Mapped[str] = mapped_column(String(32))
    default_median_us: Mapped[float | None] = mapped_column(Float)
    speedup: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    #: schema 3: the winning trial's code key ('' before code keys: never served)
    code_key: Mapped[str] = mapped_column(String(32), default="", server_default="")
    #: schema 4: the winning trial passed the replay check (False before it)
    replay_checked: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    #: schema 5: a predicted winner (`--strategy predict`: checked, not timed); a measured one replaces it
    predicted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class CompilerFigureRow(Base):
    """Schema 3: what a compiler allocated for one config (shared-memory bytes, tensor-memory
    columns), so a verdict outside the region a static model was checked on asks the compiler once
    per (compiler version, arch, weight format, tactic, member sources) for every search on this
    cache. `error` set: the config did not compile there (the verdict stays unknown)."""

    __tablename__ = "compiler_figures"
    compiler: Mapped[str] = mapped_column(String(64), primary_key=True)     # e.g. "triton 3.9.0"
    arch: Mapped[str] = mapped_column(String(16), primary_key=True)
    w_fmt: Mapped[str] = mapped_column(String(8), primary_key=True)
    tactic_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    code: Mapped[str] = mapped_column(String(32), primary_key=True)         # digest of the member's sources
    shared: Mapped[int | None] = mapped_column(Integer)
    tmem: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


class MissRow(Base):
    __tablename__ = "misses"
    problem_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    m: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class ClaimRow(Base):
    """Schema 2: a search's claim on one (problem, bucket) job, so that concurrent searches on one
    cache measure each job once (cache/claims.py, docs/search.md "Several searches on one cache").
    Times are seconds since the epoch from the claiming host's clock."""

    __tablename__ = "claims"
    __table_args__ = (Index("ix_claims_owner", "owner"),)
    problem_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    bucket: Mapped[int] = mapped_column(Integer, primary_key=True)
    device_key: Mapped[str] = mapped_column(String(32), primary_key=True)
    lib_set: Mapped[str] = mapped_column(String(32), primary_key=True)    # digest of the search's lib keys
    owner: Mapped[str] = mapped_column(String(200))                       # host:pid:random
    claimed_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))                        # 'claimed' | 'done'
