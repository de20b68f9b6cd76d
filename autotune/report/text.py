"""What `autotune search` and `autotune show` print: plain lines and JSON built from library results.

Kept apart from the CLI so a script gets the same text and JSON as the command line (the CLI
only parses, makes one library call and prints what these functions return).
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict
from typing import Iterator

from autotune.report.model import Summary

_STATE = {True: "kept", False: "REJECTED", None: "unknown"}


def search_lines(report, uses, listed: dict | None = None, cache_url: str | None = None) -> Iterator[str]:
    """The text of a search: notes, per problem its per-family plan (and every tactic of the
    families in `listed`: problem key -> Planned rows), compile results, what was measured when
    `cache_url` (the cache written) is given, then model errors."""
    yield from report.notes
    for u in uses:
        yield f"{u.problem.key}  ({', '.join(u.layers)}; {u.per_forward}× per forward)"
        for fp in report.plans.get(u.problem.key, []):
            yield f"  {report.arch}: {fp.line()}"
        for r in (listed or {}).get(u.problem.key, []):    # "kept" / "REJECTED" / "unknown", smem, reason
            v = r.verdict
            smem = f" smem {v.smem_bytes}/{v.smem_limit} stages {v.stages}" if v.smem_bytes else ""
            yield f"    {_STATE[v.ok]:8} {r.tactic}{smem}{': ' + v.reason if v.reason else ''}"
    if report.compiled:
        yield (f"compiled {report.compiled} kept tactics for {report.arch} "
               f"({len(report.compile_failures)} failed, {len(report.model_errors)} smem disagreements)")
        for e in report.compile_failures:
            yield f"COMPILE FAILED {e}"
    if getattr(report, "audit", None) is not None:
        yield from report.audit.lines()
    if cache_url is not None:
        yield (f"measured {report.measured} trials ({report.dropped} dropped before the final round, "
               f"{report.failed} failed), {report.resumed} already in the cache; "
               f"{len(report.winners)} winners in {cache_url}"
               + (f" ({report.predicted} predicted: the rank model's first choice, checked against float64, not "
                  "timed; a measured search replaces them)" if getattr(report, "predicted", 0) else ""))
        failures = getattr(report, "job_failures", [])
        if failures:
            yield (f"{len(failures)} (problem, bucket) jobs not measured (their tactics stay unmeasured; "
                   "a rerun measures them):")
            yield from (f"  {f}" for f in failures)
        if len(report.shards) > 1:
            yield "jobs per worker: " + ", ".join(f"{k} {v}" for k, v in sorted(report.shards.items()))
        if report.stages.data:
            yield from stage_lines(report.stages.data)
    for e in report.model_errors:
        yield f"MODEL ERROR {e}"
    if cache_url is not None and report.device == "cpu":
        yield from gpu_would_add(report)


def gpu_would_add(report) -> Iterator[str]:
    """The closing lines of a search on a machine without a GPU: what the same command adds on one."""
    left: dict[str, int] = {}
    for fps in report.plans.values():
        for fp in fps:
            if fp.skipped:
                left[fp.family] = left.get(fp.family, 0) + fp.skipped
    fams = ", ".join(f"{f} ({n:,} tactics that pass the CPU profile's verdicts)" for f, n in sorted(left.items()))
    yield ("what a GPU run adds: the same command on a GPU times every tactic on the GPU that serves, with the "
           "GPU families measured too" + (f" — here left out: {fams}" if fams else "")
           + "; the winners above serve CPU dispatch only (each winner is keyed by its device)")


def search_json(report, uses) -> dict:
    return {
        "arch": report.arch, "device": report.device, "notes": report.notes,
        "problems": [{"key": u.problem.key, "layers": list(u.layers), "per_forward": u.per_forward,
                      "families": [{"family": fp.family, "kept": fp.kept, "rejected": fp.rejected,
                                    "unknown": fp.unknown, "skipped": fp.skipped,
                                    "unsampled": fp.unsampled, "reasons": {fp.examples[r]: n for r, n in fp.reasons.items()},
                                    "unknown_reasons": {fp.unknown_examples[r]: n for r, n in fp.unknown_reasons.items()}}
                                   for fp in report.plans.get(u.problem.key, [])]} for u in uses],
        "measured": report.measured, "dropped": report.dropped, "failed": report.failed, "resumed": report.resumed,
        "compiled": report.compiled, "compile_failures": report.compile_failures, "shards": report.shards,
        "stages": {k: {"count": n, "seconds": sec} for k, (n, sec) in report.stages.data.items()},
        "job_failures": list(getattr(report, "job_failures", [])),
        "worker_memory": {**getattr(report.stages, "memory", {}), **getattr(report.stages, "counts", {}),
                          "worst_job": getattr(report.stages, "worst_job", "")},
        "model_errors": report.model_errors,
        **({"audit": asdict(report.audit)} if getattr(report, "audit", None) is not None else {}),
        "winners": [{"problem": w.problem_key, "bucket": w.bucket, "tactic": json.loads(w.params_json),
                     "tactic_id": w.tactic_id, "median_us": w.median_us, "speedup_over_default": w.speedup}
                    for w in report.winners],
    }


def report_points(summary: Summary) -> dict:
    """(device key, problem key, bucket) -> the report's figures of that winner (roofline, baselines)."""
    return {(d.device_key, v.key, p.bucket): {"arch": d.arch, **asdict(p)}
            for d in summary.devices for v in d.problems for p in v.points}


def winners_json(winners, gpu_names: dict, summary: Summary) -> list[dict]:
    """`show --json`: one object per winner; the report's figures under "report"."""
    extra = report_points(summary)
    return [{**w.__dict__, "gpu": gpu_names.get(w.device_key),
             "report": extra.get((w.device_key, w.problem_key, w.bucket))} for w in winners]


def verdicts_json(summary: Summary) -> list[dict]:
    """`show --json --verbose`: per device and family the verdict counts and every reason group,
    its one-line form and its full example text."""
    return [{"device_key": d.device_key, "gpu": d.gpu_name, "arch": d.arch,
             "families": [{"family": fv.family, "kept": fv.kept, "rejected": fv.rejected, "ok": fv.ok,
                           "dropped": fv.dropped, "failed": fv.failed,
                           "reasons": [{"status": g.status, "count": g.count, "short": g.short, "reason": g.reason}
                                       for g in fv.reasons]} for fv in d.verdicts]}
            for d in summary.devices]


def stale_lines(stale, stale_trials: int, total: int, gpu_names: dict, url: str) -> Iterator[str]:
    """`show --stale`: each winner measured with other kernel code (not served), then the counts."""
    for w, why in stale:
        yield (f"{w.problem_key}  m={w.bucket}  {gpu_names.get(w.device_key) or w.device_key}  "
               f"{w.family} {w.tactic_id}: {why}")
    yield (f"{len(stale)} of {total} winners and {stale_trials} trials in {url} were measured with other kernel "
           "code than this install's: not served; `autotune search` measures them again, "
           "`autotune cache prune --stale-code` drops them")


def miss_lines(misses, gpu_names: dict, url: str) -> Iterator[str]:
    if not misses:
        yield f"no misses in {url}"
    for m in misses:
        yield f"{m.problem_key}  m={m.m}  {m.count}×  {gpu_names.get(m.device_key) or m.device_key}"


def explain_lines(rows) -> Iterator[str]:
    """`show --explain`: per problem its layers, then per M the rung, the tactic and why (names are
    never cut: a long line wraps on the terminal, a pipe gets it whole)."""
    last = None
    for r in rows:
        if r.problem != last:
            last = r.problem
            yield f"{r.problem}  ({', '.join(r.layers)})" if r.layers else r.problem
        yield f"  M={r.m:<5} {r.rung:9} {r.tactic}"
        yield f"           {r.why}"
    if rows:
        n = Counter(r.rung for r in rows)
        yield "rungs: " + ", ".join(f"{k} {n[k]}" for k in ("pinned", "exact", "predicted", "nearest", "default") if n[k])


def stage_lines(data: dict) -> Iterator[str]:
    """Where the time went, as a short table: each stage's seconds, count and cost each, largest
    first; a part of a stage ("check: call") indented under it and not added to anything."""
    top = {k: v for k, v in data.items() if ": " not in k}
    parts: dict[str, list] = {}
    for k, v in data.items():
        if ": " in k:
            parts.setdefault(k.split(": ", 1)[0], []).append((k.split(": ", 1)[1], v))
    for parent in parts:                    # a part whose stage was never timed on its own still shows
        top.setdefault(parent, None)
    w = max([len("stage"), *(len(k) for k in top), *(2 + len(n) for ps in parts.values() for n, _ in ps)])

    def row(name: str, v) -> str:
        if v is None:
            return f"{name:<{w}}"
        n, sec = v
        return f"{name:<{w}} {sec:9.1f} {n:7d} {1e3 * sec / max(n, 1):10.1f}"
    yield "time per stage, summed over workers (an indented line is part of the stage above it, not added):"
    yield f"{'stage':<{w}} {'seconds':>9} {'count':>7} {'ms each':>10}"
    for k in sorted(top, key=lambda k: -(top[k] or (0, 0.0))[1]):
        yield row(k, top[k])
        for n, v in sorted(parts.get(k, []), key=lambda nv: -nv[1][1]):
            yield row("  " + n, v)
