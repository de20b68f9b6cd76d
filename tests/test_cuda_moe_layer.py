"""The cuda family's MoE layer kernel (`kernel="moe_layer"`, moe_layer.cu) without a GPU: its member line
(out of the default space), its verdicts and refusals, shared memory exact against ptxas on sm_90 and
sm_120 (nvcc 13; no spills), the parameter declaration in its text, and its CPU port (the w13 role's and
the w2 role's arithmetic, moe_emulate) against a float64 layer with -1 and bad ids, the shared slot and
MXFP4. The protocol: tests/test_cuda_moe_layer_protocol.py; the kernel on a GPU: test_cuda_moe_layer_gpu.py."""
import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import get_arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.cuda import args as A
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda import members as M
from autotune.tactics.cuda import moe_layer as ML
from autotune.tactics.cuda import moe_layer_emulate as MLE
from autotune.tactics.cuda import pdl
from autotune.tactics.cuda.family import CudaFamily

SM90, SM120 = get_arch("sm90"), get_arch("sm120")
W13 = Problem.moe(512, 6144, 257, 9, epilogue="swiglu")     # GLM-5 TP8: 256 routed + the shared expert
NO_NVCC = pytest.mark.skipif(B.nvcc() is None, reason="nvcc not on PATH")


def _t(**kw):
    p = dict(kernel="moe_layer", warps_k=2, stages=2, tiles_n=2)
    p.update(kw)
    return Tactic("cuda", **p)


def test_member_line_and_not_in_the_default_space():
    m = M.by_kernel()["moe_layer"]
    assert m.files[-1] == "moe_layer.cu" and m.tactic_kernel == "moe_layer"
    assert M.member_of(_t()) is m and isinstance(m.impl(), ML.LayerMember)
    fam = CudaFamily()
    assert not [t for t in fam.enumerate(W13, SM90) if t.params.get("kernel") == "moe_layer"]
    kept = ML.layer_space(W13, SM90)
    assert kept and all(not ML.verdict(W13, t, SM90).rejected for t in kept)
    assert "tests/test_cuda_moe_layer_gpu.py" in M.gpu_tests()
    assert fam.code(_t()).member == "cuda/moe_layer"


def test_verdicts_and_refusals():
    assert ML.verdict(W13, _t(), SM90).ok
    assert "w13 swiglu problem" in ML.verdict(W13.variant("none"), _t(), SM90).reason
    assert "slots per token" in ML.verdict(Problem.moe(512, 6144, 64, 33, epilogue="swiglu"), _t(), SM90).reason
    assert "multiples of 128" in ML.verdict(Problem.moe(512, 640, 8, 4, epilogue="swiglu"), _t(), SM90).reason
    assert ML.verdict(W13, _t(tiles_n=1), SM90).rejected                   # SwiGLU pairs need an even tiles_n
    # one ring config for both roles: w2's K is I = 256 at GLM-5 TP8, so at most 2 warps split it
    assert "multiples of 128·warps_k=512" in ML.verdict(W13, _t(warps_k=4), SM90).reason
    big = ML.verdict(Problem.moe(2048, 1024, 8, 4, epilogue="swiglu"), _t(warps_k=8, stages=8, tiles_n=4), SM90)
    assert big.rejected and "static shared memory" in big.reason
    assert ML.w2_problem(W13) == Problem.moe(6144, 256, 257, 9, epilogue="reduce")
    assert ML.grid(W13, ML.config(W13, _t()), 1) == (16, 192, 9 * 16 + 192)
    run = ML.LayerLaunch(W13, _t(), "cpu")
    x = torch.zeros(29, 6144, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        run(x, None, None, torch.zeros(29, 9, dtype=torch.int32))


def test_the_text_declares_its_parameters_and_the_python_matches_it():
    text = B.text(ML.config(W13, _t()))
    assert A.MOE_LAYER.macro() in text and text.count("moe_layer(MOE_LAYER_PARAMS)") == 1
    assert pdl.signature(text, "moe_layer") == A.MOE_LAYER.fmt()
    own = B.SOURCES["moe_layer"][-1].read_text()
    for name, value in (("CAP", ML.PR.CAP), ("MAXK", ML.MAX_SLOTS), ("EPOCH_BITS", ML.PR.EPOCH_BITS),
                        ("ERR_SPIN", ML.PR.ERR_SPIN)):
        assert f"#define {name} {value}" in own, name
    assert "#define EPOCH_MAX 0xFFFF" in own and ML.PR.EPOCH_MAX == 0xFFFF
    # h from L2 only (tok_slots.cuh's SlotX<true>: ld.global.cg), after an acquire
    assert "SlotX<true>" in own and "SlotX<>" not in own and "ld.global.cg.v4" in text and "ld.acquire.gpu" in own


@NO_NVCC
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("kw", [dict(), dict(warps_k=1, stages=8, tiles_n=4)], ids=["wk2-st2-tn2", "wk1-st8-tn4"])
def test_ptxas_agrees_with_the_verdict(arch, kw):
    c = ML.config(W13, _t(**kw))
    r = B.nvcc_resources(c, arch)
    assert r.smem == c.smem() == ML.verdict(W13, _t(**kw), SM90).smem_bytes
    assert not r.spills, r


# ---- the CPU port against float64 -----------------------------------------------------------------
SMALL = Problem.moe(512, 256, 6, 3, epilogue="swiglu")       # H 256, I 256, 6 experts, top_k 3


def _layer(prob, tactic, ids, seed, shared_slot=False):
    s = inputs.make_inputs(prob, ids.shape[0], "cpu", seed)[0]
    w2 = inputs.random_weight(ML.w2_problem(prob), "cpu", torch.Generator().manual_seed(seed + 5))
    tw = s.topk_weights[:, :ids.shape[1]].contiguous()
    bad = torch.zeros(1, dtype=torch.int32)
    y = MLE.emulate(prob, tactic, s.x, L.pack_experts(s.w), L.pack_experts(w2), ids, tw, bad=bad,
                   shared_slot=shared_slot)
    return y, s, w2, tw, bad


def _ref(prob, s, w2, ids, tw):
    h = inputs.moe_reference(prob, s.x.double(), s.w, ids, None)      # [M, top_k, I], not rounded
    return inputs.moe_reference(ML.w2_problem(prob), h, w2, ids, tw)    # [M, H]: the slots summed


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("kw", [dict(warps_k=1, tiles_n=2), dict(warps_k=2, tiles_n=4, stages=4)], ids=["wk1", "wk2-tn4"])
def test_cpu_port_matches_float64(fmt, kw):
    prob = Problem.moe(512, 256, 6, 3, fmt, epilogue="swiglu")
    ids = inputs.routing(5, 6, 3, torch.Generator().manual_seed(2))[0]
    ids[1, 0] = -1                                                          # a slot that adds nothing
    ids[3] = -1                                                             # a token routed nowhere here
    y, s, w2, tw, bad = _layer(prob, _t(**kw), ids, 7)
    ref = _ref(prob, s, w2, ids, tw)
    assert y.shape == (5, 256) and not torch.isnan(y).any() and int(bad) == 0
    assert torch.equal(y[3], torch.zeros(256, dtype=torch.bfloat16))
    keep = [0, 1, 2, 4]
    assert float((y[keep].double() - ref[keep]).norm() / ref[keep].norm()) < 2e-2


def test_cpu_port_bad_ids_and_the_shared_slot():
    ids = torch.tensor([[0, 4, 1], [6, 0, 2], [1, -1, -3], [2, 3, 4]], dtype=torch.int32)
    y, s, w2, tw, bad = _layer(SMALL, _t(warps_k=1), ids, 3)
    assert int(bad) == 1 and torch.isnan(y[1]).all() and torch.isnan(y[2]).all() and not torch.isnan(y[[0, 3]]).any()
    ref = _ref(SMALL, s, w2, ids.clamp(-1, 5), tw)
    assert float((y[[0, 3]].double() - ref[[0, 3]]).norm() / ref[[0, 3]].norm()) < 2e-2
    # a shared slot (expert 5 added last) is the concatenated slot
    two = torch.tensor([[0, 4], [3, -1], [2, 1]], dtype=torch.int32)
    a, s, w2, tw, _ = _layer(SMALL, _t(warps_k=1), two, 11, shared_slot=True)
    full = torch.cat([two, two.new_full((3, 1), 5)], 1)
    b = MLE.emulate(SMALL, _t(warps_k=1), s.x, L.pack_experts(s.w), L.pack_experts(w2), full,
                   torch.cat([tw, tw.new_ones(3, 1)], 1))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="pairs > 256"):
        MLE.emulate(SMALL, _t(), torch.zeros(86, 256, dtype=torch.bfloat16), None, None,
                   torch.zeros(86, 3, dtype=torch.int32))
