"""The compile stage off the critical path (issue #28): compile ahead while measuring.

Instead of a barrier (every precompile done before the first job starts), the search starts one
compile pool (autotune.engine.precompile.Pool, the same isolated, killable workers under
--timeout-s) and its measuring workers together:

* **ahead**, in job order, problem by problem: what the barrier compiled — every kept tactic of
  families that compile, or with `--strategy ranked` every tactic some job of the problem measures
  first (the model's top and the extras: the default, novel members). A job starts (the worker's
  start, its input setup and reference run meanwhile) and, before measuring, waits until every
  ahead item of its problem is compiled or failed; later problems still compile. A job then holds
  exactly the tactics it would have held after the barrier, so it measures the same ones.
* **background** (ranked only, lowest priority): the rest of each job's candidates up to its cap,
  problem by problem in job order, batch by batch in predicted order within a problem — the order
  the jobs reach them (they run problem by problem). Level by level over every problem (every
  problem's second batch before any third) made the first problems' jobs wait on compiles that the
  last problems need much later: 21 s of waits in a 110 s `--max-tokens 64` main job on the H200.
* **a later batch** of a ranked job waits for its tactics too (raised to the front of the queue,
  submitted if the background had not got there), so the measuring worker never compiles a
  tactic of these families itself, and a compiler that crashes or hangs costs a compile worker,
  never the measuring worker.

A failed precompile stays what it was: a failed trial at bucket 0 ("precompile failed: …") for
every bucket, and the tactic is out of every job; a job never measures a tactic whose compile
failed or is still running. When the last job is done the pool is closed: what is still queued
or compiling (background the jobs did not need) is dropped, not failed.

Figures (autotune.engine.stages): `compile` is the wall time the jobs spent waiting on the pool
(the critical path, summed over measuring workers; count: items waited for), `compile overlapped`
the wall time the pool had work while no job waited on it (count: items the pool compiled or
failed). Ray and --no-isolate keep the barrier (`overlaps`).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from autotune.core.arch import Arch
from autotune.core.tactic import Tactic
from autotune.engine import audit, precompile
from autotune.engine.strategies.ranked import batches
from autotune.tactics import registry

AHEAD, BACKGROUND = 1, 2      # priorities (smaller first); a job waiting on an item raises it above both


def overlaps(runner) -> bool:
    """Whether a search with this Runner compiles while it measures (isolated local workers), or
    keeps the barrier (Ray ships jobs to other hosts; --no-isolate has no processes to overlap)."""
    return runner.isolate and not runner.ray and runner.overlap_compile


def compiles(t: Tactic) -> bool:
    return registry.get(t.family).compiles


def prestart(families: Sequence, device: str, target: Arch, runner) -> precompile.Pool | None:
    """A compile pool whose workers start (and import the compiling families) now, while the
    search plans; None when nothing of these families can compile here or the search keeps the
    barrier. The caller closes it (through the Pipeline `start` makes of it, or itself)."""
    names = sorted(f.name for f in families if f.compiles and f.available(device)[0])
    if not names or not overlaps(runner):
        return None
    pool = _pool(target, runner, names)
    pool.warm()
    return pool


def _pool(target: Arch, runner, names: Sequence[str]) -> precompile.Pool:
    return precompile.Pool(target.name, runner.compile_workers, runner.families, timeout_s=runner.timeout_s,
                           preload=names)


class Pipeline:
    """One search's compile pool and what it knows of the kept rows (shared by its gates)."""

    def __init__(self, rows: dict, target: Arch, runner, report,
                 failed: Callable, refilter: Callable, pool: precompile.Pool | None = None):
        self.rows, self.target, self.report = rows, target, report     # rows: (problem key, id) -> Planned
        self._failed, self._refilter = failed, refilter
        self.pool = pool or _pool(target, runner, sorted({r.tactic.family for r in rows.values()}))
        self._lock = threading.Lock()
        self.waited = 0
        self.closed = False

    def submit(self, keys: Sequence[Hashable], prio: Callable[[int], tuple]) -> None:
        self.pool.submit((k, k[0], self.rows[k].tactic.to_json(), prio(i)) for i, k in enumerate(keys))

    def wait(self, keys: Sequence[Hashable], stages) -> dict:
        """Wait for `keys` (the time into stage `compile`), then record what settled meanwhile."""
        left = [k for k in keys if self.pool.result(k) is None]
        try:
            if left:
                tick = (lambda dt: stages.add("compile", dt, 0)) if stages is not None else (lambda dt: None)
                self.pool.wait(left, tick=tick)
                if stages is not None:
                    stages.add("compile", 0.0, len(left))
            return {k: self.pool.result(k) for k in keys}
        finally:
            self.record()

    def record(self) -> None:
        """Every item settled since the last call: counted in the report, a failure stored
        (`failed(row, error, signal)`: bucket 0, out of every job)."""
        with self._lock:     # one thread at a time, so the report's lists stay in settle order
            for key, _item, (err, smem, sig) in self.pool.drain():
                r = self.rows[key]
                audit.note_compiled(r, err, smem, self.target, self.report)
                if err is not None:
                    self._failed(r, err, sig)

    def close(self, stages) -> None:
        """The measuring is over: drop the background, record what settled, give the figures."""
        if self.closed:
            return
        self.closed = True
        left = self.pool.close()
        self.record()
        stages.add("compile overlapped", self.pool.overlapped_s, self.pool.settled)
        if left:
            self.report.notes.append(f"compile pool: {self.pool.settled} compiled or failed; {left} queued "
                                     "ahead of later batches were not needed and were dropped")


@dataclass
class Gate:
    """What a job of one problem waits for before measuring (`ready`) and before each later
    batch of a ranked job (`batch`). Lives in the search's process (never shipped to Ray)."""

    pipe: Pipeline
    problem_key: str
    ahead: tuple

    def ready(self, job, stages=None):
        """The job once every ahead item of its problem is settled, without the tactics whose
        precompile failed (the barrier's job, exactly)."""
        got = self.pipe.wait(self.ahead, stages)
        bad = {k[1] for k, (err, _smem, _sig) in got.items() if err is not None}
        return self.pipe._refilter(job, bad)

    def batch(self, tactics: Sequence[Tactic], stages=None) -> list[Tactic]:
        """`tactics` (a later batch) once each one's precompile is settled, without the failed ones."""
        keys = [(self.problem_key, t.id) for t in tactics if compiles(t)]
        new = [k for k in keys if not self.pipe.pool.known(k) and k in self.pipe.rows]
        if new:
            self.pipe.submit(new, lambda i: (0, i))
        got = self.pipe.wait([k for k in keys if k in self.pipe.rows], stages)
        return [t for t in tactics if (got.get((self.problem_key, t.id)) or (None,))[0] is None]


def start(work: Sequence, jobs: Sequence, precompiled: Callable[[list], list], target: Arch, runner, report,
          failed: Callable, refilter: Callable, pool: precompile.Pool | None = None
          ) -> tuple[Pipeline | None, dict[str, Gate]]:
    """Start compiling for `jobs` (the search's, in order; `work`: its problems' kept rows) in
    `pool` (`prestart`'s) or a new one, and return the pipeline with one gate per problem that
    has a job to measure. `precompiled` (the strategy's) picks, of the compilable kept rows, those
    a job waits for before it measures; a ranked job's later batches follow at low priority.
    (None, {}) when nothing compiles (a given pool is left to the caller)."""
    rows = {(w.problem.key, r.tactic.id): r for w in work for r in w.kept if compiles(r.tactic)}
    order = list(dict.fromkeys(j.problem.key for j in jobs if j.tactics))
    if not rows or not order:
        return None, {}
    firsts = {(r.problem.key, r.tactic.id) for r in precompiled(list(rows.values()))}
    ahead: dict[str, list] = {pk: [] for pk in order}
    for (pk, tid) in rows:
        if pk in ahead and (pk, tid) in firsts:
            ahead[pk].append((pk, tid))
    pipe = Pipeline(rows, target, runner, report, failed, refilter, pool)
    for pi, pk in enumerate(order):
        pipe.submit(ahead[pk], lambda i, pi=pi: (AHEAD, pi, i))
    if any(j.tactics and j.rank is not None for j in jobs):     # the rest of every ranked job's candidates, batch by batch
        rank_of = {pk: i for i, pk in enumerate(order)}
        later: dict = {}
        for j in jobs:
            if not j.tactics or j.rank is None:
                continue
            r = batches.Ranker(j.rank)
            for pos in range(r.first, min(r.cap, len(j.rank.order))):
                key = (j.problem.key, j.rank.order[pos].id)
                if key in rows:
                    prio = (BACKGROUND, rank_of[j.problem.key], (pos - r.first) // j.rank.cfg.step, pos)
                    later[key] = min(later.get(key, prio), prio)
        keys = sorted(later, key=later.__getitem__)
        pipe.submit(keys, lambda i: later[keys[i]])
    return pipe, {pk: Gate(pipe, pk, tuple(ahead[pk])) for pk in order}
