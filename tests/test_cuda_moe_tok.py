"""The cuda family's token-major grouped-MoE kernel (`kernel="moe_tok"`, moe_tok.cu) without a GPU: its
space (the `reduce` variant only, top_k <= 32), exact verdicts (shared memory = ptxas and the cubin's
table for sm_90 and sm_120 through nvcc 13), `unknown` through the family until its text passes its
GPU tests, the launcher's route and refusals, and its grid ported to the CPU
(moe_emulate._emulate_token through tests/families/cuda_moe_cpu.py) against float64: -1 slots, bad
ids, warps splitting K, MXFP4, the shared slot, and FP4MoE serving it for w2 beside moe_mma's w13.
The kernel itself against float64: tests/test_cuda_moe_gpu.py (GPU)."""
import re
import subprocess
import warnings

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import ARCHS, get_arch
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda import moe_search as MOE_SEARCH
from autotune.tactics.cuda.family import CudaFamily
from autotune.tactics.cuda.moe_tok import TokLaunch
from tests.families.cuda_moe_cpu import CudaMoeCpu

FAM, CPU = CudaFamily(), CudaMoeCpu()
SM90 = get_arch("sm90")
W2R = Problem.moe(6144, 256, 256, 8, epilogue="reduce")          # GLM-5 TP8 routed w2, top_k summed
NO_NVCC = pytest.mark.skipif(B.nvcc() is None, reason="nvcc not on PATH")


def _t(fam="cuda", **kw):
    p = dict(kernel="moe_tok", warps_k=1, stages=2, tiles_n=1)
    p.update(kw)
    return Tactic(fam, **p)


# ---- space and verdicts ---------------------------------------------------------------------------
def test_space_is_the_reduce_variant_only():
    toks = [t for t in FAM.enumerate(W2R, SM90) if MOE.is_tok(t)]
    assert len(toks) == 36 and all(MOE.is_moe(t) and set(t.params) == {"kernel", "warps_k", "stages", "tiles_n"}
                                   for t in toks)
    for p in (W2R.variant("none"), Problem.moe(512, 6144, 256, 8, epilogue="swiglu")):
        assert not [t for t in FAM.enumerate(p, SM90) if MOE.is_tok(t)]
    wide = Problem.moe(64, 256, 64, 33, epilogue="reduce")
    assert not [t for t in FAM.enumerate(wide, SM90) if MOE.is_tok(t)]
    v = FAM.verdict(wide, _t(), SM90)
    assert v.rejected and "32 slots per token" in v.reason
    v = FAM.verdict(W2R.variant("none"), _t(), SM90)
    assert v.rejected and "reduce variant only" in v.reason
    assert FAM.verdict(W2R, _t(m_tiles=1), SM90).rejected                  # not in moe_tok's schema
    assert FAM.batch_invariant(W2R, _t())                                   # per token, fixed order
    assert FAM.code(_t()) == FAM.TOK_CODE and FAM.TOK_CODE in FAM.codes()


def test_verdicts_are_exact_and_unknown_until_gpu_checked():
    kept = [t for t in FAM.enumerate(W2R, SM90) if MOE.is_tok(t) and MOE.verdict(W2R, t, SM90).ok]
    assert {t["warps_k"] for t in kept} == {1, 2}                           # K = 256: 2 k-pairs
    v = FAM.verdict(W2R, _t(warps_k=4), SM90)
    assert v.rejected and "128*warps_k*split_k=512" in v.reason
    big = Problem.moe(6144, 4096, 64, 8, epilogue="reduce")
    v = FAM.verdict(big, _t(warps_k=8, stages=4, tiles_n=4), SM90)
    assert v.rejected and "static shared memory" in v.reason
    assert v.smem_bytes == B.smem_bytes(MOE.config(big, _t(warps_k=8, stages=4, tiles_n=4)))
    for t in kept:
        fv, exact = FAM.verdict(W2R, t, SM90), MOE.verdict(W2R, t, SM90)
        assert fv.smem_bytes == exact.smem_bytes == B.smem_bytes(MOE.config(W2R, t))
        assert (fv.ok is True) == MOE.gpu_checked(t)
        if not MOE.gpu_checked(t):
            assert fv.ok is None and fv.reason == MOE.TOK_UNRUN and fv.unchecked


_TOK = [B.MoeConfig(1, 1, 2, 1, 1, "nvfp4", reduce=True, token=True),
        B.MoeConfig(1, 2, 4, 4, 1, "nvfp4", reduce=True, token=True),      # the largest kept at GLM-5's w2
        B.MoeConfig(1, 8, 2, 2, 1, "mxfp4", reduce=True, token=True),
        B.MoeConfig(1, 1, 8, 2, 1, "nvfp4", reduce=True, token=True)]       # the deepest ring


@NO_NVCC
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("cfg", _TOK, ids=lambda c: f"wk{c.warps_k}-st{c.stages}-tn{c.tiles_n}-{c.fmt}")
def test_ptxas_agrees_with_the_verdict(arch, cfg, tmp_path):
    from tools.cuda_sass import cuobjdump
    cubin = tmp_path / "k.cubin"
    res = B.parse_ptxas(B.nvcc_compile(cfg, arch, cubin))
    assert res.smem == B.smem_bytes(cfg) and not res.spills, res
    tool = cuobjdump()
    if tool is not None:
        table = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
        assert f"SHARED:{B.smem_bytes(cfg) + 1024} " in table and "LOCAL:0 " in table, table


def test_largest_kept_smem_is_among_the_checked():
    best = max(B.smem_bytes(MOE.config(W2R, t)) for t in FAM.enumerate(W2R, SM90)
               if MOE.is_tok(t) and MOE.verdict(W2R, t, SM90).ok)
    assert best in {B.smem_bytes(c) for c in _TOK}


def test_the_kernel_holds_what_the_python_says():
    src = B.TOK_SOURCE.read_text()
    assert re.search(rf"#define MAXK {B.TOK_MAX_SLOTS}\b", src)
    assert B.kernel_name(MOE.config(W2R, _t())) == "moe_tok" and B.text(MOE.config(W2R, _t())).count("moe_tok(") == 1


# ---- the launcher ---------------------------------------------------------------------------------
def test_one_launch_at_any_m_no_alignment_no_scratch():
    run = TokLaunch(W2R, _t(), "cpu")
    assert all(MOE.route(W2R, run.cfg, m) == ("token", max(m, 1)) for m in (1, 64, 8192))
    assert run.aligned_block_m(8192) is None and run.chunk_tokens(8192) == 8192
    assert MOE_SEARCH.figures(W2R, _t(tiles_n=2), 4, 132)["ctas"] == 4 * 6144 // 32
    with pytest.raises(ValueError, match="no routing alignment"):
        run(None, None, None, aligned=object())
    with pytest.raises(ValueError, match="TokLaunch runs moe_tok"):
        TokLaunch(W2R, Tactic("cuda", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1), "cpu")
    x = torch.zeros(1, 8, 256, dtype=torch.bfloat16)                       # the argument checks are moe_mma's
    with pytest.raises(ValueError, match="CUDA device"):
        run(x, L.pack_experts(inputs.random_weight(W2R, "cpu", torch.Generator().manual_seed(0))),
            torch.zeros(1, 8, dtype=torch.int32), torch.ones(1, 8))


# ---- the grid port against float64 ------------------------------------------------------------------
SMALL = Problem.moe(64, 256, 6, 3, epilogue="reduce")


def _run(prob, tactic, ids, seed, shared_slot=False):
    s = inputs.make_inputs(prob, ids.shape[0], "cpu", seed)[0]
    run = CPU._moe_runner(prob, tactic, "cpu")
    out = torch.full((ids.shape[0], prob.n), float("nan"), dtype=torch.bfloat16)
    tw = s.topk_weights[:, :ids.shape[1]].contiguous()
    run(s.x, L.pack_experts(s.w), ids, tw, out, shared_slot=shared_slot)
    return out, s, tw, run


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("kw", [dict(), dict(warps_k=2, tiles_n=2), dict(tiles_n=4, stages=4)],
                         ids=["plain", "wk2-tn2", "tn4-st4"])
def test_grid_port_matches_float64(fmt, kw):
    prob = Problem.moe(64, 256, 6, 3, fmt, epilogue="reduce")
    ids = inputs.routing(5, 6, 3, torch.Generator().manual_seed(2))[0]
    ids[1, 0] = -1                                                          # a slot that adds nothing
    ids[3] = -1                                                             # a token routed nowhere here
    out, s, tw, _ = _run(prob, _t("cudamoecpu", **kw), ids, 7)
    ref = inputs.moe_reference(prob, s.x.double(), s.w, ids, tw)
    assert out.shape == (5, 64) and not torch.isnan(out).any()
    assert torch.equal(out[3], torch.zeros(64, dtype=torch.bfloat16))
    keep = [0, 1, 2, 4]
    assert float((out[keep].double() - ref[keep]).norm() / ref[keep].norm()) < 1e-2


def test_bad_ids_give_a_nan_row_and_set_the_word():
    ids = torch.tensor([[0, 5, 1], [6, 0, 2], [1, -1, -3], [2, 3, 4]], dtype=torch.int32)
    out, s, tw, run = _run(SMALL, _t("cudamoecpu"), ids, 3)
    assert int(run.bad) == 1 and torch.isnan(out[1]).all() and torch.isnan(out[2]).all()
    assert not torch.isnan(out[[0, 3]]).any()
    ref = inputs.moe_reference(SMALL, s.x.double(), s.w, ids.clamp(-1, 5), tw)
    assert float((out[[0, 3]].double() - ref[[0, 3]]).norm() / ref[[0, 3]].norm()) < 1e-2
    run.bad.zero_()
    run.check_ids = True                                                    # AUTOTUNE_CHECK_IDS=1
    with pytest.raises(ValueError, match="outside"):
        run(s.x, L.pack_experts(s.w), ids, tw, torch.empty(4, 64, dtype=torch.bfloat16))


def test_the_shared_slot_is_the_concatenated_slot():
    prob = Problem.moe(64, 256, 6, 3, epilogue="reduce")                     # expert 5 is the shared one
    ids = torch.tensor([[0, 4], [3, -1], [2, 1]], dtype=torch.int32)
    a, s, tw, _ = _run(prob, _t("cudamoecpu", warps_k=2), ids, 11, shared_slot=True)
    full = torch.cat([ids, ids.new_full((3, 1), 5)], 1)
    run = CPU._moe_runner(prob, _t("cudamoecpu", warps_k=2), "cpu")
    b = run(s.x, L.pack_experts(s.w), full, torch.cat([tw, tw.new_ones(3, 1)], 1))
    assert torch.equal(a, b)
    bad = ids.clone()
    bad[0, 1] = 5                                                           # the shared expert is no routable id
    c, *_ = _run(prob, _t("cudamoecpu"), bad, 11, shared_slot=True)
    assert torch.isnan(c[0]).all() and not torch.isnan(c[1:]).any()


def test_fp4moe_serves_it_for_w2_with_the_shared_slot(tmp_path, register_family, monkeypatch):
    """FP4MoE with moe_mma on w13 and moe_tok on w2 (both take the shared slot, neither aligns at
    decode): the folded shared expert is added by both kernels, nothing concatenated, float64-close;
    at an M where w13 aligns the slot is concatenated, and moe_tok is given no alignment."""
    register_family("cudamoecpu", "tests.families.cuda_moe_cpu:CudaMoeCpu")
    from tests.families import cuda_moe_cpu as fam
    E, H, I, TOP_K = 4, 256, 128, 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["sm90"], record_misses=False, warn=False)
    g = torch.Generator().manual_seed(4)
    routed = [torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g), torch.randn(E, H, I, generator=g)]
    shared = [torch.randn(I, H, generator=g), torch.randn(I, H, generator=g), torch.randn(H, I, generator=g)]
    blk = FP4MoE.from_float(*routed, TOP_K, dispatcher=d, shared=FP4MoE.shared_from_float(*shared), fold_shared=True)
    d.pin(blk.problem13, Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=2, m_tiles=1, split_k=1))
    d.pin(blk.problem2, _t("cudamoecpu", tiles_n=2))
    seen = []
    real = fam._CpuMoeRun.__call__

    def spy(self, x, w, ids, tw=None, out=None, shared_slot=False, aligned=None, **extra):
        seen.append((MOE.is_tok(self.tactic), tuple(ids.shape), shared_slot, aligned is not None))
        return real(self, x, w, ids, tw, out, shared_slot=shared_slot, aligned=aligned, **extra)
    monkeypatch.setattr(fam._CpuMoeRun, "__call__", spy)
    x = torch.randn(3, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [3, -1], [2, 0]], dtype=torch.int32)
    tw = torch.rand(3, TOP_K)
    y = blk(x, ids, tw)
    assert seen == [(False, (3, TOP_K), True, False), (True, (3, TOP_K), True, False)]
    q = lambda w: quantize(w).dequantize(torch.float64)                    # noqa: E731
    gq, uq, dq = (q(w) for w in routed)
    sg, su, sd = (q(w) for w in shared)
    ref = torch.zeros(3, H, dtype=torch.float64)
    for i in range(3):
        v = x[i].double()
        ref[i] = sd @ (torch.nn.functional.silu(sg @ v) * (su @ v))
        for j in range(TOP_K):
            e = int(ids[i, j])
            if e >= 0:
                ref[i] += float(tw[i, j]) * (dq[e] @ (torch.nn.functional.silu(gq[e] @ v) * (uq[e] @ v)))
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    seen.clear()
    m = MOE.ALIGN_PAIRS // (TOP_K + 1) + 1                                  # w13 takes the aligned route
    big = torch.randint(-1, E, (m, TOP_K), generator=g, dtype=torch.int32)
    blk(torch.randn(m, H).to(torch.bfloat16), big, torch.rand(m, TOP_K, generator=g))
    # w13 aligns on its own (moe_tok shares no alignment), the slot concatenated for both
    assert seen == [(False, (m, TOP_K + 1), False, False), (True, (m, TOP_K + 1), False, False)]


def test_the_launch_matches_the_kernels_signature():
    """What TokLaunch passes (the launch itself captured, on CPU tensors) is what moe_tok.cu declares:
    one pointer per 'P', one int32 per 'i' (pdl.signature packs exactly these), grid (M, N tiles, 1),
    the shared slot's E - 1 and id columns, and the bad-id word as the 8th pointer."""
    import numpy as np
    from autotune.tactics.cuda import pdl as P
    prob = Problem.moe(64, 256, 6, 3, epilogue="reduce")
    calls = []

    class Captured(TokLaunch):
        def check(self, x, w, topk_ids, topk_weights, out, **shared):
            return MOE.check_call(self.problem, x, w, topk_ids, topk_weights, out, cuda=False, **shared)

        def _run(self, dev):
            return lambda grid, block, args, stream: calls.append((grid, block, args))
    run = Captured(prob, _t(tiles_n=2, warps_k=2), "cpu")
    s = inputs.make_inputs(prob, 5, "cpu", 1)[0]
    w = L.pack_experts(s.w)
    run(s.x, w, s.topk_ids, s.topk_weights)
    run(s.x, w, s.topk_ids[:, :2].contiguous(), s.topk_weights[:, :2].contiguous(), shared_slot=True)
    fmt = P.signature(B.text(run.cfg), "moe_tok")[1:]
    for (grid, block, args), shared_e, cols in zip(calls, (-1, 5), (3, 2)):
        assert grid == (5, 64 // 32, 1) and block == (64, 1, 1) and len(args) == len(fmt)
        assert all(isinstance(a, int) if f == "P" else isinstance(a, np.int32) for a, f in zip(args, fmt))
        assert args[7] == run.bad.data_ptr() and args[2] == s.x.data_ptr()
        assert [int(v) for v in args[8:]] == [5, 64, 256, 3, 6, 0, 1, 1, 1, shared_e, cols]


def test_the_search_does_not_time_it_where_it_re_reads_weights():
    """Family.useful: moe_tok up to TOK_PAIRS_PER_EXPERT pairs per expert (M·top_k <= 3·E), moe_mma everywhere; the
    search's rows (engine.strategies.base.kept_at) and the ranked plans follow it."""
    from autotune.cache import Store
    from autotune.engine.strategies.ranked import batches as ranked, plans as strategy
    from autotune.engine.search import _Work, plan
    from autotune.tactics.cuda.checked import awaiting_record
    mma = Tactic("cuda", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1)
    last = MOE_SEARCH.TOK_PAIRS_PER_EXPERT * W2R.experts // W2R.top_k
    assert last == 96                      # GLM-5 TP8's routed w2 (E 256, top 8): M = 64 timed, 128 not
    assert FAM.useful(W2R, _t(), last) and not FAM.useful(W2R, _t(), last + 1) and FAM.useful(W2R, mma, 8192)
    rows = plan([W2R], [FAM], SM90)[W2R]
    w = _Work(W2R, [r for r in rows if r.verdict.ok or awaiting_record(r.verdict)], FAM.default(W2R, SM90))
    assert any(MOE.is_tok(r.tactic) for r in strategy.kept_at(w, 1))
    assert not any(MOE.is_tok(r.tactic) for r in strategy.kept_at(w, 128))
    model = __import__("autotune.engine.strategies.ranked.model", fromlist=["load"]).load(strategy.shipped(SM90))
    plans = strategy.plans(model, [w], [1, 128], SM90, 132, Store("sqlite://"), "dev", ranked.Ranked())
    assert any(MOE.is_tok(t) for t in plans[(W2R.key, 1)].order)
    assert not any(MOE.is_tok(t) for t in plans[(W2R.key, 128)].order + plans[(W2R.key, 128)].extras)
