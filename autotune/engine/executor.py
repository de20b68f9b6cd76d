"""What the measuring side answers and how it fails: the protocol between halving and the workers.

`halving` drives an `Executor`; `workers` provides them (in-process, a worker process, Ray).
Both import this module and neither imports the other's internals for it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from autotune.cache.files import CacheError
from autotune.core.tactic import Tactic

if TYPE_CHECKING:     # a type only: the CLI imports these errors without loading torch
    from autotune.engine.timing import TimerConfig


class TacticError(Exception):
    """The tactic failed (raised, wrong result); the worker is fine."""


class WorkerStartError(RuntimeError):
    """A fresh worker could not start (broken environment): abort the search, fail no tactic."""


class JobFailed(Exception):
    """The job could not be measured for a reason outside every tactic (its inputs could not be
    set up, twice): its tactics stay unmeasured, none is failed."""


class WorkerLost(Exception):
    """The worker died or was killed while serving a request."""

    def __init__(self, reason: str, exit_signal: int | None):
        super().__init__(reason)
        self.reason, self.exit_signal = reason, exit_signal


class Executor(Protocol):
    device: str

    def setup(self, problem_key: str, bucket: int, seed: int) -> None: ...
    def check(self, tactic: Tactic) -> dict: ...
    def time(self, tactic: Tactic, timer: TimerConfig) -> dict: ...
    def replay(self, tactic: Tactic) -> dict: ...       # the replay check (autotune.engine.replay)
    def forget(self, tactic: Tactic) -> None: ...       # done with this tactic in this job: free its memory
    def end_job(self) -> dict: ...                      # the job is over: free it all; memory figures
    def recycle(self) -> None: ...                      # start afresh (a new process where there is one)
    def close(self) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """What one tactic came to in one (problem, bucket)."""

    tactic: Tactic
    status: str                  # ok | dropped | failed
    reason: str = ""
    median_us: float | None = None
    iqr_us: float | None = None
    reps: int = 0
    rel_err: float | None = None
    smem_compiled: int | None = None
    exit_signal: int | None = None
    replay_checked: bool = False     # passed the replay check (autotune.engine.replay)


class StoreFailed(CacheError):
    """A write the search cannot complete: it ends, naming the stage (one line, exit 2)."""


@contextmanager
def store_stage(what: str):
    """Turn a cache error inside into StoreFailed naming `what` (the search's store stage)."""
    try:
        yield
    except StoreFailed:
        raise
    except CacheError as e:
        raise StoreFailed(f"search stopped at the store stage, {what}: {e}") from None


def exit_now(code: int) -> None:
    """A worker process (measuring or compiling) leaves without the interpreter's teardown: every
    reply is written and flushed, nothing else is owed, and tearing down torch/Triton/CuPy with a
    CUDA context of many GB held took past the parent's 10 s close wait on the H200 (the search's
    last ~12 s)."""
    import os
    import sys
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
