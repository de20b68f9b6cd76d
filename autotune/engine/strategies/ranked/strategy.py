"""`--strategy ranked` (the default): per (problem, bucket) only what the ranking model puts first,
its bests (the fastest its training data timed there), the neighbouring buckets' winners and the
default, with the adaptive stop (the batches: autotune.engine.strategies.ranked.batches; the model
loading and plans: autotune.engine.strategies.ranked.plans) — in full at the buckets the cut
measures, in one verifying round at the others (autotune.engine.strategies.ranked.cut). Without a
model covering the arch it measures as halving does, and the notes say so."""
from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import Any, Callable

from autotune.engine.strategies import successive_halving
from autotune.engine.strategies.ranked import batches, cut, plans
from autotune.engine.strategies.base import HalvingStrategy, SearchView
from autotune.tactics import registry


class RankedStrategy(HalvingStrategy):
    name = "ranked"

    def __init__(self) -> None:
        self.ranking: plans.Ranking | None = None
        self._won: set[tuple[str, int]] | None = None
        self.full: dict[str, frozenset[int]] = {}       # problem key -> the buckets measured in full (the cut)
        self.in_full: list[tuple[str, int, str]] = []   # verifying buckets measured in full, and why
        self._full_plans: dict[tuple[str, int], batches.RankPlan] = {}
        self._lock = threading.Lock()
        self._note: int | None = None                   # the index of that note in the search's notes

    def prepare(self, s: SearchView, work: list) -> None:
        """The model's plan per (problem, bucket), or none (halving) when no model covers the arch."""
        model, note = plans.load_model(s.o.rank_model, s.store, s.target, dict(s.env.libs))
        if model is None:
            s.report.notes.append(f"--strategy ranked: {note}; measuring by successive halving")
            return
        s.report.notes.append(f"--strategy ranked: {note}")
        self.ranking = plans.Ranking(model, plans.plans(model, work, list(s.buckets), s.target,
                                                              s.env.sm_count or 0, s.store, s.env.device_key,
                                                              s.o.ranked, s.lib_keys))
        self._cut(s, work)

    def _cut(self, s: SearchView, work: list) -> None:
        """The buckets each problem measures in full; every other one's plan becomes its verifying round
        (the model's first choice, the default, the model's best; the neighbours' winners at `start`)."""
        assert self.ranking is not None
        ladder, model, ps = sorted(s.buckets), self.ranking.model, self.ranking.plans
        for w in work:
            top = {b: cut.top_two(ps[(w.problem.key, b)]) for b in ladder if (w.problem.key, b) in ps}
            self.full[w.problem.key] = cut.measured(ladder, {b: f for b, (f, _) in top.items()},
                                                    {b: m for b, (_, m) in top.items()}, s.o.cut.every, s.o.cut.unsure)
            for b in set(top) - self.full[w.problem.key]:
                self._full_plans[(w.problem.key, b)] = plan = ps[(w.problem.key, b)]
                best = [t for t in plan.order if t.id in set(model.bests(w.problem.key, b)[:1])]
                ps[(w.problem.key, b)] = cut.verify(plan, [w.default, *best], ())
        n = sum(len(v) for v in self.full.values())
        if n < len(work) * len(ladder):
            s.report.notes.append(f"--strategy ranked: {n} of {len(work) * len(ladder)} (problem, bucket) measured in "
                                  f"full (--measure-every {s.o.cut.every}, both ends, predicted family crossovers, "
                                  "buckets the model is unsure of; and any bucket between measured ones won by different "
                                  "kernels); the others verify their neighbours' winners, the model's choice, its best "
                                  "and the default in one round")

    def order(self, jobs: list) -> list:
        """Each problem's verifying buckets after its buckets measured in full (their winners are the
        candidates), in job order otherwise."""
        first = {k: i for i, k in reversed(list(enumerate(j.problem.key for j in jobs)))}
        return sorted(jobs, key=lambda j: (first[j.problem.key],
                                           j.bucket not in self.full.get(j.problem.key, (j.bucket,))))

    def _in_full(self, s: SearchView, job: Any, why: str) -> None:
        """A verifying bucket measured in full (a measured bucket for the ones verified after it), and
        the search's note on them brought up to date."""
        with self._lock:
            self.in_full.append((job.problem.key, job.bucket, why))
            self.full[job.problem.key] = self.full[job.problem.key] | {job.bucket}
            whys = Counter(w for _, _, w in self.in_full)
            line = (f"--strategy ranked: {len(self.in_full)} verifying (problem, bucket) measured in full: "
                    + "; ".join(f"{n}× {w}" for w, n in whys.most_common()))
            if self._note is None:
                self._note = len(s.report.notes)
                s.report.notes.append(line)
            else:
                s.report.notes[self._note] = line

    def precompiled(self, items: list) -> list:
        """What the first batches measure; the rest compile just in time at launch."""
        if self.ranking is None:
            return items
        first = plans.first_batches(self.ranking)
        return [r for r in items if (r.problem.key, r.tactic.id) in first]

    def job(self, s: SearchView, job: Any, kept_ids: set[str]) -> tuple[Any, bool]:
        plan = self.ranking.plans.get((job.problem.key, job.bucket)) if self.ranking else None
        if plan is None:
            return replace(job, strategy=self.name), True
        if self._won is None:
            self._won = {(x.problem_key, x.bucket) for x in s.store.winners(s.env.device_key)
                         if registry.fresh(s.lib_keys, x) and not x.predicted}
        keep = [i for i, t in enumerate(plan.order) if t.id in kept_ids]     # compile failures since planning are out
        plan = replace(plan, order=tuple(plan.order[i] for i in keep), pred=tuple(plan.pred[i] for i in keep))
        todo = job.tactics
        if ((job.problem.key, job.bucket) in self._won and not s.o.retry_failed
                and not set(plans.first_ids(plan)) & {t.id for t in todo}):
            todo = ()       # finished before: its winner is stored and its first batch measured
            # (--retry-failed reopens it: a failure past the first batch is in todo)
        return replace(job, tactics=todo, rank=plan, strategy=self.name), False

    def start(self, s: SearchView, job: Any) -> Any:
        """Warm-started by the neighbouring buckets' winners, as they stand when the job starts; a
        verifying bucket by the winners of the nearest buckets below and above, or measured in full
        where a measured neighbour's winner is not stored yet (another worker still measures it) or
        its measured neighbours were won by different kernels (`cut.split`)."""
        if job.rank is None:
            return job
        full = self.full.get(job.problem.key)
        if full is not None and job.bucket not in full:
            won = plans.winners(s.store, job.problem, s.env.device_key, s.lib_keys)
            ends = [b for b in cut.nearest(job.bucket, sorted(full)) if b is not None]
            why = ("a measured neighbour's winner is not stored" if not all(b in won for b in ends) else
                   "its measured neighbours were won by different kernels"
                   if len(ends) == 2 and cut.split(won[ends[0]], won[ends[1]], plans.kernel_of) else "")
            if not why:
                near = cut.nearest(job.bucket, sorted(won))
                return replace(job, rank=cut.verify(job.rank, job.rank.extras,
                                                    [won[b].id for b in (*ends, *near) if b is not None]))
            self._in_full(s, job, why)
            job = replace(job, rank=self._full_plans[(job.problem.key, job.bucket)])
        return replace(job, rank=plans.with_neighbours(job.rank, s.store, job.problem, job.bucket,
                                                          list(s.buckets), s.env.device_key, s.lib_keys))

    def without(self, s: SearchView, job: Any, bad: set[str]) -> Any:
        """Less `bad` in the tactics and the plan; a job finished before stays finished (as `job`)."""
        todo, plan = tuple(t for t in job.tactics if t.id not in bad), job.rank
        if plan is not None:
            keep = [i for i, t in enumerate(plan.order) if t.id not in bad]
            plan = replace(plan, order=tuple(plan.order[i] for i in keep), pred=tuple(plan.pred[i] for i in keep))
            if ((job.problem.key, job.bucket) in (self._won or set()) and not s.o.retry_failed
                    and not set(plans.first_ids(plan)) & {t.id for t in todo}):
                todo = ()
        return replace(job, tactics=todo, rank=plan)

    @staticmethod
    def measure(ex: Any, job: Any, timer: Any, h: Any, emit: Callable,
                wait: Callable[[list], list] | None = None) -> None:
        """Batches of the plan, each by successive halving once the pool compiled it (`wait`);
        what the cache holds is skipped."""
        if job.rank is None:
            return HalvingStrategy.measure(ex, job, timer, h, emit, wait)
        todo = {t.id for t in job.tactics}

        def run_batch(batch, e):
            batch = [t for t in batch if t.id in todo]
            successive_halving.measure(ex, wait(batch) if wait is not None else batch, job.default_id, timer, h, e,
                                       margin=job.margin)
        batches.measure(run_batch, job.rank, emit)
