"""Claims on (problem, bucket) jobs: several searches on one cache measure each job once.

A search claims a job before measuring it, renews the claim while it measures, and marks it
`done` once the job's winner is written. A claim is a row of the `claims` table keyed by
`JobKey` (problem, bucket, device, the digest of the search's library keys) with its owner
(`host:pid:random`) and an expiry time. Another search may take a job over when the claim is
done, has expired, or — on the same host — its owner process no longer exists (kill -9).

Every operation is one short transaction whose outcome is decided by the database, never by a
read followed by a write: a claim is `INSERT ... ON CONFLICT DO UPDATE ... WHERE <claim is free>`
(SQLite and PostgreSQL both run it atomically: SQLite holds the write lock for the statement,
PostgreSQL locks the conflicting row and checks the WHERE against its newest version), and the
number of rows it changed says whether this owner holds the job. Renew, finish, release and the
takeover of a dead owner's claim are UPDATE/DELETEs conditioned on the owner column.

Times come from `now()` (seconds, injectable so tests move the clock instead of sleeping); they
are compared across hosts, so hosts sharing a cache need clocks that agree to well within the TTL.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import socket
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from sqlalchemy import and_, or_, select

from autotune.cache.schema import ClaimRow
from autotune.cache.store import CacheError, Store

CLAIMED, DONE = "claimed", "done"
_T = ClaimRow.__table__
_KEY_COLS = ("problem_key", "bucket", "device_key", "lib_set")
DIALECTS = ("sqlite", "postgresql")


@dataclass(frozen=True)
class JobKey:
    problem_key: str
    bucket: int
    device_key: str
    lib_set: str

    @classmethod
    def of(cls, problem_key: str, bucket: int, device_key: str, lib_keys: Iterable[str]) -> "JobKey":
        """lib_set: a digest of the sorted distinct library keys the job's trials are measured under."""
        libs = ",".join(sorted(set(lib_keys)))
        return cls(problem_key, bucket, device_key, hashlib.sha256(libs.encode()).hexdigest()[:16])

    def where(self):
        return and_(*(_T.c[c] == getattr(self, c) for c in _KEY_COLS))

    def __str__(self) -> str:
        return f"{self.problem_key} m={self.bucket}"


@dataclass(frozen=True)
class Claim:
    key: JobKey
    owner: str
    claimed_at: float
    expires_at: float
    state: str

    def live(self, now: float) -> bool:
        return self.state == CLAIMED and self.expires_at > now


@dataclass(frozen=True)
class Attempt:
    """What claim() came to: `won` (this owner holds the job now), the row as it stands after the
    attempt (`holder`; this owner's when won), and whose claim was taken over, if any."""

    won: bool
    holder: Claim | None
    took_from: str | None = None
    why: str = ""           # why the previous claim was free: "expired", "owner gone", "done"


def owner_id() -> str:
    """host:pid:random: unique per search, and on the same host it names a process to check."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def owner_alive(owner: str) -> bool | None:
    """False when `owner` is a process on this host that no longer exists; None when that cannot
    be told (another host, or not a host:pid:random owner). A reused pid only delays a takeover."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True      # exists, owned by another user
    return True


def _row(r) -> Claim:
    return Claim(JobKey(r.problem_key, r.bucket, r.device_key, r.lib_set), r.owner, r.claimed_at, r.expires_at,
                 r.state)


class Claims:
    """Claim operations of one owner on one writable Store."""

    def __init__(self, store: Store, owner: str | None = None, now: Callable[[], float] = time.time):
        if store.readonly:
            raise CacheError(f"claims need a writable cache ({store.url} is open read-only)")
        self.dialect = store.engine.dialect.name
        if self.dialect not in DIALECTS:
            raise CacheError(f"claims need SQLite or PostgreSQL, not {self.dialect}")
        self.store, self.owner, self.now = store, owner or owner_id(), now

    def _count(self, stmt) -> int:
        """Run one write statement in its own transaction; the rows it changed. PostgreSQL counts
        them from RETURNING (through SQLAlchemy, psycopg reports rowcount -1 for INSERT ... ON
        CONFLICT); SQLite from rowcount (RETURNING needs SQLite 3.35)."""
        out = [0]
        if self.dialect == "postgresql":
            self.store._write(lambda s: out.__setitem__(0, len(s.execute(stmt.returning(_T.c.owner)).all())))
        else:
            self.store._write(lambda s: out.__setitem__(0, s.execute(stmt).rowcount))
        return out[0]

    # -- reading
    def get(self, key: JobKey) -> Claim | None:
        r = self.store._read(lambda s: s.execute(select(_T).where(key.where())).first())
        return _row(r) if r is not None else None

    def all(self) -> list[Claim]:
        q = select(_T).order_by(*(_T.c[c] for c in _KEY_COLS))
        return [_row(r) for r in self.store._read(lambda s: s.execute(q).all())]

    # -- writing
    def claim(self, key: JobKey, ttl_s: float) -> Attempt:
        """Take the job if it is unclaimed, done, expired, already this owner's, or held by a
        process on this host that is gone. Atomic: of several concurrent claimers one wins."""
        if not ttl_s > 0:
            raise ValueError(f"a claim's time to live must be > 0 s, got {ttl_s}")
        before, t = self.get(key), self.now()
        row = {"problem_key": key.problem_key, "bucket": key.bucket, "device_key": key.device_key,
               "lib_set": key.lib_set, "owner": self.owner, "claimed_at": t, "expires_at": t + ttl_s,
               "state": CLAIMED}
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        free = or_(_T.c.state == DONE, _T.c.expires_at <= t, _T.c.owner == self.owner)
        stmt = insert(_T).values(**row).on_conflict_do_update(
            index_elements=list(_KEY_COLS), set_={c: row[c] for c in ("owner", "claimed_at", "expires_at", "state")},
            where=free)
        won = self._count(stmt) == 1
        if not won:
            holder = self.get(key)
            if holder is not None and holder.state == CLAIMED and owner_alive(holder.owner) is False:
                if self._take(key, holder.owner, ttl_s):
                    return Attempt(True, self.get(key), holder.owner, "owner gone")
            return Attempt(False, self.get(key) if holder is None else holder)
        took = why = None
        if before is not None and before.owner != self.owner:
            took = before.owner
            why = "done" if before.state == DONE else "expired"
        return Attempt(True, self.get(key), took, why or "")

    def _take(self, key: JobKey, from_owner: str, ttl_s: float) -> bool:
        """Compare-and-swap the owner: succeeds only while `from_owner` still holds the claim."""
        t = self.now()
        stmt = (_T.update().where(key.where(), _T.c.owner == from_owner, _T.c.state == CLAIMED)
                .values(owner=self.owner, claimed_at=t, expires_at=t + ttl_s))
        return self._count(stmt) == 1

    def renew(self, ttl_s: float, keys: Iterable[JobKey] | None = None) -> int:
        """Push the expiry of this owner's live claims (all, or `keys`) to now + ttl_s; returns how
        many it renewed. A claim that another search took over meanwhile is not this owner's
        any more and is not counted."""
        cond = self._live(keys)
        return 0 if cond is None else self._count(_T.update().where(*cond).values(expires_at=self.now() + ttl_s))

    def finish(self, key: JobKey) -> bool:
        """Mark the job done (its winner is written). False if the claim was not this owner's."""
        stmt = (_T.update().where(key.where(), _T.c.owner == self.owner)
                .values(state=DONE, expires_at=self.now()))
        return self._count(stmt) == 1

    def release(self, keys: Iterable[JobKey] | None = None) -> int:
        """Drop this owner's unfinished claims (all, or `keys`) so another search may take them now."""
        cond = self._live(keys)
        return 0 if cond is None else self._count(_T.delete().where(*cond))

    def _live(self, keys: Iterable[JobKey] | None) -> list | None:
        """The WHERE of this owner's unfinished claims (all, or `keys`); None for an empty `keys`."""
        cond = [_T.c.owner == self.owner, _T.c.state == CLAIMED]
        if keys is not None:
            keys = list(keys)
            if not keys:
                return None
            cond.append(or_(*(k.where() for k in keys)))
        return cond
