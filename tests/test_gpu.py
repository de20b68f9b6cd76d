"""Runs only on a CUDA GPU (skipped elsewhere): kernels at real shapes, the CUDA timer."""
import pytest
import torch

from autotune.core import inputs
from autotune.engine import timing
from autotune.core.problem import Problem
from autotune.tactics import registry
from autotune.core.arch import detect

pytestmark = pytest.mark.gpu

GLM5_TP8_DENSE = [Problem.dense(3072, 6144), Problem.dense(6144, 1536), Problem.dense(512, 6144), Problem.dense(6144, 256)]


@pytest.mark.parametrize("p", GLM5_TP8_DENSE + [Problem.dense(768, 2048, w_fmt="mxfp4")], ids=lambda p: p.key)
def test_triton_kept_configs_match_float64_at_real_shapes(p):
    fam, arch = registry.get("triton"), detect()
    kept = [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok]
    d = fam.default(p, arch)
    sample = ([d] if fam.verdict(p, d, arch).ok else []) + kept[:: max(1, len(kept) // 6)]
    assert sample, "no kept config"
    for m in (1, 16, 300):
        s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
        ref = inputs.reference(p, s)
        for t in sample:
            k = fam.build(p, t, "cuda")
            err = inputs.check(p, k, s, ref)            # NaN-poisoned output, float64 reference
            assert err < 1e-2
            if t["kernel"] == "w4a16_dequant":
                assert k.smem_compiled is not None and k.smem_compiled <= arch.smem_per_block_optin
                assert k.smem_compiled == fam.verdict(p, t, arch).smem_bytes, (t, k.smem_compiled)


@pytest.mark.parametrize("p", [Problem.dense(3072, 6144), Problem.dense(512, 6144, w_fmt="mxfp4")], ids=lambda p: p.key)
def test_triton_split_k_is_graph_safe_and_leaves_counters_zero(p):
    """Split-K's per-tile counters reset themselves: many launches (eager and in a CUDA graph)
    keep giving the float64 answer and leave every counter at 0."""
    fam, arch = registry.get("triton"), detect()
    t = next(t for t in fam.enumerate(p, arch) if t.get("split_k") == 8 and fam.verdict(p, t, arch).ok)
    k = fam.build(p, t, "cuda")
    s = inputs.make_inputs(p, 5, "cuda", seed=11)[0]
    ref = inputs.reference(p, s)
    inputs.check(p, k, s, ref)
    out = torch.empty(5, p.n, dtype=torch.bfloat16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(4):
            k(s.x, s.w, out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < 1e-2 and int(k._locks.abs().sum()) == 0


def test_torch_family_moe_on_cuda():
    p = Problem.moe(512, 1024, experts=32, top_k=4)
    fam, arch = registry.get("torch"), detect()
    s = inputs.make_inputs(p, 37, "cuda", seed=3)[0]
    inputs.check(p, fam.build(p, fam.default(p, arch), "cuda"), s, inputs.reference(p, s))


def test_cuda_timer_graph_and_eager():
    p = Problem.dense(512, 1024)
    fam, arch = registry.get("torch"), detect()
    k = fam.build(p, fam.default(p, arch), "cuda")
    sets = inputs.make_inputs(p, 4, "cuda", seed=1, n_sets=3)
    outs = [inputs.torch_empty_out(p, 4, s) for s in sets]
    memo: dict = {}
    t = timing.time_calls(lambda i: k(*sets[i].args(), out=outs[i]), 3, "cuda", memo=memo)
    assert 0 < t.median_us < 10_000 and t.reps >= 3
    g, calls = memo["graph"]
    assert calls == 3                       # one call per input set: a replay reads the whole rotation
    again = timing.time_calls(lambda i: 1 / 0, 3, "cuda", memo=memo)   # replays; never calls the callable
    assert memo["graph"][0] is g and again.median_us > 0
    # forced eager (estimate above the threshold): a ~0.5 ms spin is timed per call
    big = timing.time_calls(lambda i: torch.cuda._sleep(1_000_000), 1, "cuda", timing.TimerConfig(graph_below_us=100))
    assert big.median_us > 100
    # a host sync inside the call cannot be captured: eager, remembered
    memo2: dict = {}
    x = torch.ones(4, device="cuda")
    sync = timing.time_calls(lambda i: x.sum().item(), 1, "cuda", memo=memo2)
    assert memo2 == {"eager": True} and sync.median_us > 0


def test_queued_replay_samples_time_the_graph_not_the_host():
    """Graph samples queued back to back (one synchronize per batch) read what the same replay
    reads timed alone behind a synchronize: a captured spin of ~40 us, within 25 %; without the
    precision stop the run is sized by the budget (here max_reps), with it by the spread."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.cuda._sleep(80_000)
    g.replay()
    torch.cuda.synchronize()
    alone = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        timing._lead(timing.TimerConfig())
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        alone.append(a.elapsed_time(b) * 1e3)
    t = timing._replay((g, 1), timing.TimerConfig(budget_s=1.0, min_reps=3, max_reps=50, precision=0))
    ref = sorted(alone)[len(alone) // 2]
    assert t.reps == 50 and abs(t.median_us - ref) < 0.25 * ref, (t, ref)
    # the precision stop: a spin's ~1.5 % spread (H100, 2026-12-07) makes its median 1 % precise after
    # a few samples, long before 50 (at 0.25 % it needs ~25, too near 50 to be a fair bound)
    p = timing._replay((g, 1), timing.TimerConfig(budget_s=1.0, min_reps=3, max_reps=50, precision=0.01))
    assert timing.FIRST_SAMPLES <= p.reps < 50 and abs(p.median_us - ref) < 0.25 * ref, (p, ref)


@pytest.mark.parametrize("p", [Problem.moe(512, 6144, 256, 8), Problem.moe(6144, 256, 256, 8)], ids=lambda p: p.key)
def test_triton_moe_matches_float64_at_glm5_tp8_shapes(p):
    """The grouped-MoE member at GLM-5 TP8's w13/w2 shapes, skewed routing, NaN-poisoned output."""
    fam, arch = registry.get("triton"), detect()
    kept = [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok]
    sample = [fam.default(p, arch)] + kept[::5]
    for m in (1, 37):
        s = inputs.make_inputs(p, m, "cuda", seed=m, skew=1.2)[0]
        ref = inputs.reference(p, s)
        for t in sample:
            k = fam.build(p, t, "cuda")
            assert inputs.check(p, k, s, ref) < 1e-2
            assert k.smem_compiled == fam.verdict(p, t, arch).smem_bytes, (t, k.smem_compiled)
