"""Compiling ahead of timing, and `--compile-check`'s verdict audit: the static filter checked
against the compiler both ways (a kept tactic the compiler puts over the limit; a tactic rejected
for its footprint that the compiler fits in — a lost tactic, the way FlashInfer's static filter
once dropped the only working SM120 MoE tile). Names no family: `Family.precompile` compiles.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from autotune.core.arch import Arch
from autotune.engine import workers as workers_mod
from autotune.engine.workers import Runner


@dataclass
class Audit:
    """The audit of one arch. Rejections by a rule that is no footprint claim are counted, not
    compiled: their compiled footprint says nothing about the rule."""

    arch: str
    seed: int
    kept_compiled: int = 0
    kept_over: list = field(default_factory=list)        # "problem tactic: compiled smem X > limit"
    footprint_rejected: int = 0                          # distinct (format, epilogue, tactic) rejected by footprint
    sampled: int = 0
    compiled: int = 0                                    # of the sample, compiled
    lost: list = field(default_factory=list)             # "problem tactic: rejected (reason), compiled smem X <= limit"
    failures: list = field(default_factory=list)         # of the sample, did not compile
    rule_rejected: int = 0                               # rejected by a rule that is not a footprint claim

    def lines(self) -> list[str]:
        out = [f"verdict audit on {self.arch}: {len(self.kept_over)} of {self.kept_compiled} compiled kept tactics "
               f"over the smem limit; {len(self.lost)} of {self.compiled} compiled footprint-rejected tactics fit "
               f"(lost) — sample of {self.sampled} of {self.footprint_rejected} (seed {self.seed}), "
               f"{len(self.failures)} did not compile; {self.rule_rejected} rejected by rules that are no "
               "footprint claim, not compiled"]
        out += [f"KEPT OVER LIMIT {e}" for e in self.kept_over]
        out += [f"LOST TACTIC {e}" for e in self.lost]
        return out


def _compile_timed(rows: list, target: Arch, runner: Runner, report, stage: str) -> list[tuple]:
    """Compile Planned `rows` for `target` in the runner's compile pool (its workers, timeout and
    isolation), the wall time added to report stage `stage`: (error, smem, signal) per row, in order."""
    t0 = time.perf_counter()
    results = workers_mod.compile_all([(r.problem.key, r.tactic.to_json()) for r in rows], target.name,
                                      runner.compile_workers, runner.families, timeout_s=runner.timeout_s,
                                      isolate=runner.isolate)
    report.stages.add(stage, time.perf_counter() - t0, len(rows))
    return results


def compile_kept(items: list, target: Arch, runner: Runner, report) -> list[tuple]:
    """Compile kept tactics (Planned rows) for `target` in `runner.compile_workers` processes, each
    under `runner.timeout_s` (killed past it); note every disagreement between the compiler's
    shared memory and the verdict's, and with an audit every kept tactic over the limit. Returns
    (error or None, exit signal or None) per item, in order."""
    results = _compile_timed(items, target, runner, report, "compile")
    for r, (err, smem, _sig) in zip(items, results):
        note_compiled(r, err, smem, target, report)
    return [(err, sig) for err, _smem, sig in results]


def note_compiled(r, err: str | None, smem: int | None, target: Arch, report) -> None:
    """One kept tactic's precompile in the report: counted, its failure listed, a compiler smem
    that disagrees with the verdict's noted, and with an audit a kept tactic over the limit."""
    report.compiled += 1
    if err is not None:
        report.compile_failures.append(f"{r.problem.key} {r.tactic}: {err}")
        return
    if smem is not None and r.verdict.smem_bytes is not None and smem != r.verdict.smem_bytes:
        report.model_errors.append(f"{r.problem.key} {r.tactic}: compiler says smem {smem} on "
                                   f"{target.name}, model {r.verdict.smem_bytes}")
    if report.audit is not None and smem is not None:
        report.audit.kept_compiled += 1
        if smem > target.smem_per_block_optin:
            report.audit.kept_over.append(f"{r.problem.key} {r.tactic}: compiled smem {smem} > "
                                          f"{target.smem_per_block_optin}")


def compile_rejected(rows: list, target: Arch, runner: Runner, n: int, report, log=lambda s: None) -> None:
    """Compile a seeded sample of `n` of the rows (Planned, of families that compile) rejected for
    their footprint, into report.audit. One per distinct (format, epilogue, tactic): the compiled
    footprint does not depend on N and K."""
    audit, limit = report.audit, target.smem_per_block_optin
    by_config: dict = {}
    for r in rows:
        v = r.verdict
        if not v.rejected:
            continue
        if v.smem_bytes is not None and v.smem_limit is not None and v.smem_bytes > v.smem_limit:
            by_config.setdefault((r.problem.w_fmt, r.problem.epilogue, r.tactic), r)
        else:
            audit.rule_rejected += 1
    pool = sorted(by_config.values(), key=lambda r: (r.problem.key, r.tactic.id))
    sample = random.Random(audit.seed).sample(pool, min(n, len(pool)))
    audit.footprint_rejected, audit.sampled = len(pool), len(sample)
    step = max(1, 4 * runner.compile_workers)         # in slices, so a long audit says how far it got
    for i in range(0, len(sample), step):
        part = sample[i:i + step]
        results = _compile_timed(part, target, runner, report, "audit compile")
        for r, (err, smem, _sig) in zip(part, results):
            if err is not None or smem is None:
                audit.failures.append(f"{r.problem.key} {r.tactic}: {err or 'no figure'}")
                continue
            audit.compiled += 1
            if smem <= limit:
                audit.lost.append(f"{r.problem.key} {r.tactic}: rejected ({r.verdict.reason}), compiled smem "
                                  f"{smem} <= {limit}")
        log(f"verdict audit on {target.name}: {i + len(part)} of {len(sample)} footprint-rejected compiled or "
            f"failed, {len(audit.lost)} lost, {len(audit.failures)} failed")
