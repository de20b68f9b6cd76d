"""How a search reports progress: a rich bar on a terminal, plain lines elsewhere (CI logs, `| tee`).

Plain lines come when a problem's last bucket finishes and otherwise at most every `every_s`
seconds of the injected clock, so a long search shows signs of life without flooding a log.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable


class Progress:
    """Plain progress lines: `write(line)` per finished problem or every `every_s` seconds."""

    def __init__(self, write: Callable[[str], None] | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self._write = write or (lambda s: print(s, file=sys.stderr, flush=True))
        self.every_s, self._clock = every_s, clock
        self.done = self.total = self.jobs_done = 0
        self._left: dict[str, int] = {}      # problem key -> buckets still running
        self._last = 0.0

    def start(self, jobs, resumed: int) -> None:
        self.total = sum(len(j.tactics) for j in jobs) + resumed
        self.done = resumed
        self._jobs = len(jobs)
        for j in jobs:
            self._left[j.problem.key] = self._left.get(j.problem.key, 0) + 1
        self._last = self._clock()

    def note(self, line: str) -> None:
        """A line of its own (what the search is about to measure), written at once."""
        self._write(line)

    def _line(self, what: str) -> None:
        self._last = self._clock()
        self._write(f"progress: {self.done}/{self.total} trials, {self.jobs_done}/{self._jobs} (problem, bucket) jobs{what}")

    def advance(self, n: int) -> None:
        self.done += n
        if n and self._clock() - self._last >= self.every_s:
            self._line("")

    def job_done(self, job) -> None:
        self.jobs_done += 1
        self._left[job.problem.key] -= 1
        if not self._left[job.problem.key]:
            self._line(f"; {job.problem.key} done")

    def close(self) -> None:
        pass


class Bar(Progress):
    """A transient rich progress bar (a terminal); nothing at all when `enabled` is False."""

    def __init__(self, enabled: bool):
        super().__init__(write=lambda s: None)
        self._enabled = enabled
        self._p: Any = None          # a rich Progress once started on a terminal

    def note(self, line: str) -> None:
        if self._enabled:
            print(line, file=sys.stderr, flush=True)

    def start(self, jobs, resumed: int) -> None:
        super().start(jobs, resumed)
        if self._enabled and self.total:
            from rich.progress import Progress as RichProgress   # rich draws only on a terminal
            self._p = RichProgress(transient=True)
            self._p.start()
            self._task = self._p.add_task("measuring", total=self.total, completed=self.done)

    def advance(self, n: int) -> None:
        self.done += n
        if self._p and n:
            self._p.advance(self._task, n)

    def job_done(self, job) -> None:
        self.jobs_done += 1

    def close(self) -> None:
        if self._p:
            self._p.stop()
