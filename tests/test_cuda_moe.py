"""The cuda family's grouped-MoE member (moe_mma) without a GPU: the stacked NVFP4/MXFP4 layout,
the space and verdicts (shared memory = ptxas for sm_90 and sm_120 through nvcc 13), the host-side
argument checks of build/bind/launch, and the kernel's grid ported to the CPU (autotune.tactics.cuda.moe.
emulate through tests/families/cuda_moe_cpu.py) against the float64 reference: -1 ids, bad ids,
groups larger than a CTA's capacity, split-K, SwiGLU, routing weights, token chunks, and the
aligned route (large M: moe_align's blocks, the direct route's groups)."""
import dataclasses
from pathlib import Path

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import get_arch
from autotune.core.formats import quantize
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics import registry
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda import moe_search as MOE_SEARCH
from autotune.tactics.cuda import moe_emulate as EMU
from autotune.tactics.cuda.family import CudaFamily
from tests.families.cuda_moe_cpu import CudaMoeCpu
from tests.helpers import (assert_build_and_bind_refuse_rejected, assert_checked_covers_largest,
                           assert_ptxas_refuses_rejected, assert_ptxas_smem_exact)

FAM, CPU = CudaFamily(), CudaMoeCpu()
SM90 = get_arch("sm90")
W13 = Problem.moe(512, 6144, 256, 8)                 # GLM-5 TP8 routed w13 ([gate; up], 2 x 2048 / 8)
W2 = Problem.moe(6144, 256, 256, 8)                  # GLM-5 TP8 routed w2
W2R = W2.variant("reduce")
NO_NVCC = pytest.mark.skipif(B.nvcc() is None, reason="nvcc not on PATH")


def _t(fam="cuda", **kw):
    p = dict(kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1)
    p.update(kw)
    return Tactic(fam, **p)


def _weights(prob, seed):
    g = torch.Generator().manual_seed(seed)
    return inputs.random_weight(prob, "cpu", g)


# ---- layout -------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stacked_layout_round_trip_and_decode(fmt):
    w = quantize(torch.randn(3, 32, 256) * torch.logspace(-3, 2, 32)[None, :, None], fmt)
    p = L.pack_experts(w)
    assert p.experts == 3 and tuple(p.packed.shape) == (3, 32, 128) and p.scales.dtype == torch.uint8
    assert p.scales.numel() == w.scales.numel()                  # the checkpoint's byte counts
    back = L.unpack_experts(p)
    assert torch.equal(back.packed, w.packed)
    assert torch.equal(back.scales.view(torch.uint8), w.scales.view(torch.uint8))
    assert torch.equal(back.global_scale, w.global_scale)
    for e in range(3):                                           # the kernel's decode, exactly
        assert torch.equal(L.emulate_dequantize_any(L.expert(p, e)), w.expert(e).dequantize())


def test_mx_scale_pair_is_exact_over_the_accepted_range():
    lo, hi = L.MX_SCALE_RANGE
    b = torch.arange(lo, hi + 1)
    pair = (b * L.MX_SCALE_MUL + L.MX_SCALE_ADD).to(torch.int16).view(torch.bfloat16).double()
    assert torch.equal(pair, torch.ldexp(torch.ones_like(pair), (b - 127 + 110).long()))
    # every e2m1 magnitude times the smallest accepted scale is still exact in bf16
    e2m1 = torch.tensor([0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64) * 2.0 ** -126
    prod = (e2m1.to(torch.bfloat16).double() * pair[0]).to(torch.bfloat16).double()
    assert torch.equal(prod, e2m1 * pair[0])


@pytest.mark.parametrize("byte", [0, 10, 145, 255])
def test_mx_scales_outside_the_exact_range_refused(byte):
    w = quantize(torch.randn(2, 16, 128), "mxfp4")
    w.scales[1, 3, 2] = byte
    with pytest.raises(ValueError, match=f"MXFP4 scale byte {byte} .* outside"):
        L.pack_experts(w)


def test_stacked_pack_refuses_shapes():
    with pytest.raises(ValueError, match="stacked"):
        L.pack_experts(quantize(torch.randn(16, 128)))
    with pytest.raises(ValueError, match="multiple of 128"):
        L.pack_experts(quantize(torch.randn(2, 16, 64)))
    with pytest.raises(ValueError, match="2-D nvfp4"):
        L.pack(quantize(torch.randn(2, 16, 128)))


def test_family_packs_stacked_experts():
    w = _weights(Problem.moe(32, 256, 4, 2), 1)
    p = FAM.pack(FAM.layout(_t()), w)
    assert isinstance(p, L.CudaPacked) and p.experts == 4 and p.global_scale.shape == (4,)
    # in place: the same bytes as the copy, over the weight's own storage; the inverse restores it
    w0 = _weights(Problem.moe(32, 256, 4, 2), 1)
    ptrs = (w.packed.data_ptr(), w.scales.data_ptr())
    q = FAM.pack_inplace(FAM.layout(_t()), w)
    assert (q.packed.data_ptr(), q.scales.data_ptr()) == ptrs and q.experts == 4
    assert torch.equal(q.packed, p.packed) and torch.equal(q.scales, p.scales)
    back = L.unpack_experts(q)
    assert torch.equal(back.packed, w0.packed) and torch.equal(back.scales.view(torch.uint8), w0.scales.view(torch.uint8))
    again = FAM.pack_inplace(FAM.layout(_t()), w, already_packed=True)     # moved bytes: wrapped, not packed
    assert torch.equal(again.packed, q.packed) and again.packed.data_ptr() == ptrs[0]
    assert FAM.pack_inplace(FAM.layout(_t()), _weights(Problem.moe(32, 256, 4, 2), 1).expert(0)) is not None


def test_stacked_pack_in_place_stopped_part_way_marks_the_weight(monkeypatch):
    """Every check runs before the first byte is written; a write that still fails part-way leaves a
    weight that is neither layout, marked so, so nothing reads it as a checkpoint."""
    from autotune.core.formats import held_layout
    w = _weights(Problem.moe(32, 256, 4, 2), 2)
    from autotune.tactics.cuda import inplace as INPLACE
    real, calls = L._words_of, []

    def failing(*a):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA out of memory (injected)")
        return real(*a)
    monkeypatch.setattr(L, "_words_of", failing)
    with pytest.raises(RuntimeError, match="injected"):
        INPLACE.pack_experts_inplace(w)
    assert held_layout(w.packed) == INPLACE.PARTIAL
    with pytest.raises(ValueError, match="stopped part-way"):
        w.dequantize()


# ---- space, verdicts, ptxas -----------------------------------------------------------------------
def test_registered_for_grouped_problems():
    fam = registry.get("cuda")
    space = fam.enumerate(W13, SM90)
    assert len(space) == 192 and all(MOE.is_moe(t) for t in space)
    assert fam.enumerate(W13.variant("swiglu"), SM90) and fam.enumerate(W2.variant("reduce"), SM90)
    assert fam.enumerate(Problem.moe(512, 6144, 256, 8, a_fmt="nvfp4"), SM90) == []   # W4A4: not this kernel
    assert fam.enumerate(Problem.moe(512, 6144, 256, 8, "mxfp4"), SM90)
    # declared for both kernels' tactics on their own problem kind (dense: tests/test_cuda_dense.py), never across
    assert fam.batch_invariant(W13, space[0]) and not fam.batch_invariant(W13, fam.default(Problem.dense(512, 6144), SM90))


def _fits(problem, tactic, arch) -> bool:
    """Kept by the member's exact rules: through the family that is `unknown` until the kernel has run
    on a GPU (moe.gpu_checked: gpu_checked.json), with that reason and the exact figure."""
    v = FAM.verdict(problem, tactic, arch)
    return v.ok is True or (v.ok is None and v.reason == MOE.unrun(tactic) and v.smem_bytes is not None)


def test_an_unrun_kernel_is_unknown_until_checked_on_a_gpu():
    v, exact = FAM.verdict(W13, FAM.default(W13, SM90), SM90), MOE.verdict(W13, FAM.default(W13, SM90), SM90)
    assert exact.ok is True and v.smem_bytes == exact.smem_bytes
    assert (v.ok is None and v.unchecked) == (not MOE.gpu_checked(FAM.default(W13, SM90)))   # the search leaves it unmeasured


def test_verdicts():
    kept = [t for t in FAM.enumerate(W2, SM90) if _fits(W2, t, SM90)]
    # K = 256 is 2 k-pairs: warps_k * split_k <= 2
    assert {(t["warps_k"], t["split_k"]) for t in kept} == {(1, 1), (1, 2), (2, 1)}
    v = FAM.verdict(W2, _t(warps_k=2, split_k=2), SM90)
    assert v.rejected and "128*warps_k*split_k=512" in v.reason
    v = FAM.verdict(W13, _t(warps_k=8, stages=4, tiles_n=4, m_tiles=2), SM90)
    assert v.rejected and "static shared memory" in v.reason and v.smem_bytes == B.smem_bytes(
        MOE.config(W13, _t(warps_k=8, stages=4, tiles_n=4, m_tiles=2))) > 48 * 1024
    v = FAM.verdict(W13.variant("swiglu"), _t(tiles_n=1), SM90)
    assert v.rejected and "tiles_n must be even" in v.reason
    assert FAM.verdict(Problem.moe(48, 256, 4, 2), _t(tiles_n=2), SM90).rejected   # 3 row tiles
    assert _fits(W13, _t(), get_arch("sm80"))
    assert FAM.verdict(W13, Tactic("cuda", warps_k=4, stages=4, tiles_n=1), SM90).rejected   # dense tactic
    assert FAM.verdict(Problem.dense(512, 6144), _t(), SM90).rejected                      # moe tactic
    assert FAM.verdict(W13, _t(stages=3), SM90).rejected                                   # not in schema
    for p in (W13, W2, W13.variant("swiglu"), Problem.moe(512, 6144, 256, 8, "mxfp4")):
        assert _fits(p, FAM.default(p, SM90), SM90)
    assert FAM.default(W13, SM90)["split_k"] > 1            # M = 1 fills the SMs: 8 x 32 x split CTAs


# the default-like shape, the largest static array the verdict keeps (36,928 B), SwiGLU with wide
# tiles and an 8-way split, the reduce epilogue with a split, the smallest MXFP4 reduce variant
_CONFIGS = [B.MoeConfig(1, 4, 4, 1, 4), B.MoeConfig(2, 4, 4, 2, 1, "mxfp4"), B.MoeConfig(1, 1, 4, 4, 8, "nvfp4", True),
            B.MoeConfig(2, 2, 4, 2, 2, "nvfp4", reduce=True), B.MoeConfig(1, 1, 2, 1, 1, "mxfp4", reduce=True),
            B.MoeConfig(2, 8, 2, 2, 1),       # 8 warps
            B.MoeConfig(1, 1, 2, 4, 1, "nvfp4", reduce=True, n_walk=4)]   # a walk: the same arrays


@NO_NVCC
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: f"mt{c.m_tiles}-wk{c.warps_k}-st{c.stages}-tn{c.tiles_n}-"
                         f"sk{c.split_k}-{c.fmt}{'-swiglu' if c.swiglu else ''}{'-reduce' if c.reduce else ''}")
def test_ptxas_agrees_with_the_verdict(arch, cfg, tmp_path):
    """Shared memory is exact: ptxas' figure and the cubin's resource table (`cuobjdump -res-usage`,
    which adds the 1 KiB that sm_80+ reserves per CTA) both equal `smem_bytes`. Spills are only
    known from a compile (build.load refuses a spilling variant at its first launch, with its
    numbers; e.g. m_tiles 2, 8 warps, 2 tiles, split 2 spills 8 bytes on sm_120 under nvcc 13.0):
    these do not."""
    assert_ptxas_smem_exact(cfg, arch, tmp_path)


def test_largest_kept_smem_is_among_the_checked():
    """The ptxas sample covers the biggest static array the verdict keeps (so no kept config is
    judged by a term the compiler was never compared with)."""
    assert_checked_covers_largest([B.smem_bytes(MOE.config(W13, t)) for t in FAM.enumerate(W13, SM90)
                                   if _fits(W13, t, SM90)], _CONFIGS)


@NO_NVCC
def test_ptxas_refuses_what_the_verdict_rejects():
    t = _t(warps_k=8, stages=4, tiles_n=2, m_tiles=1)
    assert_ptxas_refuses_rejected(FAM, W13, t, MOE.config(W13, t))


def test_options_name_the_format():
    nv, mx = B.defines(B.MoeConfig(1, 4, 4, 1, 1)), B.defines(B.MoeConfig(1, 4, 4, 1, 1, "mxfp4"))
    assert (nv["SW"], nv["SCALE_ADD"]) == ("32", "0x40004000u") and (mx["SW"], mx["SCALE_ADD"]) == ("16", "0x37003700u")
    keys = {B.cubin_key(c, "sm_90", (13, 0)) for c in (B.MoeConfig(1, 4, 4, 1, 1), B.MoeConfig(1, 4, 4, 1, 1, "mxfp4"),
                                                       B.MoeConfig(1, 4, 4, 1, 2), B.MoeConfig(1, 4, 4, 1, 1, swiglu=True),
                                                       B.MoeConfig(1, 4, 4, 1, 1, reduce=True), B.Config(1, 4, 4, 1))}
    assert len(keys) == 6


# ---- host-side checks ------------------------------------------------------------------------------
SMALL = Problem.moe(64, 256, 6, 2)


def test_build_and_bind_refuse_what_the_verdict_refuses():
    bad = _t(warps_k=2, split_k=2)                      # 2 k-pairs over 4
    assert_build_and_bind_refuse_rejected(FAM, SMALL, bad, L.pack_experts(_weights(SMALL, 2)))
    with pytest.raises(ValueError, match="dense cuda tactic"):
        FAM.build(SMALL, Tactic("cuda", warps_k=1, stages=2, tiles_n=1), "cuda")


def test_bind_refuses_misaligned_and_mismatched_packs():
    from tests.test_cuda_family import _shifted
    good = L.pack_experts(_weights(SMALL, 3))
    for field, by in (("packed", 8), ("scales", 2)):
        bad = dataclasses.replace(good, **{field: _shifted(getattr(good, field), by)})
        with pytest.raises(ValueError, match=f"{field} is at address"):
            CPU.bind(SMALL, _t("cudamoecpu"), bad, "cpu")
    with pytest.raises(ValueError, match="stacked experts"):
        CPU.bind(SMALL, _t("cudamoecpu"), dataclasses.replace(good, experts=5), "cpu")
    with pytest.raises(TypeError, match="packed weight"):
        CPU.bind(SMALL, _t("cudamoecpu"), _weights(SMALL, 3), "cpu")


def test_launch_argument_checks():
    w = L.pack_experts(_weights(SMALL, 4))
    x = torch.randn(3, SMALL.k).to(torch.bfloat16)
    ids = torch.zeros(3, 2, dtype=torch.int32)
    chk = lambda *a: MOE.check_call(SMALL, *a, cuda=False)  # noqa: E731
    m, out = chk(x, w, ids, None, None)
    assert m == 3 and out.shape == (3, 2, 64)
    with pytest.raises(ValueError, match="x must be bf16"):
        chk(x.float(), w, ids, None, None)
    with pytest.raises(ValueError, match="topk_ids must be int32/int64"):
        chk(x, w, ids.float(), None, None)
    with pytest.raises(ValueError, match="topk_ids must be"):
        chk(x, w, ids[:2], None, None)
    with pytest.raises(ValueError, match="topk_weights"):
        chk(x, w, ids, torch.ones(3, 1), None)
    with pytest.raises(ValueError, match="out must be"):
        chk(x, w, ids, None, torch.empty(3, 2, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="stacked"):
        chk(x, L.expert(w, 0), ids, None, None)
    with pytest.raises(ValueError, match="CUDA device"):
        MOE.check_call(SMALL, x, w, ids, None, None)          # the real launcher needs CUDA
    with pytest.raises(ValueError, match=r"\[M, 2, 256\]"):
        MOE.check_call(SMALL.variant("none"), x[:, None].expand(3, 3, 256).contiguous(), w, ids, None, None, cuda=False)


# ---- the kernel's grid on the CPU -------------------------------------------------------------------
def _check(prob, tactic, m, seed, ids=None, routed=True, x3=False):
    s = inputs.make_inputs(prob, m, "cpu", seed)[0]
    w = s.w
    ids = s.topk_ids if ids is None else ids
    tw = s.topk_weights if routed else None
    x = s.x if not x3 else torch.randn(m, prob.top_k, prob.k).to(torch.bfloat16)
    ref = inputs.moe_reference(prob, x.double(), w, ids, tw)
    launch = CPU.bind(prob, tactic, CPU.pack(CPU.layout(tactic), w), "cpu")
    out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16)
    launch(x, ids, tw, out=out, routing_checked=True)
    return out, ref, launch


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("kw", [dict(), dict(split_k=2, tiles_n=2), dict(warps_k=2, m_tiles=2, tiles_n=4)],
                         ids=["plain", "split2-tn2", "wk2-mt2-tn4"])
def test_grid_port_matches_float64(fmt, kw):
    prob = Problem.moe(64, 256, 6, 2, fmt)
    for m in (1, 5):
        ids = inputs.routing(m, 6, 2, torch.Generator().manual_seed(m))[0]
        if m == 5:
            ids[1, 0] = -1                                  # not on this rank: a zero row
        out, ref, _ = _check(prob, _t("cudamoecpu", **kw), m, 10 + m, ids)
        assert not torch.isnan(out).any()
        err = float((out.double() - ref).norm() / ref.norm())
        assert err < 1e-2, err
        if m == 5:
            assert torch.equal(out[1, 0], torch.zeros(64, dtype=torch.bfloat16))


def test_swiglu_and_per_pair_x_match_float64():
    prob = Problem.moe(64, 256, 6, 2, epilogue="swiglu")
    out, ref, _ = _check(prob, _t("cudamoecpu", tiles_n=2, split_k=2), 4, 3)
    assert out.shape == (4, 2, 32) and float((out.double() - ref).norm() / ref.norm()) < 1e-2
    prob = Problem.moe(64, 256, 6, 2)
    out, ref, _ = _check(prob, _t("cudamoecpu"), 4, 4, routed=False, x3=True)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_reduce_matches_float64(fmt):
    """w2's fused form: x one row per pair, each token's routing-weighted sum of its slots; a -1
    slot adds nothing, a bad id makes its token's row NaN."""
    prob = Problem.moe(64, 256, 6, 2, fmt, epilogue="reduce")
    ids = inputs.routing(5, 6, 2, torch.Generator().manual_seed(3))[0]
    ids[2, 1] = -1
    out, ref, _ = _check(prob, _t("cudamoecpu", split_k=2, tiles_n=2), 5, 8, ids, x3=True)
    assert out.shape == (5, 64) and float((out.double() - ref).norm() / ref.norm()) < 1e-2
    bad = ids.clone()
    bad[3, 0] = 6
    s = inputs.make_inputs(prob, 5, "cpu", 8)[0]
    run = CPU._moe_runner(prob, _t("cudamoecpu"), "cpu")
    run.check_ids = True                                    # the opt-in per-call raise
    got = torch.zeros(5, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="outside"):
        run(s.x, L.pack_experts(s.w), bad, s.topk_weights, got)
    assert torch.isnan(got[3]).all() and not torch.isnan(got[[0, 1, 2, 4]]).any()


def test_bad_ids_give_nan_rows_and_raise():
    prob = Problem.moe(32, 256, 4, 2)
    ids = torch.tensor([[0, 4], [-3, 1], [2, -1]], dtype=torch.int32)
    s = inputs.make_inputs(prob, 3, "cpu", 5)[0]
    run = CPU._moe_runner(prob, _t("cudamoecpu"), "cpu")
    w = L.pack_experts(s.w)
    out = torch.full((3, 2, 32), 7.0, dtype=torch.bfloat16)
    run(s.x, w, ids, None, out)                             # by default: no host read, the word stays set
    assert int(run.bad) == 1 and torch.isnan(out[0, 1]).all()
    run.bad.zero_()
    run.check_ids = True                                    # AUTOTUNE_CHECK_IDS=1: the per-call raise
    with pytest.raises(ValueError, match="outside \\[-1, E\\)"):
        run(s.x, w, ids, None, out)
    assert torch.isnan(out[0, 1]).all() and torch.isnan(out[1, 0]).all()
    assert torch.equal(out[2, 1], torch.zeros(32, dtype=torch.bfloat16))
    ok = ids.clone()
    ok[ok >= 4] = 0
    ok[ok < -1] = 0
    ref = inputs.moe_reference(prob, s.x.double(), s.w, ok, None)
    for (i, j) in ((0, 0), (1, 1), (2, 0)):
        assert float((out[i, j].double() - ref[i, j]).norm() / ref[i, j].norm()) < 1e-2
    assert int(run.bad) == 0                                # read and cleared by the raise


def test_groups_cover_every_pair_once_in_order():
    """Skewed routing with more pairs per expert than a CTA holds: each valid pair is in exactly
    one lead CTA's group, groups hold <= 8*m_tiles pairs of one expert in pair order."""
    prob = Problem.moe(32, 128, 3, 3)
    m = 40                                                  # 120 pairs over 3 experts: ~40 per expert
    ids = torch.stack([torch.randperm(3, generator=torch.Generator().manual_seed(i)) for i in range(m)]).int()
    ids[5, 1] = -1
    for mt in (1, 2):
        trace: list = []
        s = inputs.make_inputs(prob, m, "cpu", 6)[0]
        out = EMU.emulate(prob, _t(m_tiles=mt), s.x, L.pack_experts(s.w), ids, None, trace=trace)
        seen = [p for _, _, grp in trace for p in grp]
        flat = ids.reshape(-1).tolist()
        assert sorted(seen) == [p for p in range(len(flat)) if flat[p] >= 0]
        for q, e, grp in trace:
            assert grp[0] == q and len(grp) <= 8 * mt and list(grp) == sorted(grp)
            assert all(flat[p] == e for p in grp)
        ref = inputs.moe_reference(prob, s.x.double(), s.w, ids, None)
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-2


def test_token_chunks_above_max_pairs(monkeypatch):
    monkeypatch.setattr(MOE, "MAX_PAIRS", 8)                # 4 tokens of top-2 per launch
    prob = Problem.moe(32, 128, 4, 2)
    out, ref, launch = _check(prob, _t("cudamoecpu", split_k=1), 11, 7)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-2
    launch.release()
    assert launch.kernel.released == 1                      # the bound runner itself (no wrapper)


# ---- the aligned route (large M) ---------------------------------------------------------------------
def test_routes_by_pair_count_and_workspace():
    none, red = W2, W2.variant("reduce")
    c1, c2 = MOE.config(none, _t()), MOE.config(red, _t(split_k=2))
    assert MOE.route(none, c1, MOE.ALIGN_PAIRS // 8) == ("direct", MOE.MAX_PAIRS // 8)
    assert MOE.route(none, c1, MOE.ALIGN_PAIRS // 8 + 1) == ("aligned", MOE.ALIGN_PAIRS // 8 + 1)  # no workspace: one launch
    assert MOE.route(none, c1, 8192, shared_slot=True) == ("direct", MOE.MAX_PAIRS // 8)     # its ids are not in topk_ids
    per_token = 8 * 6144 * 4 * (2 + 1)                      # split-K partials and reduce rows per token
    chunk = MOE.route(red, c2, 8192)[1]
    assert chunk == MOE.WS_BYTES // per_token
    assert chunk * per_token <= MOE.WS_BYTES < (chunk + 1) * per_token   # the largest chunk under the cap
    run = MOE.MoeLaunch(red, _t(split_k=2), "cpu")
    assert run.aligned_block_m(1) is None and run.aligned_block_m(64) == MOE.ALIGN_BLOCK_M
    assert run.aligned_block_m(8192) is None                 # token chunks align each on their own
    assert run.chunk_tokens(8192) == MOE.WS_BYTES // per_token


def test_aligned_grid():
    for mt, wk in ((1, 1), (2, 4)):
        c = MOE.config(W13, _t(m_tiles=mt, warps_k=wk))
        assert MOE.grid_x(c, 300) == (300, 300)
        g_main = 300 // 16 + 8
        gx, groups = MOE.grid_x(c, 300, g_main, 16)
        assert groups == g_main * 16 // (8 * mt) and gx == groups + -(-300 // (8 * 32 * wk))
        assert MOE.grid_x(c, 300, g_main, 64)[1] == g_main * 64 // (8 * mt)
    with pytest.raises(ValueError, match="BLOCK_M=8"):
        MOE.grid_x(MOE.config(W13, _t(m_tiles=2)), 300, 10, 8)


def test_span_of_routed_nowhere_rows_fits_the_ring():
    """The CTAs after the groups list up to SPAN = 8 * threads pair ids in the ring's shared array:
    it holds them in every kept config (the ring is >= 2 stages x 36 B per thread)."""
    src = B.source_text("moe_mma")
    assert "#define SPAN (8 * NTHREADS)" in src and "#define SMEM_BYTES (PIPE_BYTES > RED_BYTES" in src
    for prob in (W13.variant("swiglu"), W2.variant("reduce"), W2):
        for t in MOE_SEARCH.enumerate_space(prob):
            if MOE.verdict(prob, t, SM90).ok:
                c = MOE.config(prob, t)
                ring = B.smem_bytes(c) - 4 * 8 * c.m_tiles  # the static array besides the group's pair list
                assert 4 * 8 * c.threads <= ring, t


@pytest.mark.parametrize("cap", [8, 16])
def test_aligned_groups_are_the_direct_groups(cap):
    """moe_align's blocks cut in groups of CAP rows give the direct route's lead groups (an expert's
    pairs in pair order, ranks [i*CAP, (i+1)*CAP)), so a row's bits do not depend on the route."""
    g = torch.Generator().manual_seed(cap)
    for experts, pairs in ((5, 300), (40, 512), (3, 257)):
        ids = torch.randint(0, experts, (pairs,), generator=g)
        ids[torch.randint(0, pairs, (pairs // 5,), generator=g)] = -1
        ids[7] = experts                                     # bad ids are in no group either
        ids[11] = -4
        flat = ids.tolist()
        direct = EMU._groups(flat, experts, cap, False)
        aligned = EMU._groups(flat, experts, cap, True)
        assert sorted((e, tuple(gr)) for _, e, gr in aligned) == sorted((e, tuple(gr)) for _, e, gr in direct)
        assert sorted(p for _, _, gr in aligned for p in gr) == [p for p, v in enumerate(flat) if 0 <= v < experts]


@pytest.mark.parametrize("epi, kw", [("none", dict()), ("swiglu", dict(tiles_n=2, split_k=2)),
                                     ("reduce", dict(split_k=2, m_tiles=2))])
def test_aligned_route_matches_float64(epi, kw):
    """M = 80 of top-4 (320 pairs > ALIGN_PAIRS) through the CPU port: the aligned route, -1 slots zero
    rows (reduce: nothing added), a bad id a NaN row and the word set."""
    prob = Problem.moe(64, 256, 12, 4, epilogue=epi)
    m = 80
    s = inputs.make_inputs(prob, m, "cpu", 21)[0]
    ids = s.topk_ids.clone()
    ids[::3, 1] = -1
    x = torch.randn(m, 4, 256).to(torch.bfloat16) if epi == "reduce" else s.x
    ref = inputs.moe_reference(prob, x.double(), s.w, ids, s.topk_weights)
    trace: list = []
    out = EMU.emulate(prob, _t(**kw), x, L.pack_experts(s.w), ids, s.topk_weights, trace=trace)
    assert MOE.route(prob, MOE.config(prob, _t(**kw)), m)[0] == "aligned"
    assert not torch.isnan(out).any() and float((out.double() - ref).norm() / ref.norm()) < 1e-2
    assert max(q for q, _, _ in trace) < 2 * (320 // 16 + 12)   # group CTAs of the blocks, not pair slots
    if epi != "reduce":
        assert torch.equal(out[0, 1], torch.zeros_like(out[0, 1]))
    bad = ids.clone()
    bad[2, 3] = 12
    word = torch.zeros(1, dtype=torch.int32)
    out = EMU.emulate(prob, _t(**kw), x, L.pack_experts(s.w), bad, s.topk_weights, bad=word)
    row = out[2] if epi == "reduce" else out[2, 3]
    assert int(word) == 1 and torch.isnan(row).all()


def test_a_callers_alignment_is_checked_before_the_kernel_reads_it():
    """The kernel reads sorted_ids[max_blocks · BLOCK_M] and expert_ids[max_blocks] without bounds:
    an alignment of other pairs, a BLOCK_M the groups do not divide, buffers short, of another dtype
    or on another device are refused in one line."""
    from tests.families.cuda_moe_cpu import cpu_alignment
    prob, m = W2.variant("reduce"), 40                     # 320 pairs: the aligned route
    cfg = MOE.config(prob, _t(m_tiles=2))
    kind, rows = MOE.route(prob, cfg, m)
    ids = torch.randint(0, 256, (m, 8))
    good = cpu_alignment(ids, 256, 16)
    MOE.check_alignment(prob, cfg, m, kind, rows, good, "cpu")
    MOE.check_alignment(prob, cfg, m, kind, rows, None, "cpu")
    bad = [(cpu_alignment(ids[:39], 256, 16), "320 tokens|does not serve"),
           (dataclasses.replace(good, block_m=8), "BLOCK_M=8"),
           (dataclasses.replace(good, sorted_ids=good.sorted_ids[:-1]), "sorted_ids must be"),
           (dataclasses.replace(good, expert_ids=good.expert_ids.long()), "expert_ids must be"),
           (dataclasses.replace(good, expert_ids=good.expert_ids.to("meta")), "expert_ids must be")]
    for al, msg in bad:
        with pytest.raises(ValueError, match=msg):
            MOE.check_alignment(prob, cfg, m, kind, rows, al, "cpu")
    with pytest.raises(ValueError, match="route direct"):
        MOE.check_alignment(prob, cfg, 4, *MOE.route(prob, cfg, 4), good, "cpu")


def test_a_walk_is_a_reduce_tactic_of_split_k_1_whose_tiles_divide_n(monkeypatch):
    """n_walk (N tiles per CTA after its route) only on w2:reduce with split_k 1, N a multiple of
    16·tiles_n·n_walk; a tactic without it keeps its id (walks one tile); the grid shrinks by n_walk."""
    walk = _t(warps_k=1, stages=2, tiles_n=4, m_tiles=1, split_k=1)
    assert MOE.validate(walk) is None and MOE.n_walk(walk) == 1
    w4 = Tactic("cuda", **{**walk.params, "n_walk": 4})
    assert MOE.validate(w4) is None and MOE.config(W2R, w4).n_walk == 4 and w4.id != walk.id
    assert "n_walk" in MOE.validate(Tactic("cuda", **{**walk.params, "n_walk": 3}))
    assert MOE.check_tiling(W2R, w4) is None
    assert "split_k 1 only" in MOE.check_tiling(W2R, Tactic("cuda", **{**w4.params, "split_k": 2}))
    assert "split_k 1 only" in MOE.check_tiling(W13.variant("swiglu"), Tactic("cuda", **{**w4.params, "tiles_n": 2}))
    assert "n_walk" in MOE.check_tiling(Problem.moe(192, 256, 8, 2, epilogue="reduce"), w4)   # 192 % 256
    space = MOE_SEARCH.enumerate_space(W2R)
    assert not [t for t in space if MOE.n_walk(t) > 1]            # out of the search (moe_search.WALKS)
    monkeypatch.setattr(MOE_SEARCH, "WALKS", True)
    walks = [t for t in MOE_SEARCH.enumerate_space(W2R) if MOE.n_walk(t) > 1]
    assert walks and all(t["split_k"] == 1 and t["m_tiles"] == 1 for t in walks)
    assert not [t for t in MOE_SEARCH.enumerate_space(W13) if MOE.n_walk(t) > 1]
    assert MOE_SEARCH.figures(W2R, w4, 16, 132)["ctas"] * 4 == MOE_SEARCH.figures(W2R, walk, 16, 132)["ctas"]
    assert B.defines(MOE.config(W2R, w4))["NW"] == "4" and "NW" not in B.defines(MOE.config(W2R, walk))


@NO_NVCC
@pytest.mark.parametrize("wk,st,tn,nw,arch,spills", [(2, 2, 1, 2, "sm_90", True), (4, 2, 2, 4, "sm_120", True),
                                                      (8, 4, 1, 8, "sm_90", True), (1, 2, 1, 2, "sm_90", False),
                                                      (2, 4, 2, 2, "sm_90", False), (4, 4, 2, 4, "sm_120", False)])
def test_the_walks_left_out_of_the_space_are_the_ones_that_spill(wk, st, tn, nw, arch, spills, monkeypatch):
    """moe_search.walk_spills covers what ptxas spills (a sample of the full scan its docstring gives):
    the family refuses a spilling kernel at load, so the space leaves those walks out; its neighbours
    compile clean and stay in."""
    c = B.MoeConfig(1, wk, st, tn, 1, "nvfp4", reduce=True, n_walk=nw)
    assert B.nvcc_resources(c, arch).spills is spills
    if spills:
        assert MOE_SEARCH.walk_spills(wk, st, tn)                # every spill inside the rule (it may cover more)
    else:
        assert not MOE_SEARCH.walk_spills(wk, st, tn)
    monkeypatch.setattr(MOE_SEARCH, "WALKS", True)               # (walks are out of the search by default)
    in_space = any(t["warps_k"] == wk and t["stages"] == st and t["tiles_n"] == tn and MOE.n_walk(t) == nw
                   for t in MOE_SEARCH.enumerate_space(Problem.moe(6144, 1024, 8, 2, epilogue="reduce")))
    assert in_space is not spills
    with pytest.raises(RuntimeError, match="n_walk"):       # the kernel refuses a walk with SwiGLU
        B.nvcc_resources(B.MoeConfig(1, 2, 2, 2, 1, "nvfp4", True, True, n_walk=2), "sm_90")
