"""`autotune report` / `autotune show` from a real CPU search (real SQLite, real torch kernels),
and the page opened in headless Chromium with the network off."""
import json
import re
import shutil
import sqlite3
import struct
import subprocess
from html import escape
from pathlib import Path

import pytest
import torch

from autotune.engine import timing
from autotune.core.buckets import Buckets
from autotune.core.env import Env, cpu
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.report import ceilings, collect, measure_ceilings, write_html
from autotune.report.model import static_plans
from autotune.report.traffic import call_bytes, experts_touched, intensity
from autotune.engine.search import search
from autotune.cache import Store
from autotune.tactics import registry
from autotune.core.tactic import Tactic
from tests.test_cli import autotune

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
DENSE = Problem.dense(256, 512)
MOE = Problem.moe(128, 256, experts=8, top_k=2)
BUCKETS = (1, 4, 16)
BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def cpu_cache(tmp_path_factory):
    """A cache filled by a real search on the CPU, plus one real bf16×bf16 baseline timing."""
    path = tmp_path_factory.mktemp("report") / "cache.db"
    store = Store(path)
    search([DENSE, MOE], families=[registry.get("torch")], store=store, buckets=Buckets.of(BUCKETS),
           timer=FAST, env=CPU)
    # a baseline: the same shape with bf16 weights, timed with torch.matmul (no family runs it on the CPU)
    base = Problem.dense(DENSE.n, DENSE.k, w_fmt="bf16")
    t = Tactic("matmul_bf16", impl="torch.matmul")
    for m in BUCKETS:
        x = torch.randn(m, base.k).to(torch.bfloat16)
        w = torch.randn(base.n, base.k).to(torch.bfloat16)
        tm = timing.time_calls(lambda i: x @ w.T, 1, "cpu", FAST)
        store.put_trial(Trial(base.key, m, t.id, t.family, t.to_json(), CPU.device_key, "0" * 16, "ok",
                              median_us=tm.median_us, iqr_us=tm.iqr_us, reps=tm.reps))
    store.close()
    return path


def test_summary_matches_the_stored_rows(cpu_cache):
    s = collect(Store(cpu_cache, readonly=True))
    (dev,) = s.devices
    assert dev.is_cpu and dev.arch == "cpu" and dev.ceilings is None  # nothing stored, no table entry
    assert [v.key for v in dev.problems] == sorted([DENSE.key, MOE.key])   # the bf16 problem is folded
    con = sqlite3.connect(cpu_cache)
    winners = {(p, b): (us, d) for p, b, us, d in con.execute(
        "select problem_key, bucket, median_us, default_median_us from winners")}
    for v in dev.problems:
        assert v.buckets == list(BUCKETS)
        for p in v.points:
            us, d = winners[(v.key, p.bucket)]
            assert p.winner_us == us and p.default_us == d and p.speedup == pytest.approx(d / us)
            assert p.winner.startswith("torch[") and p.default.startswith("torch[")
            assert p.tflops == pytest.approx(Problem.from_key(v.key).flops(p.bucket) / (us * 1e-6) / 1e12)
            assert p.roof_fraction is None
    dense = next(v for v in dev.problems if v.key == DENSE.key)
    assert all(set(p.baselines) == {"bf16×bf16 matmul_bf16"} and p.baselines["bf16×bf16 matmul_bf16"] > 0
               for p in dense.points)
    assert all(not p.baselines for v in dev.problems if v.key == MOE.key for p in v.points)
    # verdicts: (problem, tactic) pairs, as counted straight from the trials table
    (torch_v,) = [f for f in dev.verdicts if f.family == "torch"]
    rejected = con.execute("select count(distinct problem_key || tactic_id) from trials "
                           "where family='torch' and status='rejected'").fetchone()[0]
    kept = con.execute("select count(distinct problem_key || tactic_id) from trials "
                       "where family='torch' and status!='rejected'").fetchone()[0]
    assert (torch_v.rejected, torch_v.kept, torch_v.failed) == (rejected, kept, 0) and rejected > 0
    (g,) = [g for g in torch_v.reasons if g.status == "rejected"]   # chunk_n >= N, whatever the numbers
    assert g.count == rejected and "same as no chunking" in g.reason
    assert not [g for g in torch_v.reasons if g.status == "failed"]
    assert dev.record["gpu_name"] == CPU.gpu_name and dev.record["libs"]["torch"] == torch.__version__


def test_traffic_model_by_hand():
    # N=256, K=512, M=4: FP4 weight 65,536 B + 8,192 scale bytes, x 4,096 B, y 2,048 B
    assert call_bytes(DENSE, 4) == 65536 + 8192 + 4096 + 2048
    assert intensity(DENSE, 4) == pytest.approx(2 * 4 * 256 * 512 / 79872)
    touched = [experts_touched(64, 8, m) for m in (1, 4, 64, 100000)]
    assert touched == sorted(touched) and touched[0] <= 8 and touched[-1] == pytest.approx(64)
    assert call_bytes(MOE, 1) < call_bytes(Problem.moe(128, 256, experts=8, top_k=2), 4096)


def test_ceilings_stored_override_the_table(tmp_path, cpu_cache):
    h200 = ceilings.for_device({}, "k", "NVIDIA H200")
    assert h200 and not h200.stored and h200.bandwidth_gbs == 4250 and "hardware.md" in h200.source
    assert ceilings.for_device({}, "k", "Some Future GPU") is None
    path = tmp_path / "c.db"
    shutil.copy(cpu_cache, path)
    store = Store(path)
    dk, c = measure_ceilings(store, "cpu")
    assert dk == CPU.device_key and c.bandwidth_gbs > 0 and c.tflops["bf16"] > 0
    (dev,) = collect(store).devices
    assert dev.ceilings["stored"] and dev.ceilings["bandwidth_gbs"] == c.bandwidth_gbs
    for v in dev.problems:
        for p in v.points:
            roof = min(c.bandwidth_gbs * p.intensity / 1e3, c.tflops["bf16"])
            assert p.roof_tflops == pytest.approx(roof) and p.roof_fraction == pytest.approx(p.tflops / roof)


def test_static_plans_agree_with_the_dry_run():
    from autotune.engine.search import plan, summarize
    from autotune.core.arch import get_arch
    fams = [registry.get("torch"), registry.get("triton")]
    arch = get_arch("sm120")
    (ap,) = static_plans([DENSE, MOE], fams, [arch])
    dry = summarize(plan([DENSE, MOE], fams, arch))
    for fv in ap.verdicts:
        plans = [fp for fps in dry.values() for fp in fps if fp.family == fv.family]
        assert (fv.kept, fv.rejected, fv.unknown) == (sum(fp.kept for fp in plans), sum(fp.rejected for fp in plans),
                                                      sum(fp.unknown for fp in plans))
        assert sum(g.count for g in fv.reasons) == fv.rejected
    assert ap.arch == "sm120" and {fv.family for fv in ap.verdicts} == {"torch", "triton"}


def test_cli_report_and_show(tmp_path, cpu_cache, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")   # rich wraps to the terminal width
    out = tmp_path / "rep"
    r = autotune("report", "-o", out, "--plan-arch", "sm120", "--families", "torch", cache=cpu_cache)
    assert r.returncode == 0, r.stderr
    assert "report of 6 winners on 1 device(s)" in r.stdout
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["roofline-0.png", "speedup-0.png", "time-0-0.png", "time-0-1.png"]
    for p in out.glob("*.png"):
        _png_size(p)
    html = (out / "index.html").read_text()
    assert "CPU run" in html and escape(DENSE.key) in html and "No roofline ceilings" in html
    assert "Static verdicts on sm120 (not measured)" in html
    summary = json.loads((out / "summary.json").read_text())
    assert summary["devices"][0]["device_key"] == CPU.device_key
    r = autotune("show", cache=cpu_cache)
    assert r.returncode == 0 and "torch[chunk_n=0" in r.stdout and "verdicts on cpu" in r.stdout
    assert "same as no chunking" in r.stdout
    rows = json.loads(autotune("show", "--json", cache=cpu_cache).stdout)
    assert len(rows) == 6 and all(row["gpu"] and row["report"]["intensity"] > 0 for row in rows)
    bad = autotune("report", "-o", cpu_cache, cache=cpu_cache)
    assert bad.returncode == 2 and "not a directory" in bad.stderr
    missing = autotune("report", "-o", tmp_path / "x", cache=tmp_path / "none.db")
    assert missing.returncode == 2 and "no cache at" in missing.stderr


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def _browser() -> str | None:
    return next((b for b in map(shutil.which, BROWSERS) if b), None)


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    """Headless Chromium with every network request sent nowhere."""
    cmd = [_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
           "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _open(index: Path, tmp: Path) -> tuple[dict, list[str]]:
    """Load the page; return #report-status's attributes and the console messages."""
    r = _chromium(["--dump-dom", index.as_uri()], tmp / "profile-dom")
    m = re.search(r'<p id="report-status"([^>]*)>([^<]*)<', r.stdout)
    assert m, f"page did not load: {r.stdout[:300]} {r.stderr[-500:]}"
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
    attrs["text"] = m.group(2)
    console = [ln for ln in r.stderr.splitlines() if re.search(r":CONSOLE[:(]", ln)]
    return attrs, console


@pytest.mark.skipif(_browser() is None, reason="no chromium on PATH (.ci/run installs Debian's chromium)")
def test_report_in_headless_chromium(tmp_path, cpu_cache):
    out = tmp_path / "rep"
    write_html(collect(Store(cpu_cache, readonly=True)), out)
    index = out / "index.html"
    html = index.read_text()
    assert not re.search(r'(src|href)="(https?:)?//', html), "the page references the network"
    status, console = _open(index, tmp_path)
    n = len(list(out.glob("*.png")))
    assert n == 4 and status["data-images"] == str(n) and status["data-images-ok"] == str(n), status
    assert status["text"] == f"all {n} images loaded"
    assert console == [], console
    shot = tmp_path / "shot.png"
    r = _chromium(["--hide-scrollbars", "--window-size=1280,2400", f"--screenshot={shot}", index.as_uri()],
                  tmp_path / "profile-shot")
    assert shot.is_file(), r.stderr[-500:]
    assert _png_size(shot) == (1280, 2400) and shot.stat().st_size > 50_000  # not a blank page

    # the same harness sees a broken report: one image missing, one corrupt
    (out / "speedup-0.png").unlink()
    (out / "roofline-0.png").write_bytes(b"\x89PNG not really")
    status, console = _open(index, tmp_path)
    assert status["data-images-ok"] == str(n - 2) and "2 of 4 images failed" in status["text"]
    assert len(console) == 2 and all("report image failed to load" in c for c in console)


def test_edge_rows_of_a_gpu_cache(tmp_path):
    """Rows a GPU search writes that a CPU search does not: failures, halving drops, notes on ok
    trials, a winner with no measured default, a baseline problem with its own winner."""
    store = Store(tmp_path / "g.db")
    gpu = Env("NVIDIA H200", "9.0", 132, "cuda", "580", "13.0", None, "0.1.0", CPU.libs)
    store.put_environment(gpu, ("torch",))
    dk = gpu.device_key
    a, b = Tactic("triton", block_m=64, kernel="w4a16"), Tactic("triton", block_m=128, kernel="w4a16")

    def trial(t, bucket, status, reason="", us=None, key=DENSE.key):
        store.put_trial(Trial(key, bucket, t.id, t.family, t.to_json(), dk, "1" * 16, status, reason, median_us=us))
    trial(a, 16, "ok", "model error: compiler says smem 3072, model 3200", 10.0)
    trial(b, 16, "failed", "RuntimeError: out of resources: 5 bytes")
    trial(b, 32, "failed", "RuntimeError: out of resources: 7 bytes")
    trial(Tactic("triton", block_m=256, kernel="w4a16"), 16, "dropped", "halving round 1 of 3", 30.0)
    store.put_winner(Winner(DENSE.key, 16, dk, a.id, "triton", a.to_json(), "1" * 16, 10.0, b.id, None, None))
    base = Problem.dense(DENSE.n, DENSE.k, w_fmt="bf16", a_fmt="bf16")
    c = Tactic("cublaslt", algo=3)
    trial(c, 16, "ok", "", 25.0, key=base.key)
    store.put_winner(Winner(base.key, 16, dk, c.id, "cublaslt", c.to_json(), "1" * 16, 25.0, c.id, 25.0, 1.0))
    (dev,) = collect(store).devices
    assert dev.arch == "sm90" and not dev.is_cpu and not dev.ceilings["stored"]  # H200 from the table
    (v,) = dev.problems                                  # the bf16 problem is folded in as a baseline
    (pt,) = v.points
    assert pt.speedup is None and pt.default_us is None and pt.baselines == {"bf16×bf16 cublaslt": 25.0}
    assert pt.default.startswith("triton[block_m=128") and "kernel=w4a16" in pt.winner
    (fv,) = [f for f in dev.verdicts if f.family == "triton"]
    assert (fv.kept, fv.ok, fv.failed, fv.dropped, fv.rejected) == (3, 1, 1, 1, 0)
    groups = {(g.status, g.count) for g in fv.reasons}
    assert groups == {("failed", 1), ("dropped", 1), ("note", 1)}  # two failed buckets: one (problem, tactic)
    index = write_html(collect(store), tmp_path / "rep")
    html = index.read_text()
    assert "derived from the hardware table" in html and "out of resources" in html
    assert sorted(p.name for p in index.parent.glob("*.png")) == ["roofline-0.png", "speedup-0.png", "time-0-0.png"]
