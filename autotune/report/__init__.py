"""Reports of what a search found: an HTML page with PNG plots, and the same summary in a terminal.

    from autotune.report import collect, write_html
    summary = collect(Store(url, readonly=True))
    write_html(summary, Path("report/"))

Everything comes from the cache (trials, winners, misses, devices, libsets, meta); nothing is
re-measured, except the roofline ceilings when asked (`measure_ceilings`, stored in `meta`).
"""
from __future__ import annotations

from pathlib import Path

from autotune.report.model import Summary, collect


def write_html(summary: Summary, outdir: str | Path) -> Path:
    from autotune.report.page import write   # matplotlib is imported only when a page is made
    return write(summary, Path(outdir))


def print_summary(summary: Summary, console=None) -> None:
    from autotune.report.terminal import print_summary as p
    p(summary, console)


def measure_ceilings(store, device: str | None = None) -> tuple[str, "object"]:
    """Measure the live device's copy bandwidth and bf16 matmul rate; store them for its device key."""
    from autotune.core.env import cpu, current
    from autotune.report import ceilings
    env = cpu() if device == "cpu" else current()
    c = ceilings.measure(env.device)
    ceilings.store_measured(store, env.device_key, c)
    return env.device_key, c


__all__ = ["Summary", "collect", "write_html", "print_summary", "measure_ceilings"]
