"""The report's PNG figures (matplotlib, Agg backend: no display needed).

Each figure is built by a `*_figure` function and saved by its namesake; the builders are what
the tests render to check the layout (`figure_text.layout_problems`: no two text boxes overlap,
none leaves the figure). Rules that keep text apart (text placement itself is figure_text's):
legends sit below the axes (outside them) and the figure grows to hold them; long titles and
legend entries wrap; M is a log2 axis with only powers of two labelled (the other buckets are minor
ticks); point labels are placed one at a time where they collide with no text already placed, and
left out (they are in the table under the figure) where no place is free.
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless, deterministic
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from autotune.report.figure_text import DPI, header, legend_below, overlap, place_labels, text_boxes  # noqa: E402
from autotune.report.model import DeviceView, ProblemView  # noqa: E402
from autotune.report.step import KINDS, StepView  # noqa: E402

WIDTH_IN = 8.0
_PNG_META = {"Software": None}  # no matplotlib version stamp: same data, same bytes
_KIND_COLORS = {"dense MLP": ("#1f4e9c", "#6f9ae0"), "shared expert": ("#2e7d32", "#81c784"),
                "routed experts": ("#c25400", "#ffb74d")}


# ------------------------------------------------------------------------------------ axes

def _num(v: float) -> str:
    if v >= 1000:
        return f"{v:,.0f}"
    return f"{v:g}"


def _bucket_axis(ax, buckets: list[int]) -> None:
    """log2 M: powers of two labelled (every other one past 12 labels), the other buckets minor ticks."""
    bs = sorted(set(buckets))
    lo, hi = bs[0], bs[-1]
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo / 1.35, hi * 1.35)
    pows = [1 << e for e in range(int(math.floor(math.log2(lo))), int(math.ceil(math.log2(hi))) + 1)
            if lo / 1.35 <= (1 << e) <= hi * 1.35]
    if len(pows) < 2:                     # a narrow range: its own buckets are the labels
        pows = bs if len(bs) <= 8 else bs[::max(1, len(bs) // 6)]
    step = 1
    while len(pows[::step]) > 12:
        step += 1
    majors = pows[::step]
    ax.xaxis.set_major_locator(FixedLocator(majors))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{int(round(v))}"))
    ax.xaxis.set_minor_locator(FixedLocator([b for b in bs if b not in majors]))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("M (tokens, log scale; ticks at every bucket)", fontsize=9)


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 ticks inside [lo, hi]; fewer mantissas when there are too many, more when too few."""
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mant in ((1, 2, 5), (1,), (1, 1.5, 2, 3, 5, 7)):
        ticks = [m * 10 ** e for e in range(e0, e1 + 1) for m in mant if lo <= m * 10 ** e <= hi]
        if 3 <= len(ticks) <= 9:
            return ticks
    ticks = [10 ** e for e in range(e0, e1 + 1) if lo <= 10 ** e <= hi]
    while len(ticks) > 9:
        ticks = ticks[::2]
    return ticks or [lo, hi]


def _log_axis(ax, axis: str, values: list[float], label: str) -> None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    lo, hi = (min(vals), max(vals)) if vals else (1.0, 10.0)
    lo, hi = lo / 1.4, hi * 1.4
    a = ax.xaxis if axis == "x" else ax.yaxis
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log")
    (ax.set_xlim if axis == "x" else ax.set_ylim)(lo, hi)
    a.set_major_locator(FixedLocator(_log_ticks(lo, hi)))
    a.set_major_formatter(FuncFormatter(lambda v, _: _num(v)))
    a.set_minor_locator(NullLocator())
    (ax.set_xlabel if axis == "x" else ax.set_ylabel)(label, fontsize=9)


def _new(height: float) -> tuple[Figure, object]:
    fig = plt.figure(figsize=(WIDTH_IN, height), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.tick_params(labelsize=8)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=DPI, format="png", metadata=_PNG_META)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------ figures

MAX_WINNER_ENTRIES = 6


def time_figure(view: ProblemView) -> Figure:
    """Winner, family default and the best of each family per M; the winner's markers coloured by
    which tactic won (the most frequent ones named, the others 'other winners')."""
    base_h = 3.6
    fig, ax = _new(base_h)
    xs = view.buckets
    (line,) = ax.plot(xs, [p.winner_us for p in view.points], "-", lw=2.2, color="#333333", zorder=4)
    handles, labels = _winner_markers(ax, view)
    ref_handles, ref_labels = _reference_lines(ax, view)
    handles = [line, *handles, *ref_handles]
    labels = ["winner (fastest timed)", *labels, *ref_labels]
    ys = [p.winner_us for p in view.points] + [p.default_us for p in view.points if p.default_us] + \
         [u for p in view.points for u in list(p.best_by_family.values()) + list(p.baselines.values())]
    _bucket_axis(ax, xs)
    _log_axis(ax, "y", ys, "median time per call (µs, log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="x", alpha=0.12)
    header(fig, ax, view.title, view.key)
    legend_below(fig, handles, labels, base_h)
    return fig


def _winner_markers(ax, view: ProblemView) -> tuple[list, list[str]]:
    """The winner's markers, one colour and shape for each of the most frequent winning tactics and
    white for the others; their legend handles and labels."""
    handles, labels = [], []
    counts: dict[str, int] = {}
    for p in view.points:
        counts[view.winner_json(p)] = counts.get(view.winner_json(p), 0) + 1
    named = sorted(counts, key=lambda k: (-counts[k], k))[:MAX_WINNER_ENTRIES]
    markers = "oDs^v<>"
    for i, tj in enumerate(named):
        pts = [(p.bucket, p.winner_us) for p in view.points if view.winner_json(p) == tj]
        h = ax.scatter(*zip(*pts), s=34, color=f"C{i}", marker=markers[i % len(markers)], zorder=6,
                       edgecolors="black", linewidths=0.4)
        handles.append(h)
        labels.append(f"winner {view.short(tj)} ({counts[tj]} of {len(view.buckets)} M)")
    rest = [(p.bucket, p.winner_us) for p in view.points if view.winner_json(p) not in named]
    if rest:
        handles.append(ax.scatter(*zip(*rest), s=22, color="white", edgecolors="black", zorder=6))
        labels.append(f"other winners ({len(rest)} M)")
    return handles, labels


def _reference_lines(ax, view: ProblemView) -> tuple[list, list[str]]:
    """The lines the winner is compared with: the family default, the best tactic of each family
    and each baseline; their legend handles and labels."""
    handles, labels = [], []
    dpts = [(p.bucket, p.default_us) for p in view.points if p.default_us]
    if dpts:
        (h,) = ax.plot(*zip(*dpts), "--", lw=1.4, color="#c62828", zorder=3)
        fam = view.points[0].default.split("[")[0]
        handles.append(h)
        labels.append(f"family default ({fam})")
    fams = sorted({f for p in view.points for f in p.best_by_family})
    styles = [":", (0, (3, 1, 1, 1)), (0, (5, 2))]
    for i, fam in enumerate(fams):
        pts = [(p.bucket, p.best_by_family[fam]) for p in view.points if fam in p.best_by_family]
        (h,) = ax.plot(*zip(*pts), linestyle=styles[i % len(styles)], lw=1.2, color=f"C{(i + 6) % 10}", zorder=2)
        handles.append(h)
        labels.append(f"best {fam} tactic")
    blabels = sorted({b for p in view.points for b in p.baselines})
    for i, lab in enumerate(blabels):
        pts = [(p.bucket, p.baselines[lab]) for p in view.points if lab in p.baselines]
        (h,) = ax.plot(*zip(*pts), "-.", marker="^", ms=4, lw=1.2, color=f"C{(i + 8) % 10}", zorder=2)
        handles.append(h)
        labels.append(f"baseline {lab}")
    return handles, labels


def time_vs_bucket(view: ProblemView, path: Path) -> Path:
    return _save(time_figure(view), path)


def speedup_figure(dev: DeviceView) -> Figure:
    base_h = 3.6
    fig, ax = _new(base_h)
    buckets: list[int] = []
    handles, labels, ys = [], [], [1.0]
    for i, v in enumerate(dev.problems):
        pts = [(p.bucket, p.speedup) for p in v.points if p.speedup]
        if pts:
            (h,) = ax.plot(*zip(*pts), marker="o", ms=3.5, lw=1.3, color=f"C{i % 10}",
                           linestyle=("-", "--", ":")[(i // 10) % 3])
            handles.append(h)
            labels.append(v.label)
            buckets += [b for b, _ in pts]
            ys += [s for _, s in pts]
    ax.axhline(1.0, color="black", lw=1, ls="--")
    if buckets:
        _bucket_axis(ax, buckets)
    lo, hi = min(ys), max(ys)
    ax.set_ylim(min(0.9, lo - 0.05 * (hi - lo)), hi + 0.08 * (hi - lo) + 0.05)
    ax.set_ylabel("winner speedup over the family default (×)", fontsize=9)
    ax.grid(True, alpha=0.3)
    header(fig, ax, f"{dev.gpu_name}: winner vs the family default, per M", None)
    if handles:
        legend_below(fig, handles, labels, base_h)
    return fig


def speedup(dev: DeviceView, path: Path) -> Path:
    return _save(speedup_figure(dev), path)


def roofline_labels(v: ProblemView) -> list:
    """The points worth a label: first and last bucket, and the best and worst fraction of roof."""
    pts = v.points
    if not pts:
        return []
    pick = [pts[0], pts[-1]]
    rated = [p for p in pts if p.roof_fraction is not None]
    if rated:
        pick += [max(rated, key=lambda p: p.roof_fraction), min(rated, key=lambda p: p.roof_fraction)]
    seen, out = set(), []
    for p in pick:
        if p.bucket not in seen:
            seen.add(p.bucket)
            out.append(p)
    return out


def roofline_figure(dev: DeviceView) -> Figure:
    base_h = 4.4
    fig, ax = _new(base_h)
    ais = [p.intensity for v in dev.problems for p in v.points]
    perf = [p.tflops for v in dev.problems for p in v.points]
    handles, labels = [], []
    marks = "os^Dv<>P"
    for i, v in enumerate(dev.problems):
        h = ax.scatter([p.intensity for p in v.points], [p.tflops for p in v.points], color=f"C{i % 10}",
                       marker=marks[(i // 10) % len(marks)], zorder=5, s=22)
        handles.append(h)
        labels.append(v.label)
    c = dev.ceilings
    lo = min(ais + [1.0]) / 2
    hi = max(ais + [1.0]) * 2
    ys = list(perf)
    if c and c.get("bandwidth_gbs"):
        bw = c["bandwidth_gbs"]
        peaks = c.get("tflops") or {}
        top = max(peaks.values()) if peaks else None
        hi = max(hi, (top * 1e3 / bw) * 4 if top else hi)
        xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        (h,) = ax.plot(xs, [min(bw * x / 1e3, top) if top else bw * x / 1e3 for x in xs], color="black", lw=1.5)
        handles.append(h)
        labels.append(f"memory roof {bw:,.0f} GB/s")
        ys += [bw * lo / 1e3]
        for j, (kind, tf) in enumerate(sorted(peaks.items())):
            h = ax.axhline(tf, color="grey", ls=("--", ":")[j % 2], lw=1)
            handles.append(h)
            labels.append(f"{kind} peak {tf:,.1f} TFLOP/s")
            ys.append(tf)
        origin = "measured on this device, stored in the cache" if c.get("stored") else \
            "from hardware.md, not stored in the cache"
        title = f"{dev.gpu_name}: roofline (ceilings {origin})"
    else:
        title = f"{dev.gpu_name}: achieved rate by intensity (no ceilings known for this device)"
    _log_axis(ax, "x", [lo * 1.4, hi / 1.4], "arithmetic intensity (FLOP / byte of minimum traffic, log)")
    _log_axis(ax, "y", ys, "achieved TFLOP/s of the winner (log)")
    ax.grid(True, which="major", alpha=0.3)
    header(fig, ax, title, None)
    legend_below(fig, handles, labels, base_h)
    items = [(p.intensity, p.tflops, f"{p.bucket}", f"C{i % 10}")
             for i, v in enumerate(dev.problems) for p in roofline_labels(v)]
    place_labels(fig, ax, items, [(p.intensity, p.tflops) for v in dev.problems for p in v.points])
    return fig


def roofline(dev: DeviceView, path: Path) -> Path:
    return _save(roofline_figure(dev), path)


def step_figure(sv: StepView, gpu: str) -> Figure:
    """Horizontal stacked bars per M: the estimate (winners × layer counts, one segment per layer)
    and, when given, the measured step (one segment per layer kind, hatched); a black tick marks
    each bar's byte floor."""
    ms = sv.measured
    rows = sorted(set(sv.buckets) | (set(ms.total_us) if ms else set()))
    per = 2 if ms else 1
    base_h = 1.1 + 0.34 * per * len(rows)
    fig, ax = _new(base_h)
    seg_color = _segment_colors(sv)
    unit, div = _step_unit(sv)
    ypos, yl, ends, floor_drawn = _step_bars(ax, sv, rows, seg_color, unit, div)
    handles, labels = _step_legend(sv, seg_color, floor_drawn)
    ax.set_yticks(ypos, yl)
    ax.invert_yaxis()
    xmax = max([x for x, _, _ in ends] + [0.001])
    ax.set_xlim(0, xmax * 1.22)
    ax.set_xlabel(f"time per forward pass, every MLP layer ({unit})", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    header(fig, ax, f"{gpu}: MLP decode step per M — stored winners × layer counts", None)
    legend_below(fig, handles, labels, base_h, width=80)
    _label_totals(fig, ax, ends)
    return fig


def _segment_colors(sv: StepView) -> dict[str, str]:
    """Each layer's segment colour: its kind's palette, shade after shade in the order of the parts."""
    shades: dict[str, int] = {}
    seg_color = {}
    for part in sv.parts:
        n = shades.get(part.kind, 0)
        shades[part.kind] = n + 1
        pal = _KIND_COLORS[part.kind]
        seg_color[part.key] = pal[n % len(pal)]
    return seg_color


def _step_unit(sv: StepView) -> tuple[str, float]:
    """The time axis' unit and its divisor from ms: the unit follows the largest bar, ms, or s from
    10 s up (a CPU run's step: 800 s, not 800,000 ms)."""
    ms = sv.measured
    peak = max([sum(part.count * part.us[m] for part in sv.parts) / 1e3 for m in sv.buckets]
               + ([v / 1e3 for v in ms.total_us.values()] if ms else []) + [0.0])
    return ("s", 1e3) if peak >= 1e4 else ("ms", 1.0)


def _step_bars(ax, sv: StepView, rows: list[int], seg_color: dict[str, str], unit: str,
               div: float) -> tuple[list[float], list[str], list[tuple[float, float, str]], bool]:
    """Per M, the estimate's bar and (when measured) the measured one; returns the bars' y positions,
    their y labels, (end x, y, total) for each and whether a byte floor tick was drawn."""
    ms = sv.measured
    ypos, yl, ends = [], [], []
    y = 0.0
    floor_drawn = False
    for m in rows:
        if m in sv.buckets:
            left, floor = _estimate_bar(ax, sv, m, y, seg_color, div)
            floor_drawn = floor_drawn or floor
            ends.append((left, y, f"{left:.2f} {unit}"))
            ypos.append(y)
            yl.append(f"M={m} estimate" if ms else f"M={m}")
            y += 1
        if ms and m in ms.total_us:
            left = _measured_bar(ax, ms, m, y, div)
            ends.append((left, y, f"{left:.2f} {unit}"))
            ypos.append(y)
            yl.append(f"M={m} measured")
            y += 1
        y += 0.4
    return ypos, yl, ends, floor_drawn


def _estimate_bar(ax, sv: StepView, m: int, y: float, seg_color: dict[str, str], div: float) -> tuple[float, bool]:
    """The estimate at M as one segment per layer, and its byte floor tick when known; returns the
    bar's length and whether the tick was drawn."""
    left = 0.0
    for part in sv.parts:
        w = part.count * part.us[m] / 1e3 / div
        ax.barh(y, w, left=left, height=0.8, color=seg_color[part.key], edgecolor="white", lw=0.5)
        left += w
    fl = sv.floor_us(m)
    if fl:
        ax.plot([fl / 1e3 / div] * 2, [y - 0.45, y + 0.45], color="black", lw=2)
    return left, bool(fl)


def _measured_bar(ax, ms, m: int, y: float, div: float) -> float:
    """The measured step at M, hatched: one segment per layer kind, or one grey bar when only its
    total is known, and its own byte floor as a dotted tick; returns the bar's length."""
    left = 0.0
    if ms.kinds.get(m):
        for kind in KINDS:
            w = ms.kinds[m].get(kind, 0.0) / 1e3 / div
            if w:
                ax.barh(y, w, left=left, height=0.8, color=_KIND_COLORS[kind][0], alpha=0.55,
                        hatch="///", edgecolor="white", lw=0.5)
                left += w
    else:
        left = ms.total_us[m] / 1e3 / div
        ax.barh(y, left, height=0.8, color="#999999", hatch="///", edgecolor="white", lw=0.5)
    if m in ms.floor_us:
        ax.plot([ms.floor_us[m] / 1e3 / div] * 2, [y - 0.45, y + 0.45], color="black", lw=2, ls=":")
    return left


def _step_legend(sv: StepView, seg_color: dict[str, str], floor_drawn: bool) -> tuple[list, list[str]]:
    """Legend handles and labels: each layer's segment, the byte floor (when drawn) and the measured
    step with its floor."""
    ms = sv.measured
    handles, labels = [], []
    for part in sv.parts:
        handles.append(Patch(color=seg_color[part.key]))
        labels.append(f"{part.kind}: {part.label}")
    if floor_drawn:
        where = "stored in the cache" if sv.ceiling_stored else "from hardware.md"
        handles.append(Line2D([], [], color="black", lw=2))
        labels.append(f"byte floor at {sv.bandwidth_gbs:,.0f} GB/s ({where})")
    if ms:
        handles.append(Patch(facecolor="#bbbbbb", hatch="///", edgecolor="white"))
        labels.append(f"measured: {ms.source} ({ms.gpu}, {ms.when}), one CUDA graph per layer kind"
                      + ("" if ms.kinds else "; totals only"))
        if ms.floor_us:
            handles.append(Line2D([], [], color="black", lw=2, ls=":"))
            labels.append("measured run's byte floor (its own copy rate)")
    return handles, labels


def _label_totals(fig: Figure, ax, ends: list[tuple[float, float, str]]) -> None:
    """Each bar's total at its end, left out where it would overlap other text or leave the axes.
    Freezes the layout."""
    fig.canvas.draw()
    fig.set_layout_engine("none")
    r = fig.canvas.get_renderer()
    taken = [b for _, b in text_boxes(fig)]
    for x, yy, text in ends:
        t = ax.annotate(text, (x, yy), textcoords="offset points", xytext=(3, 0), va="center", fontsize=7.5)
        b = t.get_window_extent(r)
        if any(overlap(b, o) for o in taken) or b.x1 > ax.get_window_extent(r).x1:
            t.remove()
        else:
            taken.append(b)


def step(sv: StepView, gpu: str, path: Path) -> Path:
    return _save(step_figure(sv, gpu), path)
