"""The search loop: enumerate → verdict → build → check → time → winner, per (problem, bucket).

A rejected tactic is never built, compiled or launched; its verdict is stored once (bucket 0
stands for every bucket). Kept tactics are compiled ahead of time in parallel (families that
compile), then each (problem, bucket) is a job for a worker process (autotune.engine.workers): checked
against a float64 reference, then timed by successive halving (autotune.engine.halving). A failure —
raised, wrong, crashed, hung — is stored with its reason. Every trial commits on its own, so an
interrupted search resumes by measuring only what is missing. Winners are recomputed from the
stored trials (autotune.core.winner), never from in-memory state.
"""
from __future__ import annotations

import re
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from autotune.engine import timing, workers as workers_mod
from autotune.core import winner as winner_rule
from autotune.core.buckets import Buckets
from autotune.core.env import Env, current
from autotune.engine.halving import Halving, Outcome
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.arch import ARCHS, Arch, detect
from autotune.core.tactic import Tactic, Verdict
from tactics.base import Family

ALL_BUCKETS = 0


@dataclass(frozen=True)
class Planned:
    problem: Problem
    tactic: Tactic
    verdict: Verdict


@dataclass
class FamilyPlan:
    family: str
    kept: int = 0
    rejected: int = 0
    unknown: int = 0
    reasons: Counter = field(default_factory=Counter)      # reason class -> count
    examples: dict = field(default_factory=dict)           # reason class -> one full reason

    def line(self) -> str:
        s = f"{self.family}: {self.kept} kept, {self.rejected} rejected"
        if self.unknown:
            s += f", {self.unknown} unknown until checked on the device"
        if self.reasons:
            s += ": " + "; ".join(f"{n}× " + ("e.g. " if n > 1 and r != self.examples[r] else "") + self.examples[r]
                                  for r, n in self.reasons.most_common())
        return s


@dataclass
class SearchReport:
    arch: str
    device: str
    plans: dict[str, list[FamilyPlan]] = field(default_factory=dict)   # problem key -> per family
    measured: int = 0          # trials timed (ok or dropped by successive halving)
    dropped: int = 0
    resumed: int = 0
    failed: int = 0
    compiled: int = 0          # tactics compiled ahead of timing (or by --compile-check)
    compile_failures: list[str] = field(default_factory=list)
    shards: dict = field(default_factory=dict)   # worker label -> (problem, bucket) jobs it ran
    model_errors: list[str] = field(default_factory=list)
    winners: list[Winner] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stages: workers_mod.Stages = field(default_factory=workers_mod.Stages)   # where the measuring time went


def _reason_class(reason: str) -> str:
    return re.sub(r"\d+", "#", reason)


def plan(problems: Iterable[Problem], families: Sequence[Family], arch: Arch) -> dict[Problem, list[Planned]]:
    """Static pass: every tactic of every family with its verdict. Nothing compiles here."""
    out: dict[Problem, list[Planned]] = {}
    for p in problems:
        rows = []
        for fam in families:
            for t in fam.enumerate(p, arch):
                rows.append(Planned(p, t, fam.verdict(p, t, arch)))
        out[p] = rows
    return out


def summarize(planned: dict[Problem, list[Planned]]) -> dict[str, list[FamilyPlan]]:
    out: dict[str, list[FamilyPlan]] = {}
    for p, rows in planned.items():
        by_fam: dict[str, FamilyPlan] = {}
        for r in rows:
            fp = by_fam.setdefault(r.tactic.family, FamilyPlan(r.tactic.family))
            if r.verdict.ok is True:
                fp.kept += 1
            elif r.verdict.ok is None:
                fp.unknown += 1
            else:
                fp.rejected += 1
                c = _reason_class(r.verdict.reason)
                fp.reasons[c] += 1
                fp.examples.setdefault(c, r.verdict.reason)
        out[p.key] = list(by_fam.values())
    return out


@dataclass(frozen=True)
class Job:
    """One (problem, bucket) and the tactics still to measure there."""

    problem: Problem
    bucket: int
    tactics: tuple[Tactic, ...]
    default_id: str
    smem_model: dict = field(default_factory=dict, compare=False, hash=False)   # tactic id -> verdict's figure


@dataclass(frozen=True)
class Runner:
    """How and where measurements run (see autotune.engine.workers and docs/search.md)."""

    isolate: bool = True                  # one spawned worker process per device; False: in-process
    gpus: tuple[int, ...] = ()            # one worker per listed device; () = one worker
    workers: int = 1                      # worker processes when no GPUs are listed (CPU sharding)
    ray: str | None = None                # Ray address ("local" starts a local cluster)
    compile_workers: int = 1              # joblib processes for ahead-of-time compilation
    timeout_s: float = workers_mod.DEFAULT_TIMEOUT_S
    families: dict = field(default_factory=dict)   # extra "name": "module:Class" for workers (tests)

    def __post_init__(self):
        if self.workers < 1 or self.compile_workers < 1 or self.timeout_s <= 0:
            raise ValueError(f"bad runner settings: {self}")
        if len(set(self.gpus)) != len(self.gpus) or any(g < 0 for g in self.gpus):
            raise ValueError(f"--gpus must list distinct device indices, got {list(self.gpus)}")


def search(problems: Sequence[Problem], *, families: Sequence[Family], store, buckets: Buckets,
           arch: Arch | None = None, env: Env | None = None, margin: float = winner_rule.DEFAULT_MARGIN,
           timer: timing.TimerConfig = timing.TimerConfig(), halving: Halving = Halving(), runner: Runner = Runner(),
           retry_failed: bool = False, dry_run: bool = False, compile_check: bool = False, seed: int = 0, max_tactics: int | None = None,
           progress: bool = False, log: Callable[[str], None] = lambda s: None) -> SearchReport:
    from tactics import registry

    env = env or current()
    runner = replace(runner, families={**registry.extra(), **runner.families})
    live = detect() if env.device == "cuda" else ARCHS["cpu"]
    target = arch or live
    report = SearchReport(target.name, env.device)
    planned = plan(problems, families, target)
    report.plans = summarize(planned)
    if dry_run or target != live:
        if compile_check:   # cross-compiling needs no GPU: check the verdicts against the compiler
            kept = [r for rows in planned.values()
                    for r in (_sample([r for r in rows if not r.verdict.rejected], max_tactics)
                              if max_tactics else [r for r in rows if not r.verdict.rejected])]
            _compile(_compilable(kept), target, runner, report)
        if target != live:
            report.notes.append(f"planning for {target.name} on a {live.name} machine: verdicts only, nothing measured")
        return report

    runnable = []
    for fam in families:
        ok, why = fam.available(env.device)
        (runnable.append(fam) if ok else report.notes.append(f"{fam.name}: skipped, {why}"))
    if env.device == "cpu":
        report.notes.append("no GPU: measuring the tactics that run on the CPU ("
                            + (", ".join(f.name for f in runnable) or "none") + ")")
    names = {f.name for f in runnable}
    lib_keys = {f.name: env.lib_key(f.depends_on) for f in families}

    work = []  # (problem, [Planned kept], default tactic)
    for p, rows in planned.items():
        store.put_problem(p)
        default = registry.designated_default(p, target, env.device)
        dfam = registry.get(default.family)
        lib_keys.setdefault(dfam.name, env.lib_key(dfam.depends_on))
        store.put_environment(env, dfam.depends_on)
        for fam in families:
            store.put_environment(env, fam.depends_on)
        known = {(t.tactic_id, t.lib_key): t for t in store.get_trials(p.key, ALL_BUCKETS, env.device_key)}
        for r in rows:
            if r.verdict.rejected and (r.tactic.id, lib_keys[r.tactic.family]) not in known:
                store.put_trial(_trial(p, ALL_BUCKETS, r.tactic, env, lib_keys, "rejected", r.verdict.reason,
                                       smem_model=r.verdict.smem_bytes))
        kept = [r for r in rows if not r.verdict.rejected and r.tactic.family in names]
        if max_tactics:
            kept = _sample(kept, max_tactics)
        if not any(r.tactic == default for r in kept):
            kept.insert(0, Planned(p, default, dfam.verdict(p, default, target)))
        # a compile failure (bucket 0) is final for every bucket unless --retry-failed
        kept = [r for r in kept if retry_failed or getattr(known.get((r.tactic.id, lib_keys[r.tactic.family])),
                                                           "status", None) != "failed"]
        work.append((p, kept, default))

    _precompile(work, target, env, lib_keys, store, runner, report, log)

    jobs = []
    for p, kept, default in work:
        for b in buckets:
            done = {t.tactic_id: t for t in store.get_trials(p.key, b, env.device_key)
                    if t.lib_key == lib_keys.get(t.family)}
            redo = {"failed"} if retry_failed else set()
            if halving.exhaustive:
                redo.add("dropped")    # an exhaustive run times what halving dropped
            todo = tuple(r.tactic for r in kept if r.tactic.id not in done or done[r.tactic.id].status in redo)
            report.resumed += len(kept) - len(todo)
            jobs.append(Job(p, b, todo, default.id, {r.tactic.id: r.verdict.smem_bytes for r in kept}))

    bar = _Progress(sum(len(j.tactics) for j in jobs), progress)
    bar.advance(report.resumed)
    lock = threading.Lock()

    def record(job: Job, o: Outcome) -> None:
        t0 = time.perf_counter()
        t, smem_model = o.tactic, job.smem_model.get(o.tactic.id)
        note = o.reason
        if o.status == "ok" and o.smem_compiled is not None and smem_model is not None and o.smem_compiled != smem_model:
            note = f"model error: compiler says smem {o.smem_compiled}, model {smem_model}"
            with lock:
                report.model_errors.append(f"{job.problem.key} {t}: {note}")
        store.put_trial(_trial(job.problem, job.bucket, t, env, lib_keys, o.status, note, median_us=o.median_us,
                               iqr_us=o.iqr_us, reps=o.reps, rel_err=o.rel_err, smem_model=smem_model,
                               smem_compiled=o.smem_compiled, exit_signal=o.exit_signal))
        with lock:
            report.measured += o.status != "failed"
            report.dropped += o.status == "dropped"
            report.failed += o.status == "failed"
            if o.status == "failed":
                log(f"{job.problem.key} m={job.bucket} {t}: failed: {o.reason}")
        bar.advance(1)
        report.stages.add("store", time.perf_counter() - t0)

    def finish(job: Job) -> None:
        w = _update_winner(store, job.problem, job.bucket, env, job.default_id, lib_keys, margin)
        if w:
            with lock:
                report.winners.append(w)

    try:
        todo_jobs = [j for j in jobs if j.tactics]
        for j in jobs:
            if not j.tactics:
                finish(j)
        if runner.ray:
            workers_mod.run_ray(todo_jobs, runner, env.device, timer, halving, seed, record, finish, report.shards,
                                report.stages)
        else:
            workers_mod.run_local(todo_jobs, runner, env.device, timer, halving, seed, record, finish, report.shards,
                                  report.stages)
    finally:
        bar.close()
    report.winners.sort(key=lambda w: (w.problem_key, w.bucket))
    return report


def _compilable(rows) -> list:
    from tactics import registry
    return [r for r in rows if registry.get(r.tactic.family).compiles]


def _compile(items: list[Planned], target: Arch, runner: Runner, report: SearchReport) -> list[str | None]:
    """Compile kept tactics for `target` in `runner.compile_workers` processes; note every
    disagreement between the compiler's shared memory and the verdict's. Returns errors."""
    t0 = time.perf_counter()
    results = workers_mod.compile_all([(r.problem.key, r.tactic.to_json()) for r in items], target.name,
                                      runner.compile_workers, runner.families)
    report.stages.add("compile", time.perf_counter() - t0, len(items))
    report.compiled += len(items)
    errors = []
    for r, (err, smem) in zip(items, results):
        errors.append(err)
        if err is not None:
            report.compile_failures.append(f"{r.problem.key} {r.tactic}: {err}")
        elif smem is not None and r.verdict.smem_bytes is not None and smem != r.verdict.smem_bytes:
            report.model_errors.append(f"{r.problem.key} {r.tactic}: compiler says smem {smem} on "
                                       f"{target.name}, model {r.verdict.smem_bytes}")
    return errors


def _precompile(work, target: Arch, env: Env, lib_keys, store, runner: Runner, report: SearchReport, log) -> None:
    """Compile every kept tactic of families that can (Triton) ahead of the timing loop, in
    `runner.compile_workers` processes; the compiler's on-disk cache then serves the workers.
    A compile failure is a failed trial for every bucket (stored at bucket 0)."""
    items = _compilable([r for _, kept, _ in work for r in kept])
    if not items:
        return
    bad = set()
    for r, err in zip(items, _compile(items, target, runner, report)):
        if err is None:
            continue
        bad.add((r.problem.key, r.tactic.id))
        report.failed += 1
        log(f"{r.problem.key} {r.tactic}: compile failed: {err}")
        store.put_trial(_trial(r.problem, ALL_BUCKETS, r.tactic, env, lib_keys, "failed", "compile failed: " + err,
                               smem_model=r.verdict.smem_bytes))
    for i, (p, kept, default) in enumerate(work):
        work[i] = (p, [r for r in kept if (p.key, r.tactic.id) not in bad], default)


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
    return Trial(p.key, bucket, t.id, t.family, t.to_json(), env.device_key, lib_keys[t.family], status, reason, **kw)


def _update_winner(store, p: Problem, b: int, env: Env, default_id: str, lib_keys, margin) -> Winner | None:
    trials = [t for t in store.get_trials(p.key, b, env.device_key) if lib_keys.get(t.family) == t.lib_key]
    pick = winner_rule.choose(trials, default_id, margin)
    if pick is None:
        return None
    d = next((t for t in trials if t.tactic_id == default_id and t.status == "ok"), None)
    w = Winner(p.key, b, env.device_key, pick.tactic_id, pick.family, pick.params_json, pick.lib_key,
               pick.median_us, default_id, d.median_us if d else None,
               (d.median_us / pick.median_us) if d else None)
    store.put_winner(w)
    return w


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self._p = None
        if enabled and total:
            from rich.progress import Progress
            self._p = Progress(transient=True)
            self._p.start()
            self._task = self._p.add_task("measuring", total=total)

    def advance(self, n: int) -> None:
        if self._p and n:
            self._p.advance(self._task, n)

    def close(self) -> None:
        if self._p:
            self._p.stop()
