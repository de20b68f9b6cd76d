"""The README's main job on this machine, then dispatch over its cache (every problem and bucket gets a winner, every served layer its own bucket's)."""
import re
import sqlite3
from collections import defaultdict

import pytest
import torch

from autotune import api
from autotune.core import inputs
from autotune.core.buckets import hybrid
from autotune.runtime.dispatch import Dispatcher
from autotune.models import problems_for
from autotune.cache import Store
from tests.test_cli import autotune

# The README's job as it runs on the CPU machine and in CI; on a GPU machine the CLI would tune the
# GPU instead (bench/device_run.sh covers that).
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU machine's main job")]


@pytest.fixture(scope="module")
def glm5_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("main") / "cache.db"
    # a bound on a stuck run, not a speed check: the CPU machine is shared and often busy
    r = autotune("search", "--model", "glm5", "--tp", "8", "--max-tokens", "16", cache=path, timeout=2400)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith("time per stage")), max(0, len(lines) - 16))
    print("\n".join(lines[at:]))              # where the time went, the whole table (shown with pytest -s)
    return path, r.stdout, r.stderr


def test_the_cpu_main_job_times_each_tactic_by_its_check_and_at_most_one_more_call(glm5_cache):
    """On the CPU one torch call outlasts a job's budget: the count-bound host rule
    (autotune.engine.strategies.successive_halving.measure_host) drops the slower tactics on their check call's time and
    times only near-ties once more (a suspicious leader once again)."""
    path, _, _ = glm5_cache
    trials = [t for t in Store(path, readonly=True).trials() if t.bucket > 0]
    assert trials and all(t.status in ("ok", "dropped") for t in trials)
    assert any(t.status == "dropped" and t.reason.startswith("count-bound host") for t in trials)
    # which jobs are count-bound depends on the machine's speed (a fast one halves the small
    # problems as a GPU does); every trial of one that is says so, and took at most two calls: its
    # check call and one more (a suspicious leader's confirmation replaces both)
    jobs = defaultdict(list)
    for t in trials:
        jobs[(t.problem_key, t.bucket)].append(t)
    bound = [ts for ts in jobs.values() if any(t.reason.startswith("count-bound host") for t in ts)]
    assert bound
    for ts in bound:
        assert all(t.reps <= 2 for t in ts), [(t.tactic_id, t.reps) for t in ts]
        assert all(t.reason.startswith(("count-bound host", "re-timed")) for t in ts), [t.reason for t in ts]


def test_main_job_fills_a_winner_for_every_problem_and_bucket(glm5_cache):
    path, out, _ = glm5_cache
    # what FP4MoE and FP4MLP serve is in the default search: 8 problems + the dense and shared gate_up's
    # SwiGLU forms + the routed experts' 4 with the shared expert folded in
    # (e257:top9: what FP4MoE(shared=...) runs by default; --fold-shared is the search's default)
    uses = problems_for("glm5", tp=8, fused_moe=True, fused_mlp=True, fold_shared=True)
    assert len(uses) == 14
    winners = {(w.problem_key, w.bucket) for w in Store(path, readonly=True).winners()}
    assert winners == {(u.problem.key, b) for u in uses for b in hybrid(16)}
    assert "no GPU" in out and "winners in" in out
    # the closing lines: where the time went (a table) and what a GPU run adds
    last = out.strip().splitlines()
    assert last[-1].startswith("what a GPU run adds:") and "triton (" in last[-1]
    assert any(ln.startswith("time per stage") for ln in last) and any(ln.startswith("  call ") for ln in last)
    assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_dispatch_matches_float64_for_every_glm5_tp8_dense_shape(glm5_cache):
    path, _, _ = glm5_cache
    d = Dispatcher(Store(path, readonly=True), record_misses=False)
    dense = [u.problem for u in problems_for("glm5", tp=8) if u.problem.kind == "dense"]
    assert len(dense) == 4
    for p in dense:
        for m in (1, 5, 16):
            s = inputs.make_inputs(p, m, "cpu", seed=m)[0]
            y = d((m, p.n, p.k))(s.x, s.w)
            ref = inputs.reference(p, s)
            assert y.dtype == torch.bfloat16 and y.shape == (m, p.n)
            assert float((y.double() - ref).norm() / ref.norm()) < 1e-2, p.key
    assert d.stats["miss"] == 0


def test_show_lists_the_winners(glm5_cache):
    path, _, _ = glm5_cache
    r = autotune("show", "--model", "glm5", "--tp", "8", "--json", cache=path)
    assert r.returncode == 0
    import json
    rows = json.loads(r.stdout)
    assert len(rows) == 14 * 5 and all(row["gpu"] for row in rows)   # 10 problems + 4 with the shared expert folded in


@pytest.mark.parametrize("fmt", ["sqlite", "json"])
def test_export_then_import_into_a_fresh_cache(glm5_cache, tmp_path, fmt):
    path, _, _ = glm5_cache
    gpu = Store(path, readonly=True).devices()[0]["gpu_name"]
    out = tmp_path / f"glm5.{fmt}"
    r = autotune("cache", "export", "-o", out, "--gpu", gpu, "--model", "glm5", "--tp", "8", "--format", fmt, cache=path)
    # 14 problems (10 + 4 with the shared expert folded in) x 5 buckets
    assert r.returncode == 0 and "exported 70 winners" in r.stdout, r.stderr
    r = autotune("cache", "export", "-o", out, "--format", fmt, cache=path)          # never overwrites
    assert r.returncode == 2
    fresh = tmp_path / "fresh.db"
    r = autotune("cache", "import", out, cache=fresh)
    assert r.returncode == 0 and "imported 70 winners" in r.stdout, r.stderr
    a = {(w.problem_key, w.bucket, w.tactic_id) for w in Store(path, readonly=True).winners()}
    b = {(w.problem_key, w.bucket, w.tactic_id) for w in Store(fresh, readonly=True).winners()}
    assert a == b
    r = autotune("cache", "import", tmp_path / "missing.db", cache=fresh)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1


def test_a_search_without_a_terminal_prints_progress_lines(glm5_cache):
    """With stderr not a terminal (the test captures it) a search prints plain progress
    lines, one at least per problem, the last with every trial and job done."""
    path, _, err = glm5_cache
    lines = [ln for ln in err.splitlines() if ln.startswith("progress: ")]
    # 14 problems (10 + 4 with the shared expert folded in), 5 buckets each
    done = [re.search(r"; (\S+) done: (\d+) buckets won — ", ln) for ln in lines if " done: " in ln]
    assert len(done) == 14 and all(d and d[2] == "5" for d in done), lines
    last = re.fullmatch(r"progress: (\d+) trials, 70/70 \(problem, bucket\) jobs; \S+ done: .*", lines[-1])
    decided = [t for t in Store(path, readonly=True).trials() if t.bucket > 0]     # checked, timed or dropped
    assert last and int(last[1]) == len(decided), lines[-1]
    assert any("left; " in ln or ln.endswith(" left") for ln in lines[:-1])    # the time-left figure while running


def test_search_and_show_count_kept_and_rejected_alike(glm5_cache):
    """#14: the CPU run printed "triton: 427 kept" though Triton never ran, and show counted 0."""
    path, out, _ = glm5_cache
    said = defaultdict(lambda: [0, 0])
    for ln in out.splitlines():
        m = re.match(r"  cpu: (\w+): (\d+) kept, (\d+) rejected", ln)
        if m:
            said[m[1]][0] += int(m[2])
            said[m[1]][1] += int(m[3])
    assert said["triton"][0] == 0 and said["triton"][1] > 0 and said["torch"][0] > 0
    (dev,) = api.show(path).summary.devices
    assert {v.family: [v.kept, v.rejected] for v in dev.verdicts} == dict(said)


def test_the_main_job_summary_has_no_framework_failure_and_no_default_among_the_served_layers(glm5_cache):
    """The summary bench/device_run.sh writes on a GPU, here for the README's CPU command:
    every (problem, bucket) has a winner, no trial failed for a cause outside its tactic, and the
    layers the runtime builds for GLM-5 TP8 with its defaults (FP4MLP for the dense MLPs: gate_up
    with the SwiGLU epilogue, then down; FP4MoE fused for the routed experts with the shared expert
    folded in, I_s = I at TP8) are served by winners at every tuned M."""
    import importlib.util
    from pathlib import Path
    path, _, err = glm5_cache
    spec = importlib.util.spec_from_file_location("main_job_summary",
                                                  Path(__file__).parents[1] / "bench" / "main_job_summary.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    s = mod.summarize(str(path), max_tokens=16, device="cpu", command="autotune search --model glm5 --tp 8 --max-tokens 16")
    assert s["trials"]["framework_failures"] == 0 and s["trials"]["failed"] == 0
    assert s["winners"] == 14 * 5                  # 10 problems + 4 with the shared expert folded in
    served = s["served"]
    # 2 FP4MLP problems (the dense layers) + 2 FP4MoE problems (routed + shared folded in), every M its own winner
    assert served["defaults"] == 0 and served["by_rung"] == {"exact": 4 * 5}, served
    moe = [r for r in served["modules"] if "FP4MoE" in r["layers"]]
    assert sorted(r["problem"] for r in moe) == ["grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9:swiglu",
                                                 "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e257:top9:reduce"], served
    assert all("shared folded in" in r["layers"] and "mlp.shared_experts.gate_up_proj" in r["layers"]
               for r in moe), served
    mlp = sorted(r["problem"] for r in served["modules"] if "FP4MLP" in r["layers"])
    assert mlp == ["dense:bf16*nvfp4->bf16:n3072:k6144:swiglu", "dense:bf16*nvfp4->bf16:n6144:k1536"], served
    assert "families measured on cpu: torch; left out: triton (" in err    # said at the start, with reasons
