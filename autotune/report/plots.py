"""The report's PNG figures (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless, deterministic
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from autotune.report.model import DeviceView, ProblemView  # noqa: E402

DPI = 100
_PNG_META = {"Software": None}  # no matplotlib version stamp: same data, same bytes


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png", metadata=_PNG_META)
    plt.close(fig)
    return path


def _bucket_axis(ax, buckets: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(buckets))))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(v)}"))
    ax.set_xlabel("M (bucket, tokens)")


def time_vs_bucket(view: ProblemView, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.2))
    xs = view.buckets
    ax.plot(xs, [p.winner_us for p in view.points], "o-", lw=2.5, color="C0", label="winner", zorder=5)
    dx = [p.bucket for p in view.points if p.default_us]
    if dx:
        ax.plot(dx, [p.default_us for p in view.points if p.default_us], "s--", lw=1.5, color="C3",
                label=f"family default ({view.points[0].default})")
    fams = sorted({f for p in view.points for f in p.best_by_family})
    for i, fam in enumerate(fams):
        pts = [(p.bucket, p.best_by_family[fam]) for p in view.points if fam in p.best_by_family]
        ax.plot(*zip(*pts), ":", marker=".", lw=1.2, color=f"C{(i + 4) % 10}", label=f"best {fam}")
    labels = sorted({b for p in view.points for b in p.baselines})
    for i, lab in enumerate(labels):
        pts = [(p.bucket, p.baselines[lab]) for p in view.points if lab in p.baselines]
        ax.plot(*zip(*pts), "-.", marker="^", lw=1.5, color=f"C{(i + 1) % 10}", label=f"baseline {lab}")
    _bucket_axis(ax, xs)
    ax.set_yscale("log")
    ax.set_ylabel("median time per call (µs)")
    ax.set_title(view.key, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _save(fig, path)


def speedup(dev: DeviceView, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 4.2))
    buckets: list[int] = []
    for i, v in enumerate(dev.problems):
        pts = [(p.bucket, p.speedup) for p in v.points if p.speedup]
        if pts:
            ax.plot(*zip(*pts), "o-", color=f"C{i % 10}", label=v.key)
            buckets += [b for b, _ in pts]
    ax.axhline(1.0, color="black", lw=1, ls="--")
    if buckets:
        _bucket_axis(ax, buckets)
    ax.set_ylabel("winner speedup over the family default (×)")
    ax.set_title(f"{dev.gpu_name}: winner vs default", fontsize=10)
    ax.grid(True, alpha=0.3)
    if buckets:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def roofline(dev: DeviceView, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 5))
    ais = [p.intensity for v in dev.problems for p in v.points]
    perf = [p.tflops for v in dev.problems for p in v.points]
    for i, v in enumerate(dev.problems):
        ax.scatter([p.intensity for p in v.points], [p.tflops for p in v.points], color=f"C{i % 10}",
                   label=v.key, zorder=5, s=28)
        for p in v.points:
            ax.annotate(f"{p.bucket}", (p.intensity, p.tflops), textcoords="offset points", xytext=(3, 3), fontsize=6)
    c = dev.ceilings
    lo = min(ais + [1.0]) / 2
    hi = max(ais + [1.0]) * 2
    if c and c.get("bandwidth_gbs"):
        bw = c["bandwidth_gbs"]
        peaks = c.get("tflops") or {}
        top = max(peaks.values()) if peaks else None
        hi = max(hi, (top * 1e3 / bw) * 4 if top else hi)
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(xs, [min(bw * x / 1e3, top) if top else bw * x / 1e3 for x in xs], color="black", lw=1.5,
                label=f"memory {bw:,.0f} GB/s")
        for j, (kind, tf) in enumerate(sorted(peaks.items())):
            ax.axhline(tf, color="grey", ls=("--", ":")[j % 2], lw=1, label=f"{kind} peak {tf:,.1f} TFLOP/s")
        origin = "measured on this device, stored in the cache" if c.get("stored") else "from hardware.md, not stored in the cache"
        ax.set_title(f"{dev.gpu_name}: roofline (ceilings {origin})", fontsize=9)
    else:
        ax.set_title(f"{dev.gpu_name}: achieved rate by intensity (no ceilings known for this device)", fontsize=9)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    if perf:
        ymin = min(perf) / 3
        ax.set_ylim(bottom=ymin)
    ax.set_xlabel("arithmetic intensity (FLOP / byte of minimum traffic)")
    ax.set_ylabel("achieved TFLOP/s (winner)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)
