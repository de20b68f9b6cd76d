"""Reports of what a search found: an HTML page with PNG plots, and the same summary in a terminal.

    from autotune.report import collect, write_html
    summary = collect(Store(url, readonly=True))
    write_html(summary, Path("report/"))

Everything comes from the cache (trials, winners, misses, devices, libsets, meta); nothing is
re-measured, except the roofline ceilings when asked (`measure_ceilings`, stored in `meta`).
"""
from __future__ import annotations

from pathlib import Path

from dataclasses import asdict

from autotune.report.model import Summary, checked, collect, skip_notes
from autotune.cache.rows import check_miss, check_winner


def write_html(summary: Summary, outdir: str | Path) -> Path:
    from autotune.report.page import write   # matplotlib is imported only when a page is made
    return write(summary, Path(outdir))


def print_summary(summary: Summary, console=None) -> None:
    from autotune.report.terminal import print_summary as p
    p(summary, console)


def show_json(store, problem_keys: set[str] | None = None) -> tuple[list[dict], Summary]:
    """`autotune show --json`: one object per winner that passes autotune.cache.rows.check_winner (sorted by
    problem, device, bucket) with its GPU name and the report's figures under "report", and the
    summary, whose `skipped` counts and notes name the rows left out."""
    summary = collect(store, problem_keys)
    points = {(d.device_key, v.key, p.bucket): {"arch": d.arch, **asdict(p)}
              for d in summary.devices for v in d.problems for p in v.points}
    gpus = {k: r.get("gpu_name") for k, r in store.device_records().items()}
    rows = [w for w in store.winners() if (problem_keys is None or w.problem_key in problem_keys)
            and check_winner(w) is None]
    rows.sort(key=lambda w: (w.problem_key, w.device_key, w.bucket))
    return [{**w.__dict__, "gpu": gpus.get(w.device_key), "report": points.get((w.device_key, w.problem_key, w.bucket))}
            for w in rows], summary


def show_misses(store, problem_keys: set[str] | None = None) -> tuple[list, list[str]]:
    """`autotune show --misses`: the recorded misses that pass autotune.cache.rows.check_miss, most frequent
    first, and the notes naming what was skipped."""
    rows, skipped = checked([m for m in store.misses() if problem_keys is None or m.problem_key in problem_keys],
                            check_miss)
    rows.sort(key=lambda m: (-m.count, m.problem_key, m.m))
    return rows, skip_notes({"misses": skipped})


def measure_ceilings(store, device: str | None = None) -> tuple[str, "object"]:
    """Measure the live device's copy bandwidth and bf16 matmul rate; store them for its device key."""
    from autotune.core.env import cpu, current
    from autotune.report import ceilings
    env = cpu() if device == "cpu" else current()
    c = ceilings.measure(env.device)
    ceilings.store_measured(store, env.device_key, c)
    return env.device_key, c


__all__ = ["Summary", "collect", "write_html", "print_summary", "measure_ceilings", "show_json", "show_misses"]
