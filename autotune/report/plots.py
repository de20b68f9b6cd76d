"""The report's PNG figures (matplotlib, Agg backend: no display needed).

Each figure is built by a `*_figure` function and saved by its namesake; the builders are what
the tests render to check the layout (`layout_problems`: no two text boxes overlap, none leaves
the figure). Rules that keep text apart: legends sit below the axes (outside them) and the figure
grows to hold them; long titles and legend entries wrap; M is a log2 axis with only powers of two
labelled (the other buckets are minor ticks); point labels are placed one at a time where they
collide with no text already placed, and left out (they are in the table under the figure) where
no place is free.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: headless, deterministic
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from autotune.report.model import DeviceView, ProblemView  # noqa: E402
from autotune.report.step import KINDS, StepView  # noqa: E402

DPI = 100
WIDTH_IN = 8.0
_PNG_META = {"Software": None}  # no matplotlib version stamp: same data, same bytes
_KEY_GREY = "#555555"
_KIND_COLORS = {"dense MLP": ("#1f4e9c", "#6f9ae0"), "shared expert": ("#2e7d32", "#81c784"),
                "routed experts": ("#c25400", "#ffb74d")}


# ------------------------------------------------------------------------------------ text layout

def _texts(fig: Figure) -> list:
    """Every text the figure draws (tick labels of drawn ticks only)."""
    out = list(fig.texts)
    if getattr(fig, "_suptitle", None) is not None:
        out.append(fig._suptitle)
    for lg in fig.legends:
        out += list(lg.get_texts()) + [lg.get_title()]
    for ax in fig.axes:
        out += [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
                ax.xaxis.get_offset_text(), ax.yaxis.get_offset_text(), *ax.texts]
        if ax.get_legend() is not None:
            out += list(ax.get_legend().get_texts())
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():          # the ticks inside the view, as drawn
                out += [tick.label1, tick.label2]
    return [t for t in out if t.get_visible() and t.get_text().strip()]


def text_boxes(fig: Figure) -> list[tuple[str, object]]:
    """(text, window-extent bbox) of every drawn text, after a draw with the Agg renderer."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    return [(t.get_text(), t.get_window_extent(r)) for t in _texts(fig)]


def layout_problems(fig: Figure, tol: float = 0.5) -> list[str]:
    """What a reader would trip over: text boxes that overlap, text that leaves the figure."""
    boxes = text_boxes(fig)
    w, h = fig.bbox.width, fig.bbox.height
    out = [f"{t!r} leaves the figure ({b.x0:.0f},{b.y0:.0f})-({b.x1:.0f},{b.y1:.0f}) of {w:.0f}x{h:.0f}"
           for t, b in boxes if b.x0 < -tol or b.y0 < -tol or b.x1 > w + tol or b.y1 > h + tol]
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            if _overlap(a, b, tol):
                out.append(f"{ta!r} overlaps {tb!r}")
    return out


def _overlap(a, b, tol: float = 0.5) -> bool:
    return a.x0 < b.x1 - tol and b.x0 < a.x1 - tol and a.y0 < b.y1 - tol and b.y0 < a.y1 - tol


def wrap(text: str, width: int) -> str:
    """Lines of at most `width` characters, broken at spaces or after ':' ',' ']' (keys and tactic
    names have no spaces); a token longer than `width` is cut."""
    tokens = re.findall(r"[^ :,\]]*[:,\]]?| ", text)
    lines, cur = [], ""
    for tok in tokens:
        if not tok:
            continue
        if len(cur) + len(tok) > width and cur.strip():
            lines.append(cur.rstrip())
            cur = tok.lstrip()
        else:
            cur += tok
        while len(cur) > width:
            lines.append(cur[:width])
            cur = cur[width:]
    if cur.strip():
        lines.append(cur.rstrip())
    return "\n".join(lines)


def _chars(width_px: float, fontsize: float) -> int:
    return max(12, int(width_px / (fontsize * DPI / 72 * 0.62)))


def _header(fig: Figure, ax, title: str, key: str | None) -> None:
    """The title, and the problem key in small grey type under it (when the title is not the key)."""
    w = fig.get_figwidth() * DPI
    sub = f"\n{wrap(key, _chars(w, 7.5))}" if key and key != title else ""
    ax.set_title(wrap(title, _chars(w, 10)), fontsize=10, loc="left", pad=18 if sub else 6)
    if sub:
        ax.annotate(sub.strip(), xy=(0, 1), xycoords="axes fraction", xytext=(0, 4), textcoords="offset points",
                    fontsize=7.5, color=_KEY_GREY, va="bottom", ha="left", annotation_clip=False)


def _legend_below(fig: Figure, handles, labels, base_h: float, fontsize: float = 7.5, width: int = 56):
    """A legend under the axes, in as many columns as fit the figure's width; the figure grows by
    the legend's height so the axes keep `base_h` inches."""
    labels = [wrap(lb, width) for lb in labels]
    fig_w = fig.get_figwidth() * DPI
    lines = sum(lb.count("\n") + 1 for lb in labels)      # room first, so the axes never collapse
    fig.set_size_inches(fig.get_figwidth(), base_h + 0.16 * lines + 0.4)
    r = fig.canvas.get_renderer()                       # a legend's size needs no draw, only text metrics
    for ncols in range(min(3, len(labels)), 0, -1):
        lg = fig.legend(handles, labels, loc="outside lower center", ncols=ncols, fontsize=fontsize,
                        frameon=False, handlelength=2.2, columnspacing=1.4)
        if lg.get_window_extent(r).width <= fig_w - 8 or ncols == 1:
            break
        lg.remove()
    hl = lg.get_window_extent(r).height / DPI
    fig.set_size_inches(fig.get_figwidth(), base_h + hl + 0.15)
    return lg


def _place_labels(fig: Figure, ax, items, points=(), fontsize: float = 7.0, marker_px: float = 3.5) -> int:
    """Label points one at a time, each at the first offset where it overlaps no text already in the
    figure and no marker of `points` (data coordinates), and stays inside the axes; a label with no
    free place is left out. Freezes the layout. items: (x, y, text, color). Returns how many were placed."""
    from matplotlib.transforms import Bbox
    fig.canvas.draw()
    fig.set_layout_engine("none")
    r = fig.canvas.get_renderer()
    taken = [b for _, b in text_boxes(fig)]
    marks = [Bbox.from_extents(px - marker_px, py - marker_px, px + marker_px, py + marker_px)
             for px, py in (ax.transData.transform(pt) for pt in points)]
    box = ax.get_window_extent(r)
    offsets = [(4, 4), (4, -10), (-6, 4), (-6, -10), (8, -3), (-10, -3), (0, 9), (0, -14),
               (10, 10), (10, -16), (-14, 10), (-14, -16)]
    placed = 0
    for x, y, text, color in items:
        for dx, dy in offsets:
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                              color=color, ha="right" if dx < 0 else "left", annotation_clip=True)
            ann.set_in_layout(False)
            b = ann.get_window_extent(r)
            inside = b.x0 >= box.x0 and b.x1 <= box.x1 and b.y0 >= box.y0 and b.y1 <= box.y1
            if inside and not any(_overlap(b, t) for t in taken) and not any(_overlap(b, mk) for mk in marks):
                taken.append(b)
                placed += 1
                break
            ann.remove()
    return placed


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
    handles, labels = [], []
    (line,) = ax.plot(xs, [p.winner_us for p in view.points], "-", lw=2.2, color="#333333", zorder=4)
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
        labels.append(f"winner {view.short(tj)} ({counts[tj]} of {len(xs)} M)")
    rest = [(p.bucket, p.winner_us) for p in view.points if view.winner_json(p) not in named]
    if rest:
        handles.append(ax.scatter(*zip(*rest), s=22, color="white", edgecolors="black", zorder=6))
        labels.append(f"other winners ({len(rest)} M)")
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
    handles.insert(0, line)
    labels.insert(0, "winner (fastest timed)")
    ys = [p.winner_us for p in view.points] + [y for _, y in dpts] + \
         [u for p in view.points for u in list(p.best_by_family.values()) + list(p.baselines.values())]
    _bucket_axis(ax, xs)
    _log_axis(ax, "y", ys, "median time per call (µs, log scale)")
    ax.grid(True, which="major", alpha=0.3)
    ax.grid(True, which="minor", axis="x", alpha=0.12)
    _header(fig, ax, view.title, view.key)
    _legend_below(fig, handles, labels, base_h)
    return fig


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
    _header(fig, ax, f"{dev.gpu_name}: winner vs the family default, per M", None)
    if handles:
        _legend_below(fig, handles, labels, base_h)
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
    _header(fig, ax, title, None)
    _legend_below(fig, handles, labels, base_h)
    items = [(p.intensity, p.tflops, f"{p.bucket}", f"C{i % 10}")
             for i, v in enumerate(dev.problems) for p in roofline_labels(v)]
    _place_labels(fig, ax, items, [(p.intensity, p.tflops) for v in dev.problems for p in v.points])
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
    handles, labels = [], []
    ypos, yl = [], []
    y = 0.0
    ends = []                                    # (x, y, text) for the totals
    shades: dict[str, int] = {}
    seg_color = {}
    for part in sv.parts:
        n = shades.get(part.kind, 0)
        shades[part.kind] = n + 1
        pal = _KIND_COLORS[part.kind]
        seg_color[part.key] = pal[n % len(pal)]
    floor_handle = None
    # the axis unit follows the largest bar: ms, or s from 10 s up (a CPU run's step: 800 s, not 800,000 ms)
    peak = max([sum(part.count * part.us[m] for part in sv.parts) / 1e3 for m in sv.buckets]
               + ([v / 1e3 for v in ms.total_us.values()] if ms else []) + [0.0])
    unit, div = ("s", 1e3) if peak >= 1e4 else ("ms", 1.0)
    for m in rows:
        if m in sv.buckets:
            left = 0.0
            for part in sv.parts:
                w = part.count * part.us[m] / 1e3 / div
                ax.barh(y, w, left=left, height=0.8, color=seg_color[part.key], edgecolor="white", lw=0.5)
                left += w
            fl = sv.floor_us(m)
            if fl:
                floor_handle = ax.plot([fl / 1e3 / div] * 2, [y - 0.45, y + 0.45], color="black", lw=2)[0]
            ends.append((left, y, f"{left:.2f} {unit}"))
            ypos.append(y)
            yl.append(f"M={m} estimate" if ms else f"M={m}")
            y += 1
        if ms and m in ms.total_us:
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
            ends.append((left, y, f"{left:.2f} {unit}"))
            ypos.append(y)
            yl.append(f"M={m} measured")
            y += 1
        y += 0.4
    for part in sv.parts:
        handles.append(Patch(color=seg_color[part.key]))
        labels.append(f"{part.kind}: {part.label}")
    if floor_handle is not None:
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
    ax.set_yticks(ypos, yl)
    ax.invert_yaxis()
    xmax = max([x for x, _, _ in ends] + [0.001])
    ax.set_xlim(0, xmax * 1.22)
    ax.set_xlabel(f"time per forward pass, every MLP layer ({unit})", fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    _header(fig, ax, f"{gpu}: MLP decode step per M — stored winners × layer counts", None)
    _legend_below(fig, handles, labels, base_h, width=80)
    fig.canvas.draw()
    fig.set_layout_engine("none")
    r = fig.canvas.get_renderer()
    taken = [b for _, b in text_boxes(fig)]
    for x, yy, text in ends:
        t = ax.annotate(text, (x, yy), textcoords="offset points", xytext=(3, 0), va="center", fontsize=7.5)
        b = t.get_window_extent(r)
        if any(_overlap(b, o) for o in taken) or b.x1 > ax.get_window_extent(r).x1:
            t.remove()
        else:
            taken.append(b)
    return fig


def step(sv: StepView, gpu: str, path: Path) -> Path:
    return _save(step_figure(sv, gpu), path)
