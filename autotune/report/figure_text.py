"""Text in the report's figures: titles and legends that wrap to the figure's width, point labels
placed where they collide with nothing, and the check the tests run on every figure
(`layout_problems`: no two text boxes overlap, none leaves the figure). Sizes in pixels follow DPI.
"""
from __future__ import annotations

import re

from matplotlib.figure import Figure
from matplotlib.transforms import Bbox

DPI = 100
KEY_GREY = "#555555"


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
            if overlap(a, b, tol):
                out.append(f"{ta!r} overlaps {tb!r}")
    return out


def overlap(a, b, tol: float = 0.5) -> bool:
    """Whether boxes a and b (window extents) share more than `tol` pixels both ways."""
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


def header(fig: Figure, ax, title: str, key: str | None) -> None:
    """The title, and the problem key in small grey type under it (when the title is not the key)."""
    w = fig.get_figwidth() * DPI
    sub = f"\n{wrap(key, _chars(w, 7.5))}" if key and key != title else ""
    ax.set_title(wrap(title, _chars(w, 10)), fontsize=10, loc="left", pad=18 if sub else 6)
    if sub:
        ax.annotate(sub.strip(), xy=(0, 1), xycoords="axes fraction", xytext=(0, 4), textcoords="offset points",
                    fontsize=7.5, color=KEY_GREY, va="bottom", ha="left", annotation_clip=False)


def legend_below(fig: Figure, handles, labels, base_h: float, fontsize: float = 7.5, width: int = 56):
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


def place_labels(fig: Figure, ax, items, points=(), fontsize: float = 7.0, marker_px: float = 3.5) -> int:
    """Label points one at a time, each at the first offset where it overlaps no text already in the
    figure and no marker of `points` (data coordinates), and stays inside the axes; a label with no
    free place is left out. Freezes the layout. items: (x, y, text, color). Returns how many were placed."""
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
            if inside and not any(overlap(b, t) for t in taken) and not any(overlap(b, mk) for mk in marks):
                taken.append(b)
                placed += 1
                break
            ann.remove()
    return placed
