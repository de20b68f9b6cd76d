"""What a strategy answers: the `Strategy` protocol, and `HalvingStrategy`, which answers every hook as
successive halving does (every kept tactic of every job, halved), so a strategy overrides only
what it changes.

The search (autotune.engine.search) asks its strategy object at each step; the measuring thread
(autotune.engine.workers.run_job) asks the strategy class named by the job (`Job.strategy`), so a
job needs nothing else to be measured in another thread or a Ray task.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar, Protocol

from autotune.engine.strategies import successive_halving
from autotune.engine.options import SearchOptions
from autotune.tactics import registry


#: an outcome's status for a checked, untimed choice (`--strategy predict`): the search keeps it as the job's
#: predicted winner, never as a trial
PREDICTED = "predicted"


def kept_at(w: Any, bucket: int) -> list:
    """The job's kept rows the search times at `bucket`: those their family calls useful there
    (Family.useful; the designated default always)."""
    return [r for r in w.kept if r.tactic == w.default or registry.useful(w.problem, r.tactic, bucket)]


class SearchView(Protocol):
    """What a strategy reads of the search it serves (autotune.engine.search._Search)."""

    o: SearchOptions
    store: Any
    env: Any
    target: Any
    buckets: Any
    lib_keys: dict
    report: Any


class Strategy(Protocol):
    name: ClassVar[str]

    def configure(self, o: SearchOptions) -> SearchOptions: ...
    def kept_at(self, w: Any, bucket: int) -> list: ...                 # of a problem's kept rows: those timed at bucket
    def prepare(self, s: SearchView, work: list) -> None: ...           # after the static steps, before compiling
    def redo(self) -> frozenset[str]: ...                               # stored statuses measured again
    def precompiled(self, items: list) -> list: ...                     # of the kept tactics: those compiled ahead
    def job(self, s: SearchView, job: Any, kept_ids: set[str]) -> tuple[Any, bool]: ...
    def order(self, jobs: list) -> list: ...                            # the jobs in the order workers take them
    def start(self, s: SearchView, job: Any) -> Any: ...                # as a worker takes the job
    def without(self, s: SearchView, job: Any, bad: set[str]) -> Any: ...   # less tactics whose compile failed
    @staticmethod
    def measure(ex: Any, job: Any, timer: Any, h: Any, emit: Callable,   # in the measuring thread
                wait: Callable[[list], list] | None = None) -> None: ...


class HalvingStrategy:
    """Every kept tactic of every job, by successive halving (autotune.engine.strategies.successive_halving)."""

    name: ClassVar[str] = "halving"

    def configure(self, o: SearchOptions) -> SearchOptions:
        """The search's options as this strategy runs them."""
        return o

    def kept_at(self, w: Any, bucket: int) -> list:
        """Of a problem's kept rows (`w.kept`), those the search times at `bucket` (`kept_at`)."""
        return kept_at(w, bucket)

    def prepare(self, s: SearchView, work: list) -> None:
        """Plan before anything compiles (work: the problems with their kept tactics and default)."""

    def redo(self) -> frozenset[str]:
        """Statuses of stored trials this strategy measures again (besides --retry-failed's)."""
        return frozenset()

    def precompiled(self, items: list) -> list:
        """Of the compilable kept tactics (Planned rows), those compiled ahead of timing."""
        return items

    def job(self, s: SearchView, job: Any, kept_ids: set[str]) -> tuple[Any, bool]:
        """The job as this strategy measures it (`job.tactics`: what the cache lacks) and whether
        the tactics the cache held count as resumed."""
        return replace(job, strategy=self.name), True

    def order(self, jobs: list) -> list:
        """The jobs in the order workers take them (problem by problem, buckets ascending)."""
        return jobs

    def start(self, s: SearchView, job: Any) -> Any:
        """The job as a worker takes it (after its claim)."""
        return job

    def without(self, s: SearchView, job: Any, bad: set[str]) -> Any:
        """The job less the tactics in `bad` (their precompile failed while the job waited for it)."""
        return replace(job, tactics=tuple(t for t in job.tactics if t.id not in bad))

    @staticmethod
    def measure(ex: Any, job: Any, timer: Any, h: Any, emit: Callable,
                wait: Callable[[list], list] | None = None) -> None:
        """Measure `job.tactics` on an executor set up for the job; each outcome to `emit`. `wait`
        (the compile pipeline, autotune.engine.pipeline) takes a batch of tactics about to be
        measured and returns them once compiled, without those whose compile failed; a job's
        first tactics were waited for before this is called."""
        successive_halving.measure(ex, job.tactics, job.default_id, timer, h, emit, margin=job.margin)
