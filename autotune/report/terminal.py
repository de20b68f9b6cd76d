"""`autotune show`: the report's summary as rich terminal tables."""
from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune.report.model import NOT_REPLAYED, DeviceView, ProblemView, Summary


def _f(v, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


_NUMBERS = ("µs", "dflt µs", "×dflt", "base µs", "TFLOP/s", "roof%")   # in the order a narrow table keeps them


def _breakable(name: str) -> str:
    """A tactic name whose parameters a narrow terminal (or a pipe at 80 columns) wraps between, never
    inside one: `fam[a=1,b=2]` -> `fam[a=1, b=2]`."""
    return name.replace(",", ", ")


def print_summary(summary: Summary, console: Console | None = None, verbose: bool = False) -> None:
    """verbose: every reason group's full example text instead of its one-line form."""
    con = console or Console()
    why = (lambda g: g.reason) if verbose else (lambda g: g.short)
    for n in summary.notes:
        con.print(n, markup=False)
    for dev in summary.devices:
        _print_device(con, dev, why, verbose)
    for ap in summary.plans:
        vt = Table("family", "kept", "rejected", "unknown", "reasons (count × example)",
                   title=f"static verdicts on {ap.arch} ({ap.problems} problems, not measured)", title_justify="left")
        for fv in ap.verdicts:
            reasons = "\n".join(f"{g.count}× {why(g)}" for g in fv.reasons) or "-"
            vt.add_row(Text(fv.family), str(fv.kept), str(fv.rejected), str(fv.unknown), Text(reasons, overflow="fold" if verbose else None))
        con.print(vt)


def _print_device(con: Console, dev: DeviceView, why, verbose: bool) -> None:
    """One device: a table per problem, its roofline ceilings, verdicts, environment and misses."""
    r = dev.record
    title = f"{dev.gpu_name} ({dev.arch}, device {dev.device_key})"
    if dev.is_cpu:
        title += " — CPU run"
    con.print(Text(title, style="bold"))
    if not dev.problems:
        con.print("no winners")
    for v in dev.problems:
        _print_problem(con, v)
    c = dev.ceilings
    if c:
        where = "stored in the cache" if c.get("stored") else "from hardware.md, not stored in the cache"
        peaks = ", ".join(f"{k} {v:,.1f} TFLOP/s" for k, v in sorted((c.get("tflops") or {}).items()))
        con.print(f"roofline ceilings ({where}): {c['bandwidth_gbs']:,.0f} GB/s; {peaks}", markup=False)
    else:
        con.print("roofline ceilings: none known for this device")
    vt = Table("family", "kept", "rejected", "ok", "dropped", "failed", "reasons (count × example)",
               title=f"verdicts on {dev.arch}", title_justify="left")
    for fv in dev.verdicts:
        reasons = "\n".join(f"{g.status}: {g.count}× {why(g)}" for g in fv.reasons) or "-"
        vt.add_row(Text(fv.family), str(fv.kept), str(fv.rejected), str(fv.ok), str(fv.dropped), str(fv.failed), Text(reasons, overflow="fold" if verbose else None))
    con.print(vt)
    env = ", ".join(f"{k}={r.get(k)}" for k in ("cc", "sm_count", "driver", "cuda_runtime", "cublas", "package")
                    if r.get(k) is not None)
    libs = ", ".join(f"{k} {v}" for k, v in (r.get("libs") or {}).items() if v)
    con.print(f"environment: {env}; {libs}", markup=False)
    if dev.misses:
        con.print(f"dispatch misses: {sum(m['count'] for m in dev.misses)} over {len(dev.misses)} (problem, M) pairs", markup=False)


def _print_problem(con: Console, v: ProblemView) -> None:
    """One problem's winners per M with the numeric columns the console's width holds beside them."""
    t = Table(title=Text(f"{v.title}  {v.key}" if v.layers else v.key), title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, collapse_padding=True)
    cells = {"M": [str(p.bucket) for p in v.points]}
    for p in v.points:
        base = min(p.baselines.values()) if p.baselines else None
        for col, val in zip(_NUMBERS, (_f(p.winner_us), _f(p.default_us), _f(p.speedup, "{:.2f}"), _f(base),
                                       _f(p.tflops, "{:.3g}"),
                                       _f(p.roof_fraction and 100 * p.roof_fraction, "{:.1f}"))):
            cells.setdefault(col, []).append(val)
    # the winner column holds its longest parameter whole; numeric columns a narrow terminal
    # (a pipe: 80 columns) cannot hold beside it are left out, said under the table
    names = [_breakable(p.winner if p.replay_checked else f"{p.winner} {NOT_REPLAYED}") for p in v.points]
    wmin = max([20, *(len(tok) for n in names for tok in n.split(" "))])
    room, shown = con.width - wmin - len(cells["M"][0] if cells["M"] else "M") - 4, []
    for col in _NUMBERS:
        w = max(len(col), *(len(x) for x in cells[col])) + 1
        if w <= room:
            shown.append(col)
            room -= w
    t.add_column("M", justify="right", no_wrap=True)
    t.add_column("winner", overflow="fold", min_width=wmin)
    for col in shown:
        t.add_column(col, justify="right", no_wrap=True)
    for i, n in enumerate(names):
        t.add_row(cells["M"][i], Text(n), *(cells[col][i] for col in shown))
    con.print(t)
    left = [c for c in _NUMBERS if c not in shown]
    if left:
        con.print(f"(narrow terminal: {', '.join(left)} left out; `show --json` has every figure)", markup=False)
