"""The search loop: enumerate → verdict → build → check → time → winner, per (problem, bucket).

A rejected tactic is never built, compiled or launched; its verdict is stored once (bucket 0
stands for every bucket). Kept tactics are checked against a float64 reference before they are
timed; a failure is stored with its reason. Every trial commits on its own, so an interrupted
search resumes by measuring only what is missing. Winners are recomputed from the stored trials
(autotune.winner), never from in-memory state.
"""
from __future__ import annotations

import re
import traceback
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from autotune import bench, winner as winner_rule
from autotune.buckets import Buckets
from autotune.env import Env, current
from autotune.problem import Problem
from autotune.records import Trial, Winner
from tactics.arch import ARCHS, Arch, detect
from tactics.base import Family, Tactic, Verdict

#: which family's default is the designated baseline, in order of preference: the first one
#: that runs on the live device and covers the problem
DEFAULT_PREFERENCE = ("triton", "torch")
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
    measured: int = 0
    resumed: int = 0
    failed: int = 0
    model_errors: list[str] = field(default_factory=list)
    winners: list[Winner] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


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


def designated_default(problem: Problem, arch: Arch, device: str, registry_get: Callable[[str], Family]) -> Tactic:
    """The baseline a winner must beat and what a miss returns."""
    for name in DEFAULT_PREFERENCE:
        try:
            fam = registry_get(name)
        except ImportError:
            continue
        if not fam.available(device)[0]:
            continue
        t = fam.default(problem, arch)
        if fam.verdict(problem, t, arch).ok is not False:
            return t
    raise ValueError(f"no family can run {problem.key} on {device}")


def search(problems: Sequence[Problem], *, families: Sequence[Family], store, buckets: Buckets,
           arch: Arch | None = None, env: Env | None = None, margin: float = winner_rule.DEFAULT_MARGIN,
           timer: bench.TimerConfig = bench.TimerConfig(), retry_failed: bool = False, dry_run: bool = False,
           seed: int = 0, max_tactics: int | None = None, progress: bool = False, log: Callable[[str], None] = lambda s: None) -> SearchReport:
    from tactics import registry

    env = env or current()
    live = detect() if env.device == "cuda" else ARCHS["cpu"]
    target = arch or live
    report = SearchReport(target.name, env.device)
    planned = plan(problems, families, target)
    report.plans = summarize(planned)
    if dry_run or target != live:
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
        default = designated_default(p, target, env.device, registry.get)
        dfam = registry.get(default.family)
        lib_keys.setdefault(dfam.name, env.lib_key(dfam.depends_on))
        store.put_environment(env, dfam.depends_on)
        for fam in families:
            store.put_environment(env, fam.depends_on)
        known = {(t.tactic_id, t.lib_key) for t in store.get_trials(p.key, ALL_BUCKETS, env.device_key)}
        for r in rows:
            if r.verdict.rejected and (r.tactic.id, lib_keys[r.tactic.family]) not in known:
                store.put_trial(_trial(p, ALL_BUCKETS, r.tactic, env, lib_keys, "rejected", r.verdict.reason,
                                       smem_model=r.verdict.smem_bytes))
        kept = [r for r in rows if not r.verdict.rejected and r.tactic.family in names]
        if max_tactics:
            kept = _sample(kept, max_tactics)
        if not any(r.tactic == default for r in kept):
            kept.insert(0, Planned(p, default, dfam.verdict(p, default, target)))
        work.append((p, kept, default))

    total = sum(len(k) for _, k, _ in work) * len(buckets)
    bar = _Progress(total, progress)
    try:
        for p, kept, default in work:
            kernels: dict[str, object] = {}
            for b in buckets:
                done = {t.tactic_id: t for t in store.get_trials(p.key, b, env.device_key)
                        if t.lib_key == lib_keys.get(t.family)}
                todo = [r for r in kept if r.tactic.id not in done
                        or (retry_failed and done[r.tactic.id].status == "failed")]
                report.resumed += len(kept) - len(todo)
                bar.advance(len(kept) - len(todo))
                if todo:
                    _measure_bucket(p, b, todo, kernels, store, env, lib_keys, timer, seed, report, bar, log)
                w = _update_winner(store, p, b, env, default, lib_keys, margin)
                if w:
                    report.winners.append(w)
    finally:
        bar.close()
    return report


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


def _measure_bucket(p, b, todo, kernels, store, env, lib_keys, timer, seed, report, bar, log):
    from tactics import registry

    s0 = zlib.crc32(f"{seed}:{p.key}:{b}".encode())  # stable across processes, unlike hash()
    base = bench.make_inputs(p, b, env.device, seed=s0, n_sets=1)
    n_sets = bench.sets_for_cold_l2(base[0].nbytes(), env.device)
    sets = base + (bench.make_inputs(p, b, env.device, s0 + 1, n_sets - 1) if n_sets > 1 else [])
    ref = bench.reference(p, sets[0])
    outs = [bench.torch_empty_out(p, b, s) for s in sets]
    for r in todo:
        t = r.tactic
        smem_model = r.verdict.smem_bytes
        try:
            kernel = kernels.get(t.id)
            if kernel is None:
                kernel = kernels[t.id] = registry.get(t.family).build(p, t, env.device)
            err = bench.check(p, kernel, sets[0], ref)
            compiled = getattr(kernel, "smem_compiled", None)
            note = ""
            if compiled is not None and smem_model is not None and compiled != smem_model:
                note = f"model error: compiler says smem {compiled}, model {smem_model}"
                report.model_errors.append(f"{p.key} {t}: {note}")
            timing = bench.time_calls(lambda i: kernel(*sets[i].args(), out=outs[i]), len(sets), env.device, timer)
            store.put_trial(_trial(p, b, t, env, lib_keys, "ok", note, median_us=timing.median_us,
                                   iqr_us=timing.iqr_us, reps=timing.reps, rel_err=err,
                                   smem_model=smem_model, smem_compiled=compiled))
            report.measured += 1
        except Exception as e:  # a failing tactic is a result, not a crash of the search
            reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:500]
            log(f"{p.key} m={b} {t}: failed: {reason}\n{traceback.format_exc(limit=3)}")
            store.put_trial(_trial(p, b, t, env, lib_keys, "failed", reason, smem_model=smem_model))
            report.failed += 1
        bar.advance(1)


def _update_winner(store, p: Problem, b: int, env: Env, default: Tactic, lib_keys, margin) -> Winner | None:
    trials = [t for t in store.get_trials(p.key, b, env.device_key) if lib_keys.get(t.family) == t.lib_key]
    pick = winner_rule.choose(trials, default.id, margin)
    if pick is None:
        return None
    d = next((t for t in trials if t.tactic_id == default.id and t.status == "ok"), None)
    w = Winner(p.key, b, env.device_key, pick.tactic_id, pick.family, pick.params_json, pick.lib_key,
               pick.median_us, default.id, d.median_us if d else None,
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
