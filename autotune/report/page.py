"""The report page: one HTML file, PNGs beside it, no network (no CDN, no web fonts).

A short inline script checks on load that every image decoded (naturalWidth > 0) and writes the
result into #report-status, logging failures to the console: a reader sees a broken report at
once, and the headless-browser test reads the same status.
"""
from __future__ import annotations

import json
import platform
from html import escape
from pathlib import Path

from autotune.report import plots
from autotune.report.model import NOT_REPLAYED, ArchPlan, DeviceView, Summary

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:18px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:36px}h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:12.5px;max-width:100%}
th,td{border:1px solid #ddd;padding:3px 7px;text-align:left;vertical-align:top}td{overflow-wrap:anywhere}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums;overflow-wrap:normal}
code{font-size:12px}.banner{background:#fff4d6;border:1px solid #e0c060;padding:8px 12px;margin:12px 0}
.note{color:#555}.bad{color:#a00}.good{color:#070}img{max-width:100%;height:auto;border:1px solid #eee;display:block}
#report-status{font-size:12px;color:#555}
figure{margin:12px 0 24px}figcaption{font-size:13px;margin:4px 0}figcaption .key{font:11px monospace;color:#666}
.pair{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}.pair>img{flex:1 1 520px;min-width:0}
.pair>.data{flex:1 1 300px;min-width:0}.pair table{width:100%}
details>summary{cursor:pointer;color:#335;font-size:12.5px}
table.compact th,table.compact td{padding:2px 4px;font-size:11.5px}table.compact th{overflow-wrap:anywhere}
"""

SCRIPT = """
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  bad.forEach(function (i) { console.error('report image failed to load: ' + i.getAttribute('src')); });
  var s = document.getElementById('report-status');
  s.setAttribute('data-images', String(imgs.length));
  s.setAttribute('data-images-ok', String(imgs.length - bad.length));
  s.textContent = bad.length ? (bad.length + ' of ' + imgs.length + ' images failed to load')
                             : ('all ' + imgs.length + ' images loaded');
  var d = document.documentElement;
  s.setAttribute('data-scroll-width', String(d.scrollWidth));
  s.setAttribute('data-client-width', String(d.clientWidth));
});
"""


def _f(v, fmt: str = "{:.1f}") -> str:
    return "–" if v is None else fmt.format(v)


def _kv_table(d: dict) -> str:
    rows = "".join(f"<tr><th>{escape(str(k))}</th><td><code>{escape(json.dumps(v) if isinstance(v, (dict, list)) else str(v))}</code></td></tr>"
                   for k, v in d.items())
    return f"<table>{rows}</table>"


def _img(src: str, alt: str) -> str:
    """The figure at its own size or the window's width, whichever is smaller (the PNG is 800 px)."""
    return f'<img src="{escape(src)}" alt="{escape(alt)}" width="800">'


def _figure(img: str, caption: str, data: str, beside: bool = False, fold: str | None = None) -> str:
    """A picture, its caption and the table of its numbers: beside it (wrapping under it in a narrow
    window) or under it, folded behind `fold` (a summary line) when long."""
    table = f"<details><summary>{escape(fold)}</summary>{data}</details>" if fold else data
    body = f'<div class="pair">{img}<div class="data">{table}</div></div>' if beside else img + table
    return f"<figure><figcaption>{caption}</figcaption>{body}</figure>"


def _name(v) -> str:
    """A problem's layer names with its key in small type under them (the key alone without a model)."""
    if not v.layers:
        return f"<code>{escape(v.key)}</code>"
    return f"{escape(v.title)}<br><span class=key>{escape(v.key)}</span>"


def _time_table(v) -> str:
    fams = sorted({f for p in v.points for f in p.best_by_family})
    head = ("<tr><th>M</th><th>winner (legend name, then in full)</th><th>µs</th><th>default µs</th><th>×</th>"
            + "".join(f"<th>best {_breakable(f)} µs</th>" for f in fams) + "</tr>")
    rows = []
    for p in v.points:
        rows.append(f"<tr><td class=num>{p.bucket}</td><td>{escape(v.short(v.winner_json(p)))}<br>"
                    f"<code class=key>{escape(p.winner)}</code>{'' if p.replay_checked else ' ' + NOT_REPLAYED}</td>"
                    f"<td class=num>{_f(p.winner_us)}</td>"
                    f"<td class=num>{_f(p.default_us)}</td><td class=num>{_f(p.speedup, '{:.2f}')}</td>"
                    + "".join(f"<td class=num>{_f(p.best_by_family.get(f))}</td>" for f in fams) + "</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _roof_table(dev: DeviceView) -> str:
    head = "<tr><th>layer / problem</th><th>M</th><th>FLOP/B</th><th>TFLOP/s</th><th>GB/s</th><th>of roof</th></tr>"
    rows = [f"<tr><td>{escape(v.label)}</td><td class=num>{p.bucket}</td><td class=num>{_f(p.intensity, '{:.3g}')}</td>"
            f"<td class=num>{_f(p.tflops, '{:.3g}')}</td><td class=num>{_f(p.gbps, '{:.3g}')}</td>"
            f"<td class=num>{_f(p.roof_fraction and 100 * p.roof_fraction, '{:.1f}%')}</td></tr>"
            for v in dev.problems for p in v.points]
    return f"<table>{head}{''.join(rows)}</table>"


def _breakable(name: str) -> str:
    """A layer name that may wrap after its dots and underscores (narrow table headers)."""
    return escape(name).replace(".", ".<wbr>").replace("_", "_<wbr>")


def _step_table(sv) -> str:
    ms = sv.measured
    head = ("<tr><th>M</th>" + "".join(f"<th>{_breakable(p.label)} (ms)</th>" for p in sv.parts)
            + "<th>estimate (ms)</th><th>byte floor (ms)</th>"
            + ("<th>measured (ms)</th><th>measured floor (ms)</th>" if ms else "") + "</tr>")
    rows = []
    for m in sorted(set(sv.buckets) | (set(ms.total_us) if ms else set())):
        est = m in sv.buckets
        cells = "".join(f"<td class=num>{_f(p.count * p.us[m] / 1e3 if est else None, '{:.3f}')}</td>"
                        for p in sv.parts)
        fl = sv.floor_us(m) if est else None
        meas = ""
        if ms:
            meas = (f"<td class=num>{_f(ms.total_us.get(m) and ms.total_us[m] / 1e3, '{:.3f}')}</td>"
                    f"<td class=num>{_f(ms.floor_us.get(m) and ms.floor_us[m] / 1e3, '{:.3f}')}</td>")
        rows.append(f"<tr><td class=num>{m}</td>{cells}<td class=num>{_f(sv.total_us(m) / 1e3 if est else None, '{:.3f}')}"
                    f"</td><td class=num>{_f(fl and fl / 1e3, '{:.3f}')}</td>{meas}</tr>")
    return f"<table class=compact>{head}{''.join(rows)}</table>"


def _step(dev: DeviceView, outdir: Path, i: int) -> str:
    sv = dev.step
    if sv.missing:
        return ("<p class=note>No step picture: no winner at a decode M (≤ 256) for "
                + ", ".join(f"<code>{escape(m)}</code>" for m in sv.missing)
                + ". It needs winners for every MLP layer of the model (search them, or give the caches "
                  "that hold them as several <code>--cache</code>).</p>")
    if not sv.buckets:
        return "<p class=note>No step picture: no decode M (≤ 256) at which every MLP layer has a winner.</p>"
    png = plots.step(sv, dev.gpu_name, outdir / f"step-{i}.png").name
    floor = (f"the black tick is the byte floor (each layer's minimum traffic at {sv.bandwidth_gbs:,.0f} GB/s, "
             + ("stored in the cache" if sv.ceiling_stored else "from the hardware table, not measured here") + ")"
             if sv.bandwidth_gbs else "no byte floor: no bandwidth ceiling known for this device")
    ms = sv.measured
    meas = ""
    if ms:
        meas = (f" Hatched bars: measured by <code>{escape(ms.source)}</code> ({escape(ms.gpu)}, {escape(ms.when)}): "
                "each layer kind timed as CUDA-graph replays, summed with the layer counts; the dotted tick is "
                "that run's floor at its own copy rate." + (f" Note: {escape(ms.note)}." if ms.note else ""))
    cap = (f"<b>The MLP decode step per M</b>: every MLP layer of the model, its stored winner's time × its "
           f"layer count, one segment per layer; {floor}.{meas} Routed experts in their fused forms where the "
           "cache has them (what FP4MoE serves); the plain grouped GEMMs leave their SwiGLU and top_k sum out.")
    alt = (f"Stacked horizontal bars of the estimated MLP decode step per M on {dev.gpu_name}, by layer, "
           "beside the byte floor" + (" and the measured step" if ms else "") + "; numbers in the table below.")
    return _figure(_img(png, alt), cap, _step_table(sv))


def _winners_table(dev: DeviceView) -> str:
    head = ("<tr><th>problem</th><th>M</th><th>winner</th><th>µs</th><th>default µs</th><th>× default</th>"
            "<th>baseline µs</th><th>TFLOP/s</th><th>GB/s</th><th>FLOP/B</th><th>of roof</th></tr>")
    rows = []
    for v in dev.problems:
        for p in v.points:
            base = min(p.baselines.items(), key=lambda kv: kv[1]) if p.baselines else None
            sp = "" if p.speedup is None else (" class=\"num good\"" if p.speedup > 1.0 else " class=\"num\"")
            rows.append(
                f"<tr><td>{_name(v)}</td><td class=num>{p.bucket}</td><td><code>{escape(p.winner)}</code>"
                f"{'' if p.replay_checked else ' ' + NOT_REPLAYED}</td>"
                f"<td class=num>{_f(p.winner_us)}</td><td class=num>{_f(p.default_us)}</td>"
                f"<td{sp or ' class=num'}>{_f(p.speedup, '{:.2f}')}</td>"
                f"<td class=num>{escape(f'{base[1]:.1f} ({base[0]})') if base else '–'}</td>"
                f"<td class=num>{_f(p.tflops, '{:.3g}')}</td><td class=num>{_f(p.gbps, '{:.3g}')}</td>"
                f"<td class=num>{_f(p.intensity, '{:.3g}')}</td><td class=num>{_f(p.roof_fraction and 100 * p.roof_fraction, '{:.1f}%')}</td></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _reason_table(verdicts) -> str:
    groups = [(fv.family, g) for fv in verdicts for g in fv.reasons]
    if not groups:
        return "<p class=note>No rejections, failures or notes recorded.</p>"
    rows = ["<table><tr><th>family</th><th>status</th><th>count</th><th>reason (one example per group)</th></tr>"]
    for fam, g in groups:
        cls = " class=bad" if g.status == "failed" else ""
        why = escape(g.short) if g.short == g.reason.strip() else \
            f"<details><summary>{escape(g.short)}</summary><code>{escape(g.reason)}</code></details>"
        rows.append(f"<tr><td>{escape(fam)}</td><td{cls}>{escape(g.status)}</td><td class=num>{g.count}</td>"
                    f"<td>{why}</td></tr>")
    return "".join(rows) + "</table>"


def _verdicts(dev: DeviceView) -> str:
    parts = ["<table><tr><th>family</th><th>kept</th><th>rejected (static)</th><th>ok (timed)</th>"
             "<th>dropped (halving)</th><th>failed</th></tr>"]
    for fv in dev.verdicts:
        parts.append(f"<tr><td>{escape(fv.family)}</td><td class=num>{fv.kept}</td><td class=num>{fv.rejected}</td>"
                     f"<td class=num>{fv.ok}</td><td class=num>{fv.dropped}</td><td class=num>{fv.failed}</td></tr>")
    parts.append("</table>")
    parts.append(_reason_table(dev.verdicts))
    parts.append("<p class=note>Counts are (problem, tactic) pairs on this device; a rejection is decided "
                 "statically, once for all buckets; a dropped tactic was cut early by successive halving; "
                 "a failure is a build, check or launch error on any bucket; "
                 "notes are on trials that succeeded (e.g. a shared-memory model mismatch).</p>")
    return "".join(parts)


def _plan(ap: ArchPlan) -> str:
    rows = "".join(f"<tr><td>{escape(fv.family)}</td><td class=num>{fv.kept}</td><td class=num>{fv.rejected}</td>"
                   f"<td class=num>{fv.unknown}</td></tr>" for fv in ap.verdicts)
    return (f"<table><tr><th>family</th><th>kept</th><th>rejected</th><th>unknown until on the device</th></tr>{rows}</table>"
            + _reason_table(ap.verdicts)
            + f"<p class=note>(problem, tactic) pairs over {ap.problems} problems; static verdicts only, "
              "as <code>autotune search --dry-run</code> prints them: nothing was compiled or measured.</p>")


def _ceilings(dev: DeviceView) -> str:
    c = dev.ceilings
    if not c:
        return ("<p class=note>No roofline ceilings for this device: none are stored in the cache "
                "(<code>autotune report --measure-ceilings</code> on the device stores them) and the hardware "
                "table of shared/reference/hardware.md has no entry for it. Points are placed without a roof.</p>")
    peaks = ", ".join(f"{k} {v:,.1f} TFLOP/s" for k, v in sorted((c.get("tflops") or {}).items()))
    where = ("measured on this device and stored in the cache" if c.get("stored")
             else "<b>derived from the hardware table, not measured in this cache</b>")
    return (f"<p>Ceilings: memory {c['bandwidth_gbs']:,.0f} GB/s, compute {escape(peaks) or 'unknown'} — {where}. "
            f"Source: {escape(c.get('source', ''))}.</p>"
            "<p class=note>Intensity counts the minimum traffic of one call: FP4 weights and their block scales "
            "(only the experts that tokens are routed to, expected under the benchmark's routing), activations "
            "and output, each once. W4A16 problems are bounded by the bf16 MMA rate (the weight is upcast).</p>")


def _fingerprint(dev: DeviceView) -> str:
    rec = dict(dev.record)
    libs = rec.pop("libs", {}) or {}
    out = [_kv_table(rec), "<h4>libraries at tuning time</h4>", _kv_table(libs)]
    if dev.libsets:
        out.append("<h4>library sets keying the trials</h4>")
        out.append(_kv_table({k: v for k, v in dev.libsets.items()}))
    return "".join(out)


def _misses(dev: DeviceView) -> str:
    if not dev.misses:
        return "<p class=note>No dispatch misses recorded.</p>"
    rows = "".join(f"<tr><td><code>{escape(m['problem'])}</code></td><td class=num>{m['m']}</td><td class=num>{m['count']}</td></tr>"
                   for m in dev.misses)
    return f"<table><tr><th>problem</th><th>M</th><th>count</th></tr>{rows}</table>"


def write(summary: Summary, outdir: Path) -> Path:
    """Write index.html, its PNGs and summary.json into outdir; return the index path."""
    outdir.mkdir(parents=True, exist_ok=True)
    for pattern in ("speedup-*.png", "roofline-*.png", "time-*-*.png", "step-*.png"):  # an older report's figures
        for old in outdir.glob(pattern):
            old.unlink()
    body = _intro(summary)
    for i, dev in enumerate(summary.devices):
        body += _device_section(dev, outdir, i)
    body += _closing(summary)
    html = ("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<link rel=\"icon\" href=\"data:,\">"
            f"<title>fp4-autotune report</title><style>{CSS}</style></head>\n<body>\n"
            + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n")
    index = outdir / "index.html"
    index.write_text(html, encoding="utf-8")
    (outdir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=1, default=str) + "\n", encoding="utf-8")
    return index


def _intro(summary: Summary) -> list[str]:
    """The page's head: title, cache and date, the image check's status line, a banner over a CPU
    run, the summary's notes and a link to each device."""
    body = ["<h1>fp4-autotune report</h1>",
            f"<p>Cache <code>{escape(summary.cache)}</code>, report made {escape(summary.generated_at)}.</p>",
            '<p id="report-status">image check pending (needs JavaScript)</p>']
    cpu = [d for d in summary.devices if d.is_cpu]
    if cpu:
        body.append('<div class="banner"><b>CPU run.</b> The timings of ' + ", ".join(escape(d.gpu_name) for d in cpu)
                    + " were measured on a CPU with the torch reference family: they show the report's content, "
                      "not GPU performance.</div>")
    for n in summary.notes:
        body.append(f"<p class=note>{escape(n)}</p>")
    if summary.devices:
        body.append("<ul>" + "".join(f'<li><a href="#dev{i}">{escape(d.gpu_name)} ({escape(d.arch)})</a></li>'
                                     for i, d in enumerate(summary.devices)) + "</ul>")
    return body


def _device_section(dev: DeviceView, outdir: Path, i: int) -> list[str]:
    """Device i's section: its figures (when it has winners), verdicts, misses and fingerprint."""
    body = [f'<h2 id="dev{i}">{escape(dev.gpu_name)} — {escape(dev.arch)} '
            f'<span class=note>(device {escape(dev.device_key)})</span></h2>']
    if dev.problems:
        body += _device_figures(dev, outdir, i)
    else:
        body.append("<p class=note>No winners for this device.</p>")
    body.append(f"<h3>Verdicts on {escape(dev.arch)}</h3>" + _verdicts(dev))
    body.append("<h3>Dispatch misses</h3>" + _misses(dev))
    body.append("<h3>Environment fingerprint</h3>" + _fingerprint(dev))
    return body


def _device_figures(dev: DeviceView, outdir: Path, i: int) -> list[str]:
    """Device i's figures, each written beside the page with its table: the decode step, the
    winners' speedup, the roofline and the time per problem."""
    body = []
    if dev.step is not None:
        body.append("<h3>MLP decode step</h3>" + _step(dev, outdir, i))
    body.append("<h3>Winners per bucket</h3>")
    png = plots.speedup(dev, outdir / f"speedup-{i}.png").name
    body.append(_figure(_img(png, f"Winner speedup over the family default against M (log2) for each "
                                  f"problem on {dev.gpu_name}; numbers in the table below."),
                        "Winner over the family default, per M (1× = the default won).", _winners_table(dev),
                        fold=f"data: the {sum(len(v.points) for v in dev.problems)} winners"))
    body.append("<h3>Roofline</h3>" + _ceilings(dev))
    png = plots.roofline(dev, outdir / f"roofline-{i}.png").name
    body.append(_figure(_img(png, f"Roofline of {dev.gpu_name}: achieved TFLOP/s of each winner against "
                                  "its arithmetic intensity, log-log, with the memory and compute roofs; "
                                  "numbers in the table below."),
                        "Each point is one (problem, M) winner; labelled: the first and last M of each "
                        "problem and its best and worst fraction of the roof (where the labels fit).",
                        _roof_table(dev), fold=f"data: {sum(len(v.points) for v in dev.problems)} points"))
    body.append("<h3>Time per problem</h3>")
    if not any(p.baselines for v in dev.problems for p in v.points):
        body.append("<p class=note>No baseline rows in this cache (a non-FP4 problem of the same shape, "
                    "e.g. bf16×bf16 through cuBLAS): each plot shows the winner, the family default and "
                    "the best tactic of every family that was timed.</p>")
    for j, v in enumerate(dev.problems):
        png = plots.time_vs_bucket(v, outdir / f"time-{i}-{j}.png").name
        alt = (f"Median time per call against M, both log scale, for {v.title} ({v.key}) on {dev.gpu_name}: "
               "the winner (markers by tactic), the family default and the best tactic of each family; "
               "numbers in the table beside.")
        body.append(_figure(_img(png, alt), _name(v), _time_table(v), beside=True))
    return body


def _closing(summary: Summary) -> list[str]:
    """The page's end: static verdicts per arch (when asked), the cache's metadata and the versions
    that made the report."""
    import matplotlib
    body = [f"<h2>Static verdicts on {escape(ap.arch)} (not measured)</h2>" + _plan(ap) for ap in summary.plans]
    gen = {"python": platform.python_version(), "matplotlib": matplotlib.__version__}
    meta = {k: v for k, v in summary.meta.items()}
    body.append("<h2>Cache metadata</h2>" + (_kv_table(meta) if meta else "<p class=note>none</p>"))
    body.append("<h2>Report generator</h2>" + _kv_table(gen))
    return body
