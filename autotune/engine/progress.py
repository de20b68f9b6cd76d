"""How a search reports progress: a rich bar on a terminal, plain lines elsewhere (CI logs, `| tee`).

Plain lines come when a problem's last bucket finishes — with that problem's verdict: the winner of
each bucket — and otherwise at most every `every_s` seconds of the injected clock, so a long search
shows signs of life without flooding a log. Each line counts the trials decided so far and the
(problem, bucket) jobs done of all; a job's kept tactics are no measure of the work left (a ranked
job decides about a tenth of them, a verifying one a handful), so the line gives no trial total.
Each line still short of the end carries a time-remaining figure from the time per finished job
measured so far: per problem, since one problem's jobs can cost 100x another's (GLM-5's grouped MoE
against its dense layers on a CPU); a problem with no finished job yet is costed at the mean of
those measured. The wall time between two decided trials goes to the problem of the second, so with
several workers the costs stay in wall time. Before any job finishes it says nothing.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable


def clock_text(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class Progress:
    """Plain progress lines: `write(line)` per finished problem or every `every_s` seconds."""

    def __init__(self, write: Callable[[str], None] | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self._write = write or (lambda s: print(s, file=sys.stderr, flush=True))
        self.every_s, self._clock = every_s, clock
        self.done = self.jobs_done = self._jobs = 0
        self._left: dict[str, int] = {}      # problem key -> buckets still running
        self._cost: dict[str, list] = {}     # problem key -> [jobs finished, wall seconds its trials took]
        self._won: dict[str, list[tuple[int, str]]] = {}  # problem key -> (M, "M=b tactic time") of its finished buckets
        self._last = self._mark = 0.0

    def start(self, jobs, resumed: int) -> None:
        self.done = resumed
        self._jobs = len(jobs)
        for j in jobs:
            k = j.problem.key
            self._left[k] = self._left.get(k, 0) + 1
        self._last = self._mark = self._clock()

    def note(self, line: str) -> None:
        """A line of its own (what the search is about to measure), written at once."""
        self._write(line)

    def left_s(self) -> float | None:
        """Seconds still to go, from the measured time per finished job of each problem (None: no job
        finished yet)."""
        done = {k: c for k, c in self._cost.items() if c[0]}
        if not done:
            return None
        mean = sum(c[1] for c in done.values()) / sum(c[0] for c in done.values())
        return sum(left * (done[k][1] / done[k][0] if k in done else mean)
                   for k, left in self._left.items() if left > 0)

    def _eta(self) -> str:
        s = self.left_s()
        return "" if s is None or self.jobs_done >= self._jobs else f"; about {clock_text(s)} left"

    def _line(self, what: str) -> None:
        self._last = self._clock()
        self._write(f"progress: {self.done} trials, {self.jobs_done}/{self._jobs} (problem, bucket) "
                    f"jobs{self._eta()}{what}")

    def advance(self, n: int, job: Any = None) -> None:
        self.done += n
        now = self._clock()
        if job is not None and n:
            self._cost.setdefault(job.problem.key, [0, 0.0])[1] += now - self._mark
        self._mark = now
        if n and now - self._last >= self.every_s:
            self._line("")

    def job_done(self, job, winner: Any = None) -> None:
        self.jobs_done += 1
        k = job.problem.key
        self._left[k] -= 1
        self._cost.setdefault(k, [0, 0.0])[0] += 1
        if winner is not None:
            how = " predicted" if getattr(winner, "predicted", False) else f" {winner.median_us:.4g} us"
            self._won.setdefault(k, []).append((job.bucket, f"M={job.bucket} {_tactic_text(winner)}{how}"))
        if not self._left[k]:
            won = sorted(self._won.pop(k, []))
            verdict = f": {len(won)} bucket{'s' * (len(won) != 1)} won — " + "; ".join(t for _, t in won) if won \
                else ": no winner"
            self._line(f"; {k} done{verdict}")

    def close(self) -> None:
        pass


def _tactic_text(w: Any) -> str:
    try:
        from autotune.core.tactic import Tactic
        return str(Tactic.from_json(w.params_json))
    except (ValueError, TypeError, AttributeError):
        return str(getattr(w, "tactic_id", "?"))


class Bar(Progress):
    """A transient rich progress bar over the (problem, bucket) jobs (a terminal); nothing at all when
    `enabled` is False. Its time-remaining figure is `Progress.left_s` (per problem), not rich's rate of
    the last few steps."""

    def __init__(self, enabled: bool):
        super().__init__(write=lambda s: None)
        self._enabled = enabled
        self._p: Any = None          # a rich Progress once started on a terminal

    def note(self, line: str) -> None:
        if self._enabled:
            print(line, file=sys.stderr, flush=True)

    def start(self, jobs, resumed: int) -> None:
        super().start(jobs, resumed)
        if self._enabled and self._jobs:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn
            self._p = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                   TextColumn("{task.fields[trials]} trials"), TextColumn("{task.fields[eta]}"),
                                   transient=True)
            self._p.start()
            self._task = self._p.add_task("jobs", total=self._jobs, trials=self.done, eta="")

    def advance(self, n: int, job: Any = None) -> None:
        Progress.advance(self, n, job)
        if self._p and n:
            self._p.update(self._task, trials=self.done)

    def _line(self, what: str) -> None:
        self._last = self._clock()

    def job_done(self, job, winner: Any = None) -> None:
        super().job_done(job, winner)
        if self._p:
            s = self.left_s()
            self._p.update(self._task, advance=1, eta="" if s is None else f"about {clock_text(s)} left")

    def close(self) -> None:
        if self._p:
            self._p.stop()
