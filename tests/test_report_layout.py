"""The report's pictures read at a glance: every figure rendered with matplotlib's Agg
renderer, its text boxes (get_window_extent) compared — none overlaps another, none leaves the
figure — for the committed H200 caches (opened read-only) and for a synthetic cache with long
tactic names, long layer names, long failure reasons and 30 buckets; the M axis is log2 with only
powers of two labelled; the step picture adds up the stored winners; long reasons get one line;
the page has no horizontal scroll at 800 px in headless Chromium."""
import json
import math
import re
import sqlite3
from pathlib import Path

import pytest

from autotune.core.env import Env, cpu
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic
from autotune.models import ProblemUse, problems_for
from autotune.report import collect, figure_text, plots, write_html
from autotune.report.model import reason_class, short_reason
from autotune.report.sources import StoreUnion
from autotune.report.step import StepJsonError, attach_measured, load_measured
from autotune.cache import Store
from tests.test_report import _browser, _chromium

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
H200_CACHES = ["2026-11-29-h200-glm5-tp8-search.db", "2026-12-01-h200-moe-search.db", "2026-12-01-h200-cuda-search.db"]
STEP_JSON = DATA / "2026-12-01-h200-moe-mlp-step.json"
GLM5 = problems_for("glm5", tp=8, include_attention=True, fused_moe=True, fold_shared=True)
BUCKETS30 = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
             3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768]
OOM = ("input setup failed: OutOfMemoryError: CUDA out of memory. Tried to allocate {} GiB. GPU 0 has a total "
       "capacity of 139.81 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 138.74 "
       "GiB memory in use. Of the allocated memory 138.20 GiB is allocated by PyTorch, and 123.45 MiB is reserved "
       "by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def _ro(name: str) -> Store:
    path = DATA / name
    before = path.stat().st_mtime_ns
    s = Store(path, readonly=True)
    assert path.stat().st_mtime_ns == before
    return s


def _figures(dev, times: bool = True):
    figs = [(f"time {v.key}", plots.time_figure(v)) for v in dev.problems] if times else []
    figs += [("speedup", plots.speedup_figure(dev)), ("roofline", plots.roofline_figure(dev))]
    if dev.step is not None and dev.step.buckets:
        figs.append(("step", plots.step_figure(dev.step, dev.gpu_name)))
    return figs


def _check(figs) -> None:
    bad = []
    for name, fig in figs:
        bad += [f"{name}: {p}" for p in figure_text.layout_problems(fig)]
        plots.plt.close(fig)
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("name", H200_CACHES)
def test_no_text_overlaps_on_the_committed_h200_caches(name):
    """Each cache's device pictures; its time pictures where its M range is its own (the cuda
    search's 1…64). The other time pictures are those of the example report, checked below."""
    s = collect(_ro(name), {u.problem.key for u in GLM5}, GLM5)
    (dev,) = s.devices
    assert dev.problems and all(v.layers and v.per_forward for v in dev.problems)   # layer names known
    _check(_figures(dev, times=name.startswith("cuda")))


def test_no_text_overlaps_in_the_example_report():
    """docs/report-example/'s pictures: the three caches read as one, the measured step beside."""
    s = collect(StoreUnion([_ro(n) for n in H200_CACHES]), {u.problem.key for u in GLM5}, GLM5)
    attach_measured(s, load_measured(STEP_JSON, GLM5))
    (dev,) = s.devices
    assert len(dev.problems) == 8 and dev.step.buckets and dev.step.measured
    figs = _figures(dev)
    assert len(figs) == 8 + 3
    _check(figs)
    made = sorted(p.name for p in (ROOT / "docs/report-example").glob("*.png"))
    assert made == sorted(["roofline-0.png", "speedup-0.png", "step-0.png"] + [f"time-0-{j}.png" for j in range(8)])


# ---------------------------------------------------------------------------------- synthetic cache

LONG = dict(kernel="w4a16_dequant_persistent_stream_k_with_a_long_name", swizzle="column_major_grouped_by_eight",
            epilogue_schedule="tma_warp_specialized_cooperative", block_m=64, block_n=128, block_k=256)
SYN = [
    (Problem.dense(3072, 6144), ("mlp.gate_up_proj[0-2]",), 3),
    (Problem.dense(6144, 1536), ("mlp.down_proj[0-2]",), 3),
    (Problem.moe(512, 6144, experts=256, top_k=8, epilogue="swiglu"),
     ("mlp.experts.w13+swiglu[3-77]",), 75),
    (Problem.moe(6144, 256, experts=256, top_k=8, epilogue="reduce"), ("mlp.experts.w2+reduce[3-77]",), 75),
    (Problem.dense(4096, 2048), ("model.decoder.a_layer_with_an_unusually_long_name_for_the_title.q_proj[0-77]",
                                 "model.decoder.another_layer_sharing_the_same_problem.k_proj[0-77]"), 156),
]
SYN_USES = [ProblemUse(p, layers, n) for p, layers, n in SYN]


def _tactics() -> list[Tactic]:
    return [Tactic("synthetic_family_with_a_long_name", {**LONG, "split_k": s, "num_warps": w, "stages": st})
            for s in (1, 4) for w in (4, 8) for st in (2, 3)]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("syn") / "syn.db"
    store = Store(path)
    gpu = Env("NVIDIA H200", "9.0", 132, "cuda", "580", "13.0", None, "0.1.0", cpu().libs)
    store.put_environment(gpu, ("synthetic_family_with_a_long_name",))
    dk = gpu.device_key
    tacs = _tactics()
    default = tacs[0]
    for pi, (p, _, _) in enumerate(SYN):
        for bi, m in enumerate(BUCKETS30):
            floor = 3.0 + 0.002 * m * (1 + pi)
            times = {t.id: floor * (1 + ((3 * ti + bi + pi) % 8) / 5) for ti, t in enumerate(tacs)}
            best = min(tacs, key=lambda t: times[t.id])
            for t in {best.id: best, default.id: default}.values():     # two ok trials per bucket: cheap
                store.put_trial(Trial(p.key, m, t.id, t.family, t.to_json(), dk, "1" * 16, "ok",
                                      median_us=times[t.id]))
            store.put_winner(Winner(p.key, m, dk, best.id, best.family, best.to_json(), "1" * 16, times[best.id],
                                    default.id, times[default.id], times[default.id] / times[best.id]))
        bad = Tactic("synthetic_family_with_a_long_name", {**LONG, "split_k": 16, "num_warps": 16, "stages": 5})
        for bi, m in enumerate(BUCKETS30[-6:]):    # out-of-memory reasons differing in their numbers only
            store.put_trial(Trial(p.key, m, bad.id, bad.family, bad.to_json(), dk, "1" * 16, "failed",
                                  OOM.format(f"{1.5 + bi:.2f}")))
        crash = Tactic("synthetic_family_with_a_long_name", {**LONG, "split_k": 32, "num_warps": 2, "stages": 1})
        store.put_trial(Trial(p.key, 1, crash.id, crash.family, crash.to_json(), dk, "1" * 16, "failed",
                              "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n"
                              "  File \"kernel.py\", line 12, in launch\n" + "x" * 300))
    store.close()
    return path


@pytest.fixture(scope="module")
def syn_summary(synthetic):
    return collect(Store(synthetic, readonly=True), {u.problem.key for u in SYN_USES}, SYN_USES)


def test_no_text_overlaps_on_a_synthetic_cache_with_long_names_and_30_buckets(syn_summary):
    (dev,) = syn_summary.devices
    assert [len(v.points) for v in dev.problems] == [30] * len(SYN)
    figs = _figures(dev)
    assert [n for n, _ in figs][-1] == "step"
    _check(figs)


def test_m_axis_is_log2_with_powers_of_two_labelled(syn_summary):
    (v,) = [v for v in syn_summary.devices[0].problems if v.key == SYN[4][0].key]
    fig = plots.time_figure(v)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    majors = [int(round(x)) for x in ax.xaxis.get_majorticklocs()]
    assert majors and all(m & (m - 1) == 0 for m in majors)                    # powers of two only
    assert len(majors) <= 12
    labelled = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert labelled == [str(m) for m in majors]
    assert sorted(set(majors) | {int(round(x)) for x in ax.xaxis.get_minorticklocs()}) == BUCKETS30
    assert not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]
    # the title is the layer names, the problem key in small type under it
    assert "156× per forward" in ax.get_title(loc="left").replace("\n", " ")
    assert any(t.get_text() == v.key and t.get_fontsize() < 9 for t in ax.texts)
    # legend: short tactic names (no default known for this family: every parameter), wrapped
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any(t.startswith("winner synthetic_family_with_a_long_name[") for t in texts)
    assert all(max(len(line) for line in t.splitlines()) <= 56 for t in texts)
    plots.plt.close(fig)


def test_roofline_labels_only_first_last_best_worst(syn_summary):
    (dev,) = syn_summary.devices
    for v in dev.problems:
        picked = plots.roofline_labels(v)
        rated = [p for p in v.points if p.roof_fraction is not None]
        want = {v.points[0].bucket, v.points[-1].bucket, max(rated, key=lambda p: p.roof_fraction).bucket,
                min(rated, key=lambda p: p.roof_fraction).bucket}
        assert {p.bucket for p in picked} == want
    fig = plots.roofline_figure(dev)
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert 0 < len(labels) <= 4 * len(dev.problems)
    plots.plt.close(fig)


def test_step_adds_up_the_stored_winners(synthetic, syn_summary):
    sv = syn_summary.devices[0].step
    assert sv.buckets == [m for m in BUCKETS30 if m <= 256] and not sv.missing
    assert [p.count for p in sv.parts] == [3, 3, 75, 75]       # the attention-like problem is not MLP
    con = sqlite3.connect(f"file:{synthetic}?mode=ro", uri=True)
    us = {(k, b): t for k, b, t in con.execute("select problem_key, bucket, median_us from winners")}
    for m in sv.buckets:
        want = sum(n * us[(p.key, m)] for p, _, n in SYN[:4])
        assert sv.total_us(m) == pytest.approx(want, rel=1e-12)
        floor = sum(n * sv.parts[i].bytes[m] for i, n in enumerate((3, 3, 75, 75))) / (sv.bandwidth_gbs * 1e9) * 1e6
        assert sv.floor_us(m) == pytest.approx(floor)
    assert sv.bandwidth_gbs == 4250.0 and not sv.ceiling_stored          # the H200 table, not stored


def test_step_from_two_caches_beside_the_measured_json():
    s = collect(StoreUnion([_ro("2026-11-29-h200-glm5-tp8-search.db"), _ro("2026-12-01-h200-moe-search.db")]), {u.problem.key for u in GLM5}, GLM5)
    (dev,) = s.devices
    sv = dev.step
    assert sv.buckets == [1, 2, 4, 8, 16, 32, 64, 128, 256] and not sv.missing and sv.ceiling_stored
    keys = [p.key for p in sv.parts]
    assert "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8:swiglu" in keys      # the fused forms served
    assert "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e256:top8:reduce" in keys
    assert any("replaced 4" in n for n in s.notes)        # w13 at 1..8 is in both: the later cache's
    attach_measured(s, load_measured(STEP_JSON, GLM5))
    ms = sv.measured
    raw = json.loads(STEP_JSON.read_text())["step"]
    assert sorted(ms.total_us) == [r["m"] for r in raw] and ms.kinds and not ms.note
    for r in raw:
        assert sum(ms.kinds[r["m"]].values()) == pytest.approx(r["step_fp4_us"])
        assert ms.floor_us[r["m"]] == r["step_floor_us"]
    # only one cache: the routed w2 has no winner at all, so no estimate, and the page says why
    (one,) = collect(_ro("2026-11-29-h200-glm5-tp8-search.db"), {u.problem.key for u in GLM5}, GLM5).devices
    assert one.step.missing and not one.step.buckets


def test_step_json_checks(tmp_path, syn_summary):
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpu": "NVIDIA H200", "step": [{"m": 0, "step_fp4_us": 5}]}')
    with pytest.raises(StepJsonError, match="positive integer 'm'"):
        load_measured(bad, GLM5)
    bad.write_text("[1, 2]")
    with pytest.raises(StepJsonError, match="not the MLP-step benchmark"):
        load_measured(bad, GLM5)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(STEP_JSON.read_text()), "gpu": "NVIDIA B200"}))
    with pytest.raises(StepJsonError, match="measured on NVIDIA B200"):
        attach_measured(syn_summary, load_measured(other, SYN_USES))
    # counts that do not reproduce the benchmark's total: totals only, said so
    ms = load_measured(STEP_JSON, SYN_USES[:2] + [ProblemUse(SYN[2][0], ("mlp.experts.w13[3-77]",), 60)])
    assert not ms.kinds and "do not add up" in ms.note and ms.total_us


# ---------------------------------------------------------------------------------- reasons

def test_long_reasons_are_one_short_line_per_class(syn_summary):
    s = short_reason(OOM.format("2.00"))
    assert s.startswith("input setup failed: OutOfMemoryError: CUDA out of memory.") and s.endswith("…")
    assert len(s) <= 80 and "\n" not in s
    assert reason_class(OOM.format("2.00")) == reason_class(OOM.format("12.50"))
    short = "successive halving: dropped after round 1 (54 us, best 6.74 us)"
    assert short_reason(short) == short and reason_class(short) == re.sub(r"\d+", "#", short)  # as before
    (fv,) = syn_summary.devices[0].verdicts
    failed = [g for g in fv.reasons if g.status == "failed"]
    # one group for the OOMs of every problem and bucket, one for the multi-line crash
    assert sorted(g.count for g in failed) == [len(SYN), len(SYN)]
    assert all(len(g.short) <= 80 and "\n" not in g.short for g in failed)
    assert any(g.reason.startswith("RuntimeError: Triton Error") and "\n" in g.reason for g in failed)


def test_show_prints_a_reason_class_on_one_line_and_verbose_in_full(synthetic, syn_summary):
    from rich.console import Console
    from autotune.report import print_summary
    con = Console(record=True, width=120)
    print_summary(syn_summary, con)
    out = con.export_text()
    rows = [ln for ln in out.splitlines() if "OutOfMemoryError" in ln]
    assert len(rows) == 1 and "expandable_segments" not in out
    con = Console(record=True, width=120)
    print_summary(syn_summary, con, verbose=True)
    assert "expandable_segments" in con.export_text().replace("\n", "").replace("│", "").replace(" ", "")

    from helpers import run_cli
    r = run_cli("show", "--json", "--verbose", cache=synthetic)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert len(d["winners"]) == 30 * len(SYN)
    groups = [g for f in d["verdicts"][0]["families"] for g in f["reasons"]]
    oom = [g for g in groups if "OutOfMemoryError" in g["reason"]]
    assert len(oom) == 1 and oom[0]["reason"].endswith("fragmentation.") and oom[0]["short"].endswith("…")


# ---------------------------------------------------------------------------------- the page

@pytest.mark.skipif(_browser() is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_page_has_no_horizontal_scroll_at_1280_and_800(tmp_path, syn_summary):
    out = tmp_path / "rep"
    index = write_html(syn_summary, out)
    html = index.read_text()
    imgs = re.findall(r"<img [^>]*>", html)
    assert imgs and all(re.search(r'alt="[^"]{20,}"', i) for i in imgs)          # every picture has its alt text
    assert html.count("<figure>") == len(imgs) and html.count("<table>") > len(imgs)
    assert "img{max-width:100%;height:auto" in html
    for width in (1280, 800):
        r = _chromium([f"--window-size={width},1600", "--dump-dom", index.as_uri()], tmp_path / f"p{width}")
        m = re.search(r'<p id="report-status"([^>]*)>', r.stdout)
        assert m, r.stderr[-500:]
        a = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
        assert a["data-images-ok"] == a["data-images"] == str(len(imgs))
        assert int(a["data-client-width"]) <= width
        assert int(a["data-scroll-width"]) <= int(a["data-client-width"]), (width, a)


@pytest.mark.skipif(_browser() is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_the_committed_example_has_no_horizontal_scroll_at_800(tmp_path):
    index = ROOT / "docs/report-example/index.html"
    r = _chromium(["--window-size=800,1600", "--dump-dom", index.as_uri()], tmp_path / "p")
    a = dict(re.findall(r'([\w-]+)="([^"]*)"', re.search(r'<p id="report-status"([^>]*)>', r.stdout).group(1)))
    assert a["data-images-ok"] == a["data-images"] == "11"
    assert int(a["data-scroll-width"]) <= int(a["data-client-width"]) <= 800, a


def test_cli_report_options_refuse_in_one_line(tmp_path, synthetic):
    from helpers import run_cli
    r = run_cli("report", "-o", tmp_path / "o", "--step-json", STEP_JSON, cache=synthetic)
    assert r.returncode == 2 and "--step-json needs --model" in r.stderr
    r = run_cli("report", "-o", tmp_path / "o", "--cache", synthetic, "--cache", synthetic, "--measure-ceilings")
    assert r.returncode == 2 and "give one --cache" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    r = run_cli("report", "-o", tmp_path / "o", "--cache", synthetic, "--model", "glm5", "--tp", "8",
                "--step-json", bad)
    assert r.returncode == 2 and "is not JSON" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "o" / "index.html").exists()


def test_fused_forms_move_their_epilogues_rows():
    """SwiGLU writes N/2 per (token, slot); the top_k reduce reads K per (token, slot), writes N per token."""
    from autotune.report.traffic import call_bytes, experts_touched
    m, n, k, e, top = 4, 512, 256, 8, 2
    w = experts_touched(e, top, m) * (n * k / 2 + n * k / 16)
    assert call_bytes(Problem.moe(n, k, experts=e, top_k=top), m) == pytest.approx(w + m * k * 2 + m * top * n * 2)
    assert call_bytes(Problem.moe(n, k, experts=e, top_k=top, epilogue="swiglu"), m) == \
        pytest.approx(w + m * k * 2 + m * top * (n // 2) * 2)
    assert call_bytes(Problem.moe(n, k, experts=e, top_k=top, epilogue="reduce"), m) == \
        pytest.approx(w + m * top * k * 2 + m * n * 2)


def test_store_union_later_cache_wins_and_misses_add_up(tmp_path):
    from autotune.core.records import Miss
    dk = "d" * 16
    a, b = Store(tmp_path / "a.db"), Store(tmp_path / "b.db")
    t1, t2 = Tactic("torch", chunk_n=0), Tactic("torch", chunk_n=64)
    p = Problem.dense(256, 512)
    for s, t, us in ((a, t1, 10.0), (b, t2, 8.0)):
        s.put_winner(Winner(p.key, 4, dk, t.id, t.family, t.to_json(), "0" * 16, us, t1.id, 10.0, 10.0 / us))
        s.record_misses([Miss(p.key, 7, dk, 2)])
    a.put_winner(Winner(p.key, 8, dk, t1.id, t1.family, t1.to_json(), "0" * 16, 20.0, t1.id, 20.0, 1.0))
    u = StoreUnion([a, b])
    got = {(w.bucket, w.tactic_id) for w in u.winners()}
    assert got == {(4, t2.id), (8, t1.id)}
    assert any("b.db replaced 1" in n for n in u.notes)
    assert [(m.m, m.count) for m in u.misses()] == [(7, 4)]
    assert u.tactic(t2.id).params == t2.params and u.url.count(" + ") == 1


def test_show_at_80_columns_never_cuts_a_tactic_parameter(syn_summary):
    """#48 item 4: `show` piped at 80 columns wraps a long winner between its parameters, never
    inside a name or a value."""
    from rich.console import Console
    from autotune.report import print_summary
    con = Console(record=True, width=80)
    print_summary(syn_summary, con)
    out = con.export_text()
    assert max(len(ln) for ln in out.splitlines()) <= 80
    params = {tok for v in syn_summary.devices[0].problems for p in v.points
              for tok in p.winner.split("[", 1)[-1].rstrip("]").split(",")}
    assert params
    for tok in params:
        assert tok in out, tok      # each parameter on one line, whole


def test_the_step_plot_switches_to_seconds_and_keeps_its_labels_apart(syn_summary):
    """#48 item 4: a CPU run's step (every part 10^6 x slower: minutes) is drawn in s, not in
    hundreds of thousands of ms; no two text boxes overlap (figure_text.layout_problems)."""
    import dataclasses
    sv = syn_summary.devices[0].step
    slow = dataclasses.replace(sv, measured=None, parts=[dataclasses.replace(p, us={m: u * 1e6 for m, u in p.us.items()})
                                                         for p in sv.parts])
    fig = plots.step_figure(slow, "CPU")
    ax = fig.axes[0]
    assert ax.get_xlabel().endswith("(s)") and max(ax.get_xlim()) < 1e6
    assert any(t.get_text().endswith(" s") for t in ax.texts)
    fast = plots.step_figure(dataclasses.replace(sv, measured=None), "H200")
    assert fast.axes[0].get_xlabel().endswith("(ms)")
    _check([("slow step", fig), ("fast step", fast)])
