"""The search loop: enumerate → verdict → build → check → time → winner, per (problem, bucket).

A rejected tactic is never built, compiled or launched; its verdict is stored once (bucket 0
stands for every bucket). Kept tactics are compiled ahead of time in parallel (families that
compile) while the jobs are measured (autotune.engine.pipeline: a job waits only for its own
tactics' compiles), and each (problem, bucket) is a job for a worker process (autotune.engine.workers): checked
against a float64 reference, then timed by successive halving (autotune.engine.strategies.successive_halving) — with
`--strategy ranked` only the candidates a ranking model puts first (autotune.engine.strategies.ranked).
The search asks its strategy only through the registry's interface (autotune.engine.strategies.base.Strategy).
A failure —
raised, wrong, crashed, hung — is stored with its reason. Every trial commits on its own, so an
interrupted search resumes by measuring only what is missing. Winners are recomputed from the
stored trials (autotune.core.winner), never from in-memory state.
"""
from __future__ import annotations

import functools
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Sequence

from autotune.core import codekey, measure, winner as winner_rule
from autotune.engine import audit, claims as job_claims, invariant, layers, pipeline, strategies, workers as workers_mod
from autotune.engine.planning import FamilyPlan, Planned, plan, summarize  # noqa: F401  (re-exported)
from autotune.engine.executor import Outcome, StoreFailed, store_stage as _store_stage  # noqa: F401
from autotune.engine.progress import Bar, Progress
from autotune.engine.strategies.base import PREDICTED, HalvingStrategy
from autotune.engine.options import Runner, SearchOptions, TimerConfig  # noqa: F401  (re-exported)
from autotune.engine.workers import Stages
from autotune.core.buckets import Buckets
from autotune.core.env import Env, current
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.arch import ARCHS, detect
from autotune.core.tactic import Tactic, Verdict
from autotune.tactics import registry
from autotune.tactics.base import Family

ALL_BUCKETS = 0


@dataclass
class SearchReport:
    arch: str
    device: str
    plans: dict[str, list[FamilyPlan]] = field(default_factory=dict)   # problem key -> per family
    measured: int = 0          # trials timed (ok or dropped by successive halving)
    dropped: int = 0
    predicted: int = 0         # --strategy predict: first choices checked and stored as predicted winners
    resumed: int = 0
    failed: int = 0
    job_failures: list[str] = field(default_factory=list)   # (problem, bucket) jobs not measured, with the reason
    compiled: int = 0          # tactics compiled ahead of timing (or by --compile-check)
    compile_failures: list[str] = field(default_factory=list)
    shards: dict = field(default_factory=dict)   # worker label -> (problem, bucket) jobs it ran
    model_errors: list[str] = field(default_factory=list)
    winners: list[Winner] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stages: Stages = field(default_factory=Stages)   # where the measuring time went
    audit: "audit.Audit | None" = None               # --compile-check: the verdicts checked both ways


@dataclass(frozen=True)
class Job:
    """One (problem, bucket) and the tactics still to measure there."""

    problem: Problem
    bucket: int
    tactics: tuple[Tactic, ...]
    default_id: str
    smem_model: dict = field(default_factory=dict, compare=False, hash=False)   # tactic id -> verdict's figure
    rank: Any = field(default=None, compare=False, hash=False)     # the strategy's plan (ranked: batches.RankPlan)
    gate: "pipeline.Gate | None" = field(default=None, compare=False, hash=False)  # compiles it waits for
    strategy: str = field(default=HalvingStrategy.name, compare=False)          # who measures it (strategies.get)
    margin: float = field(default=winner_rule.DEFAULT_MARGIN, compare=False)  # the winner rule's, for the replay check's contenders


@dataclass
class _Work:
    """One problem after the static steps: the kept tactics to measure and its default."""

    problem: Problem
    kept: list[Planned]
    default: Tactic


class _Search:
    """One search's state; each method is one named step of `search`."""

    def __init__(self, problems: Sequence[Problem], families: Sequence[Family], store, buckets: Buckets,
                 o: SearchOptions, ttl: float | None = None):
        #: the claims' time to live (None: from the runner's timeout, when the jobs run)
        self.ttl = ttl
        self.env = o.env or current()
        self.strategy, o = strategies.of(o)     # the registered strategy object (autotune/engine/strategies/)
        self.o = replace(o, runner=replace(o.runner, families={**registry.extra(), **o.runner.families}))
        self.live = detect() if self.env.device == "cuda" else ARCHS["cpu"]
        self.target = o.arch or self.live
        if o.compile_check or (not o.dry_run and self.target == self.live):
            # a compiler is at hand (the search compiles kept tactics anyway): a verdict no checked
            # model covers asks it, each figure kept in the cache, instead of staying unknown
            families = [f.with_compiler_figures(store) for f in families]
        self.problems, self.families, self.store, self.buckets = problems, families, store, buckets
        self.report = SearchReport(self.target.name, self.env.device)
        self.pipe: pipeline.Pipeline | None = None
        self.pool = None                   # pipeline.prestart's compile pool, warming up while the search plans
        self.executors: list | None = None  # workers.prestart's measuring workers, importing meanwhile
        self._lock = threading.Lock()
        self.predicted: dict[tuple[str, int], Outcome] = {}   # --strategy predict: the checked first choices
        self.lib_keys = {f.name: self.env.lib_key(f.depends_on) for f in families}

    # 1. plan: every tactic's static verdict
    def plan(self) -> dict[Problem, list[Planned]]:
        planned = plan(self.problems, self.families, self.target)
        self.report.plans = summarize(planned)
        return planned

    def plan_only(self, planned: dict[Problem, list[Planned]]) -> SearchReport:
        """Dry run or another arch: verdicts only (cross-compiled with compile_check)."""
        if self.o.compile_check:   # cross-compiling needs no GPU: check the verdicts against the compiler
            kept = [r for rows in planned.values() for r in self._sampled([r for r in rows if not r.verdict.rejected])]
            self.report.audit = audit.Audit(self.target.name, self.o.seed)
            audit.compile_kept(_compilable(kept), self.target, self.o.runner, self.report)
            audit.compile_rejected([r for rows in planned.values() for r in _compilable(rows)], self.target,
                                   self.o.runner, self.o.audit_rejected, self.report, self.o.log)
        if self.target != self.live:
            self.report.notes.append(f"planning for {self.target.name} on a {self.live.name} machine: "
                                     "verdicts only, nothing measured")
        return self.report

    def runnable(self) -> set[str]:
        names, out = set(), []
        for fam in self.families:
            ok, why = fam.available(self.env.device)
            (names.add(fam.name) if ok else out.append(f"{fam.name} ({why})"))
            if not ok:
                self.report.notes.append(f"{fam.name}: skipped, {why}")
        _announce(self.o.progress, f"families measured on {self.env.device}: "
                  + (", ".join(f.name for f in self.families if f.name in names) or "none")
                  + ("; left out: " + "; ".join(out) if out else ""))
        for fp in (fp for fps in self.report.plans.values() for fp in fps if fp.family not in names):
            fp.kept, fp.skipped = 0, fp.kept + fp.unknown    # as `show` counts them: nothing stored as kept
            fp.unknown = 0
        if self.env.device == "cpu":
            self.report.notes.append("no GPU: measuring the tactics that run on the CPU ("
                                     + (", ".join(f.name for f in self.families if f.name in names) or "none") + ")")
        return names

    # 2. store static rejections; choose what each problem measures
    def store_static(self, planned: dict[Problem, list[Planned]], names: set[str]) -> list[_Work]:
        with _store_stage("storing the problems and static verdicts"):
            return self._store_static(planned, names)

    def _store_static(self, planned: dict[Problem, list[Planned]], names: set[str]) -> list[_Work]:
        store, env = self.store, self.env
        work = []
        if any(p.kind == "grouped_moe" for p in planned):   # the report's byte counts follow the draw
            store.put_meta(measure.META_KEY, f"{measure.ROUTING_SKEW:g}")
        for p, rows in planned.items():
            store.put_problem(p)
            default = registry.designated_default(p, self.target, env.device)
            dfam = registry.get(default.family)
            self.lib_keys.setdefault(dfam.name, env.lib_key(dfam.depends_on))
            store.put_environment(env, dfam.depends_on)
            for fam in self.families:
                store.put_environment(env, fam.depends_on)
            # what this search's libraries and code stored before (a stale row is measured again)
            known = {t.tactic_id: t for t in store.get_trials(p.key, ALL_BUCKETS, env.device_key)
                     if registry.fresh(self.lib_keys, t)}
            store.put_trials([_trial(p, ALL_BUCKETS, r.tactic, env, self.lib_keys, "rejected", r.verdict.reason,
                                     smem_model=r.verdict.smem_bytes)
                              for r in rows if r.verdict.rejected and r.tactic.id not in known])
            runs = [r for r in rows if not r.verdict.rejected and r.tactic.family in names
                    and (self.o.measure_unknown or not r.verdict.unchecked)]
            if self.o.batch_invariant:
                runs = [r for r in runs if invariant.invariant(p, r.tactic)]
            unchecked = sum(r.verdict.unchecked for r in rows if r.tactic.family in names)
            if unchecked and not self.o.measure_unknown:
                self.report.notes.append(f"{p.key}: {unchecked} tactics with an unchecked verdict (unknown) not "
                                         "measured; --measure-unknown measures them")
            kept = self._sampled(runs)
            if not any(r.tactic == default for r in kept) and (not self.o.batch_invariant
                                                                or invariant.invariant(p, default)):
                kept.insert(0, Planned(p, default, dfam.verdict(p, default, self.target)))
            self._count_unsampled(p, runs, kept)
            # a compile failure (bucket 0) is final for every bucket unless --retry-failed
            kept = [r for r in kept if self.o.retry_failed
                    or getattr(known.get(r.tactic.id), "status", None) != "failed"]
            work.append(_Work(p, kept, default))
        return work

    # 3. precompile
    def precompile(self, work: list[_Work]) -> None:
        """Compile every kept tactic of families that can (Triton) ahead of the timing loop, in
        `runner.compile_workers` processes; the compiler's on-disk cache then serves the workers.
        A compile failure is a failed trial for every bucket (stored at bucket 0)."""
        items = self.strategy.precompiled(_compilable([r for w in work for r in w.kept]))
        if not items:
            return
        bad = set()
        for r, (err, sig) in zip(items, audit.compile_kept(items, self.target, self.o.runner, self.report)):
            if err is not None:
                bad.add((r.problem.key, r.tactic.id))
                self._compile_failed(r, err, sig)
        for w in work:
            w.kept = [r for r in w.kept if (w.problem.key, r.tactic.id) not in bad]

    def _compile_failed(self, r: Planned, err: str, sig: int | None) -> None:
        """A failed precompile: a failed trial at bucket 0, which stands for every bucket."""
        with self._lock:
            self.report.failed += 1
        self.o.log(f"{r.problem.key} {r.tactic}: precompile failed: {err}")
        with _store_stage(f"storing the precompile failure of {r.tactic} for {r.problem.key}"):
            self.store.put_trial(_trial(r.problem, ALL_BUCKETS, r.tactic, self.env, self.lib_keys, "failed",
                                        "precompile failed: " + err, smem_model=r.verdict.smem_bytes,
                                        exit_signal=sig))

    # 3'. precompile overlapped with measuring (autotune/engine/pipeline.py): the jobs carry gates
    def compile_ahead(self, work: list[_Work], jobs: list[Job]) -> list[Job]:
        self.pipe, gates = pipeline.start(work, jobs, self.strategy.precompiled, self.target, self.o.runner,
                                          self.report, self._compile_failed, self._without, self.pool)
        return [replace(j, gate=gates.get(j.problem.key)) if j.tactics else j for j in jobs]

    def _without(self, job: Job, bad: set[str]) -> Job:
        """`job` without the tactics whose precompile failed: what `jobs` makes after the barrier."""
        return self.strategy.without(self, job, bad) if bad else job

    # 4. jobs: one per (problem, bucket), without what the cache already holds
    def remaining(self, p: Problem, b: int, tactics: Iterable[Tactic]) -> tuple[Tactic, ...]:
        """Of `tactics`, those the cache lacks at (p, b) under this search's libraries and code (resume)."""
        redo = ({"failed"} if self.o.retry_failed else set()) | self.strategy.redo()
        done = {t.tactic_id: t for t in self.store.get_trials(p.key, b, self.env.device_key)
                if registry.fresh(self.lib_keys, t)}
        return tuple(t for t in tactics if t.id not in done or done[t.id].status in redo)

    @functools.cached_property
    def pair_lib_keys(self) -> dict[str, str]:
        """The library keys a layer's pair competitor is judged fresh under: every family's that imports
        here (the pair problems' winners come from families a layer's search does not run); read only
        by layer jobs, so a search without them imports no family it does not run."""
        return {**layers.lib_keys(self.env), **self.lib_keys}

    def jobs(self, work: list[_Work]) -> list[Job]:
        """Each (problem, bucket) as the strategy measures it (ranked: its plan; finished ones empty)."""
        out = []
        for w in work:
            for b in self.buckets:
                kept = self.strategy.kept_at(w, b)     # a family may call a tactic useless at this M (Family.useful)
                pair = layers.pair_competitor(self.store, w.problem, b, self.env.device_key, self.pair_lib_keys) \
                    if w.problem.kind == layers.KIND else []          # a layer's pair: its GEMMs' winners
                todo = self.remaining(w.problem, b, [r.tactic for r in kept] + pair)
                job, resumed = self.strategy.job(self, Job(w.problem, b, todo, w.default.id,
                                                           {r.tactic.id: r.verdict.smem_bytes for r in kept},
                                                           margin=self.o.margin),
                                                 {r.tactic.id for r in kept})
                self.report.resumed += (len(kept) - len(todo)) if resumed else 0
                out.append(job)
        return self.strategy.order(out)

    # 2b. the strategy plans (ranked: a model's plan per (problem, bucket), or halving when there is none)
    def prepare(self, work: list[_Work]) -> None:
        self.strategy.prepare(self, work)

    # 5. run: measure the jobs; each trial is stored as it is decided (by the sink, _Results)
    def run(self, jobs: list[Job]) -> None:
        report, store, env = self.report, self.store, self.env
        bar = self.o.progress if isinstance(self.o.progress, Progress) else Bar(self.o.progress)
        bar.start(jobs, report.resumed)
        # concurrent searches on this cache: claim each job as a worker takes it (autotune/engine/claims.py)
        claims = job_claims.JobClaims(store, env.device_key, self._claim_keys(),
                                      lambda j: self.remaining(j.problem, j.bucket, j.tactics),
                                      self.ttl if self.ttl is not None else job_claims.ttl_s(self.o.runner.timeout_s))
        sink = _Results(self, bar, claims)
        try:
            todo = [j for j in jobs if j.tactics]
            for j in jobs:
                if not j.tactics:
                    sink.finished(j)
            o = self.o
            if o.runner.ray:
                workers_mod.run_ray(todo, o.runner, env.device, o.timer, o.halving, o.seed, sink)
            else:
                ex, self.executors = self.executors, None      # run_local closes them
                workers_mod.run_local(todo, o.runner, env.device, o.timer, o.halving, o.seed, sink, ex)
            for j in claims.settled():     # skipped, and finished by their search meanwhile: read the winners
                sink.finished(j)
        finally:
            bar.close()
            claims.close()
        report.resumed += claims.found
        report.notes += claims.notes()

    # 6. winners: recomputed from the stored trials, never from in-memory state
    def winner(self, job: Job, lock: threading.Lock) -> Winner | None:
        with lock:
            pred = self.predicted.pop((job.problem.key, job.bucket), None)
        if pred is not None:
            w = _predicted_winner(self.store, job, pred, self.env, self.lib_keys)
        else:
            w = _update_winner(self.store, job.problem, job.bucket, self.env, job.default_id, self.lib_keys,
                               self.o.margin)
        if w:
            with lock:
                self.report.winners.append(w)
        return w

    # 7. --batch-invariant: one tactic per problem for every bucket
    def invariant_winners(self, work: list[_Work]) -> None:
        keys = {w.problem.key for w in work}
        self.report.winners = [w for w in self.report.winners if w.problem_key not in keys]
        for w in work:
            ws, note = invariant.invariant_winners(self.store, w.problem, list(self.buckets), self.env, w.default.id,
                                                  self.lib_keys, self.o.margin)
            self.report.winners += ws
            self.report.notes.append(note)

    def _claim_keys(self) -> list[str]:
        """What concurrent searches must share to share jobs: the library keys and every member's
        code key (a search with other kernel code measures its own)."""
        codes = {codekey.code_key(k, c) for f, k in self.lib_keys.items() for c in registry.get(f).codes()}
        return sorted({*self.lib_keys.values(), *codes})

    def _count_unsampled(self, p: Problem, runs: list[Planned], kept: list[Planned]) -> None:
        """Kept tactics left out of the sample are not stored: count them apart, as `show` does."""
        left = (Counter(r.tactic.family for r in runs if r.verdict.ok is True)
                - Counter(r.tactic.family for r in kept if r.verdict.ok is True))
        for fp in self.report.plans[p.key]:
            n = left.get(fp.family, 0)
            fp.kept, fp.unsampled = fp.kept - n, fp.unsampled + n

    def _sampled(self, kept: list[Planned]) -> list[Planned]:
        return _sample(kept, self.o.max_tactics) if self.o.max_tactics else kept


class _Results:
    """The search's sink (autotune.engine.sink.Sink), called from the worker threads: it claims each
    job as a worker takes it, stores each trial as it is decided, writes the winner when a job ends,
    and renews the claims on every heartbeat (each completed worker request)."""

    def __init__(self, s: _Search, bar, claims: job_claims.JobClaims):
        self.s, self.bar, self.claims, self.lock = s, bar, claims, s._lock   # one lock with the compile failures
        self.stages = s.report.stages

    def start(self, job: Job) -> Job | None:
        """Claim it; the strategy may warm-start it (ranked: by its neighbours' winners)."""
        job = self.claims.start(job)
        return self.s.strategy.start(self.s, job) if job is not None else None

    def outcome(self, job: Job, o: Outcome) -> None:
        s, report, t0 = self.s, self.s.report, time.perf_counter()
        if o.status == PREDICTED:      # checked, not timed: the job's winner, never a trial
            with self.lock:
                s.predicted[(job.problem.key, job.bucket)] = o
                report.predicted += 1
            self.bar.advance(1, job)
            return
        t, smem_model = o.tactic, job.smem_model.get(o.tactic.id)
        note = o.reason
        if o.status == "ok" and o.smem_compiled is not None and smem_model is not None and o.smem_compiled != smem_model:
            note = f"model error: compiler says smem {o.smem_compiled}, model {smem_model}"
            with self.lock:
                report.model_errors.append(f"{job.problem.key} {t}: {note}")
        with _store_stage(f"storing the {o.status} trial of {t} for {job.problem.key} m={job.bucket}"):
            s.store.put_trial(_trial(job.problem, job.bucket, t, s.env, s.lib_keys, o.status, note,
                                     median_us=o.median_us, iqr_us=o.iqr_us, reps=o.reps, rel_err=o.rel_err,
                                     smem_model=smem_model, smem_compiled=o.smem_compiled,
                                     exit_signal=o.exit_signal, replay_checked=o.replay_checked))
        with self.lock:
            report.measured += o.status != "failed"
            report.dropped += o.status == "dropped"
            report.failed += o.status == "failed"
            if o.status == "failed":
                s.o.log(f"{job.problem.key} m={job.bucket} {t}: failed: {o.reason}")
        self.bar.advance(1, job)
        report.stages.add("store", time.perf_counter() - t0)

    def finished(self, job: Job, failure: str | None = None, worker: str | None = None) -> None:
        report = self.s.report
        with self.lock:
            if worker is not None:
                report.shards[worker] = report.shards.get(worker, 0) + 1
            if failure is not None:    # the job's own condition: nothing stored, its tactics stay unmeasured
                report.job_failures.append(f"{job.problem.key} m={job.bucket}: {failure}")
        if failure is not None:
            self.s.o.log(f"{job.problem.key} m={job.bucket}: not measured: {failure}")
        with _store_stage(f"storing the winner of {job.problem.key} m={job.bucket}"):
            w = self.s.winner(job, self.lock)
        self.bar.job_done(job, w)
        self.claims.done(job)

    def heartbeat(self) -> None:
        self.claims.beat()


def search(problems: Sequence[Problem], *, families: Sequence[Family], store, buckets: Buckets,
           options: SearchOptions | None = None, **kw) -> SearchReport:
    """plan → store static rejections → rank → jobs → precompile overlapped with run → winners
    (the compile pool warming up from the start; a barrier with Ray or --no-isolate). `kw` are SearchOptions
    fields (margin=, timer=, halving=, runner=, …), for callers that prefer keywords."""
    o = replace(options or SearchOptions(), **kw)
    o = replace(o, env=o.env or current())
    if all(layers.split(problems)):        # layer problems after the others, by halving (engine/layers.py)
        return layers.in_order(lambda ps, opt: search(ps, families=families, store=store, buckets=buckets, options=opt),
                               problems, o)
    o, families = layers.for_layers(problems, o, families)
    plan_only = o.dry_run or (o.arch is not None and o.arch != (detect() if o.env.device == "cuda" else ARCHS["cpu"]))
    # a bad AUTOTUNE_CLAIM_TTL_S stops a measuring search before any work
    s = _Search(problems, families, store, buckets, o, None if plan_only else job_claims.ttl_s(o.runner.timeout_s))
    if s.o.dry_run or s.target != s.live:
        return s.plan_only(s.plan())
    s.pool = pipeline.prestart(s.families, s.env.device, s.target, s.o.runner)   # compile workers import meanwhile
    if not s.o.runner.ray:
        s.executors = workers_mod.prestart(s.o.runner, s.env.device)              # so do the measuring workers
    try:
        t0 = time.perf_counter()          # the search's own steps before the first job, as stages too
        work = s.store_static(s.plan(), s.runnable())
        t1 = time.perf_counter()
        s.prepare(work)
        s.report.stages.add("plan", t1 - t0)
        s.report.stages.add("prepare", time.perf_counter() - t1)
        if pipeline.overlaps(s.o.runner):     # compile while measuring (autotune/engine/pipeline.py)
            s.run(s.compile_ahead(work, s.jobs(work)))
        else:                                 # Ray, --no-isolate: every precompile first
            s.precompile(work)
            s.run(s.jobs(work))
    except KeyboardInterrupt as e:     # the caller still prints where the time went
        setattr(e, "report", s.report)
        raise
    finally:
        try:
            for _, ex in s.executors or ():    # the search ended before it ran them
                ex.close()
            if s.pipe is not None:     # the background is dropped; the figures go into the stages
                s.pipe.close(s.report.stages)
            elif s.pool is not None:   # warmed up, then nothing to compile
                s.pool.close()
        except KeyboardInterrupt as e:   # stopped while closing: the report is still whole
            setattr(e, "report", s.report)
            raise
    if s.o.batch_invariant:
        s.invariant_winners(work)
    s.report.winners.sort(key=lambda w: (w.problem_key, w.bucket))
    return s.report


def _announce(progress, line: str) -> None:
    """A line the user sees as the search starts (not only in the closing summary)."""
    if isinstance(progress, Progress):
        progress.note(line)
    elif progress:
        import sys
        print(line, file=sys.stderr, flush=True)


def _compilable(rows) -> list:
    return [r for r in rows if registry.get(r.tactic.family).compiles]


def _sample(kept: list[Planned], n: int) -> list[Planned]:
    """At most n kept tactics per family, evenly spaced over its enumeration order (a budget
    knob for quick runs; the designated default is added back by the caller)."""
    by_fam: dict[str, list[Planned]] = defaultdict(list)
    for r in kept:
        by_fam[r.tactic.family].append(r)
    out = []
    for rows in by_fam.values():
        step = max(1, len(rows) / n)
        out += [rows[int(i * step)] for i in range(min(n, len(rows)))]
    return out


def _trial(p: Problem, bucket: int, t: Tactic, env: Env, lib_keys, status, reason="", **kw) -> Trial:
    lib = lib_keys[t.family]
    return Trial(p.key, bucket, t.id, t.family, t.to_json(), env.device_key, lib, status, reason,
                 code_key=registry.code_key(t, lib), **kw)


def _predicted_winner(store, job: Job, o: Outcome, env: Env, lib_keys) -> Winner | None:
    """The checked first choice of `--strategy predict` as a predicted winner (median_us: its checked
    call's host time); the store keeps a measured winner of the same bucket instead."""
    t, lib = o.tactic, lib_keys[o.tactic.family]
    w = Winner(job.problem.key, job.bucket, env.device_key, t.id, t.family, t.to_json(), lib, o.median_us,
               job.default_id, None, None, registry.code_key(t, lib), o.replay_checked, predicted=True)
    store.put_winner(w)
    return w


def _update_winner(store, p: Problem, b: int, env: Env, default_id: str, lib_keys, margin) -> Winner | None:
    trials = [t for t in store.get_trials(p.key, b, env.device_key) if registry.fresh(lib_keys, t)]
    pick = winner_rule.choose(trials, default_id, margin)
    if pick is None:
        return None
    d = next((t for t in trials if t.tactic_id == default_id and t.status == "ok"), None)
    w = Winner(p.key, b, env.device_key, pick.tactic_id, pick.family, pick.params_json, pick.lib_key,
               pick.median_us, default_id, d.median_us if d else None,
               (d.median_us / pick.median_us) if d else None, pick.code_key, pick.replay_checked)
    store.put_winner(w)
    return w
