"""Concurrent searches on one cache share the (problem, bucket) jobs through claims (cache/claims.py).

The search claims a job when a worker is free to measure it, not up front, so searches started
together spread over the jobs. Once claimed, the job's tactics are recomputed from the stored
trials (another search may have measured some since this one planned). The claim is renewed
from the search's own process on progress events — every setup/check/time request a worker
completes is a heartbeat of the search's result sink (autotune/engine/sink.py), which calls
`JobClaims.beat` — at most every TTL/4, and marked done when the job's
winner is written. A job claimed by a live owner elsewhere is skipped and reported; a rerun
picks its winner up from the cache once that search has written it. Unfinished claims are
released when the search ends, also on an error; a killed search's claims expire after the TTL
(or at once for a process on this host that no longer exists).
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import replace
from typing import Callable, Iterable

from autotune.core import settings
from autotune.cache.claims import DONE, Claim, Claims, JobKey
from autotune.cache.store import CacheError

#: seconds a claim lives without renewal; default max(600, 2 x --timeout-s): renewals come after
#: each worker request, and one request may take up to --timeout-s (a worker start up to 180 s)
TTL_ENV = settings.CLAIM_TTL_S
MIN_TTL_S = 600.0


class ClaimSettingError(ValueError):
    """A bad claim setting (AUTOTUNE_CLAIM_TTL_S): the search does not start."""


def ttl_s(timeout_s: float) -> float:
    raw = settings.claim_ttl_s()
    if not raw:
        return max(MIN_TTL_S, 2 * timeout_s)
    try:
        v = float(raw)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise ClaimSettingError(f"{TTL_ENV} must be a positive number of seconds, got {raw!r}")
    return v


class JobClaims:
    """One search's claims. `remaining(job)` answers which of job.tactics the cache still lacks."""

    def __init__(self, store, device_key: str, lib_keys: Iterable[str], remaining: Callable, ttl: float, *,
                 now: Callable[[], float] = time.time, owner: str | None = None):
        self.ttl, self.now, self._remaining = ttl, now, remaining
        self._device, self._libs = device_key, tuple(sorted(set(lib_keys)))
        self._held: dict[JobKey, object] = {}
        self._claiming: set[JobKey] = set()      # asked for, not yet booked in _held (see start)
        self._lock = threading.Lock()
        self._last = now()
        self.elsewhere: list[tuple[object, Claim | None]] = []   # skipped: a live owner elsewhere has it
        self.settled_elsewhere: list = []     # of those, the ones finished there before this search ended
        self.complete = 0          # claimed, but another search had measured every tactic already
        self.found = 0             # trials another search stored between this one's plan and claim
        self.taken: list[tuple[object, str, str]] = []           # (job, previous owner, why it was free)
        self.lost: set[JobKey] = set()                            # expired under us and taken by another
        self.off = ""
        try:
            self._c: Claims | None = Claims(store, owner, now)
        except CacheError as e:
            self._c, self.off = None, str(e)

    def key(self, job) -> JobKey:
        return JobKey.of(job.problem.key, job.bucket, self._device, self._libs)

    def start(self, job):
        """Claim `job` before measuring it: None when another search holds it (live), else the
        job with only the tactics the cache still lacks."""
        if self._c is None:
            return job
        key = self.key(job)
        # noted before the claim is asked for: an interrupt (SIGINT/SIGTERM) between the claim's commit
        # and the bookkeeping below would otherwise leave it for `close` to miss (it then lived until
        # its TTL; seen under load in tests/test_stage_timeouts.py). Releasing a key this owner did not
        # win drops nothing: release deletes only this owner's live claims. Not in `_held` yet, so the
        # heartbeat never renews (or calls lost) a claim not won.
        with self._lock:
            self._claiming.add(key)
        got = self._c.claim(key, self.ttl)
        if not got.won:
            with self._lock:
                self._claiming.discard(key)
                self.elsewhere.append((job, got.holder))
            return None
        left = self._remaining(job)
        with self._lock:
            self._claiming.discard(key)
            self._held[key] = job
            if got.took_from and got.why != "done":
                self.taken.append((job, got.took_from, got.why))
            self.found += len(job.tactics) - len(left)
            self.complete += bool(job.tactics) and not left
        self.beat()
        return replace(job, tactics=left)

    def beat(self) -> None:
        """Renew every held claim, at most every TTL/4; note the ones another search took over."""
        if self._c is None:
            return
        t = self.now()
        with self._lock:
            if not self._held or t - self._last < self.ttl / 4:
                return
            self._last = t
            keys = list(self._held)
        if self._c.renew(self.ttl, keys) < len(keys):
            gone = {k for k in keys if getattr(self._c.get(k), "owner", None) != self._c.owner}
            with self._lock:
                self.lost |= gone

    def settled(self) -> list:
        """The skipped jobs that their owner has finished meanwhile (their winners can be read now)."""
        if self._c is None:
            return []
        with self._lock:
            pending = list(self.elsewhere)
        done = [(j, c) for j, c in pending if getattr(self._c.get(self.key(j)), "state", None) == DONE]
        with self._lock:
            self.elsewhere = [e for e in self.elsewhere if e not in done]
            self.settled_elsewhere += [j for j, _ in done]
        return [j for j, _ in done]

    def done(self, job) -> None:
        """The job's winner is written: mark its claim done (a job never claimed is left alone)."""
        key = self.key(job)
        with self._lock:
            held = self._held.pop(key, None) is not None
        if held and self._c is not None and not self._c.finish(key):
            with self._lock:
                self.lost.add(key)

    def close(self) -> None:
        """Release what is still held (an error or interrupt ended the search early)."""
        with self._lock:
            keys, self._held = [*self._held, *self._claiming], {}
            self._claiming = set()
        if keys and self._c is not None:
            try:
                self._c.release(keys)
            except CacheError:
                pass   # the cache failed under us; the claims expire after the TTL

    def notes(self) -> list[str]:
        out = []
        if self.off:
            out.append(f"claims off ({self.off}): concurrent searches on this cache may measure a job twice")
        n = len(self.elsewhere) + len(self.settled_elsewhere) + self.complete
        if n:
            s = f"{n} job{'s' if n != 1 else ''} measured by another search"
            if self.elsewhere:
                t = self.now()
                owners = sorted({c.owner for _, c in self.elsewhere if c is not None})
                left = max((c.expires_at - t for _, c in self.elsewhere if c is not None), default=0.0)
                s += (f"; {len(self.elsewhere)} still in progress there ({', '.join(owners)}; its claims are renewed "
                      f"while it runs, else expire within {left:.0f} s): rerun after it ends to pick up their winners")
            out.append(s)
        if self.taken:
            whys = sorted({f"{who} ({why})" for _, who, why in self.taken})
            out.append(f"took over {len(self.taken)} job(s) left unfinished by another search: " + ", ".join(whys))
        if self.lost:
            out.append(f"{len(self.lost)} claim(s) expired while this search measured them, so another search may "
                       f"have measured those jobs too: set {TTL_ENV} above the longest worker request")
        return out
