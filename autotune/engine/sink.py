"""Where a search's results go: one typed sink, handed down search → workers → run_job instead of
callbacks. The search's own (autotune.engine.search's `_Results`) claims each job as a worker takes
it, stores each trial as it is decided, writes the winner when a job ends and renews the claims on
every heartbeat; `Collect` keeps what it is given (tests, bench scripts, a Ray task).

Its methods are called from worker threads: an implementation locks what they share.
"""
from __future__ import annotations

from typing import Any, Protocol

from autotune.engine.executor import Outcome
from autotune.engine.stages import Stages


class Sink(Protocol):
    stages: Stages | None           # where the workers' request time and memory figures go (None: nowhere)

    def start(self, job: Any) -> Any | None:
        """A worker is free for `job`: the job to run (fewer tactics, a warm start), or None to skip it."""

    def outcome(self, job: Any, o: Outcome) -> None:
        """One tactic's result in `job`, as soon as it is decided."""

    def finished(self, job: Any, failure: str | None = None, worker: str | None = None) -> None:
        """`job` is over: measured by `worker` (None: it had nothing to measure), or not, for
        `failure` (the job's own condition, e.g. inputs that could not be set up: its tactics stay
        unmeasured)."""

    def heartbeat(self) -> None:
        """A worker request completed: the search is alive (its job claims are renewed)."""


class Collect:
    """A sink that keeps the outcomes, the failures and the stages; starts every job as given."""

    def __init__(self, stages: Stages | None = None):
        self.stages: Stages | None = stages if stages is not None else Stages()
        self.outcomes: list[Outcome] = []
        self.failures: list[tuple[Any, str]] = []
        self.beats = 0

    def start(self, job: Any) -> Any | None:
        return job

    def outcome(self, job: Any, o: Outcome) -> None:
        self.outcomes.append(o)

    def finished(self, job: Any, failure: str | None = None, worker: str | None = None) -> None:
        if failure is not None:
            self.failures.append((job, failure))

    def heartbeat(self) -> None:
        self.beats += 1
