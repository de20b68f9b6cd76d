"""The cuda family's dense kernel's split-K and SwiGLU forms without a GPU: the
space and verdicts (shared memory = ptxas for sm_90 and sm_120 through nvcc 13, the cubin's resource
table), the dense `swiglu` problem variant and who refuses it, the launcher's argument checks and
its workspace, and the kernel's grid ported to the CPU (autotune.tactics.cuda.dense.emulate through
tests/families/cuda_cpu.py:CudaDenseCpu) against the float64 reference: split 2/4/8, SwiGLU with and
without a split, several M tiles, row chunks, counters left zero, every output written once."""
import re
import sys
import types

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import get_arch
from autotune.core.operands import out_shape
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics import registry
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import dense as D
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda.family import DENSE_UNRUN, CudaFamily, config, dense_gpu_checked
from tests.families.cuda_cpu import CudaDenseCpu
from tests.helpers import (assert_build_and_bind_refuse_rejected, assert_checked_covers_largest,
                           assert_ptxas_refuses_rejected, assert_ptxas_smem_exact)

FAM, CPU = CudaFamily(), CudaDenseCpu()
SM90 = get_arch("sm90")
SHARED_GU = Problem.dense(512, 6144)                       # GLM-5 TP8 shared gate_up: 32 row tiles at M = 1
SHARED_GU_SW = SHARED_GU.variant("swiglu")
NO_NVCC = pytest.mark.skipif(B.nvcc() is None, reason="nvcc not on PATH")


def _t(fam="cuda", **kw):
    p = dict(warps_k=1, stages=2, tiles_n=1)
    p.update(kw)
    return Tactic(fam, **p)


def _fits(problem, tactic, arch=SM90) -> bool:
    """Kept by the exact rules: through the family a split-K or SwiGLU tactic is `unknown` until its
    GPU tests have passed (family.dense_gpu_checked, gpu_checked.json), with that reason and the exact figure."""
    v = FAM.verdict(problem, tactic, arch)
    return v.ok is True or (v.ok is None and v.reason == DENSE_UNRUN and v.smem_bytes is not None)


# ---- the problem variant ------------------------------------------------------------------------
def test_dense_swiglu_problem_key_shape_and_reference():
    p = Problem.dense(64, 256, epilogue="swiglu")
    assert p.key == "dense:bf16*nvfp4->bf16:n64:k256:swiglu" and Problem.from_key(p.key) == p
    assert Problem.from_key(Problem.dense(64, 256).key).epilogue == "none"
    assert p.out_n == 32 and out_shape(p, 5) == (5, 32)
    for bad in ("dense:bf16*nvfp4->bf16:n64:k256:reduce", "grouped_moe:bf16*nvfp4->bf16:n64:k256:swiglu"):
        with pytest.raises(ValueError, match="not a problem key"):
            Problem.from_key(bad)
    with pytest.raises(ValueError, match="reduce epilogue is a grouped_moe variant"):
        Problem.dense(64, 256, epilogue="reduce")
    with pytest.raises(ValueError, match="even N"):
        Problem.dense(48 + 1, 256, epilogue="swiglu")
    s = inputs.make_inputs(p, 3, "cpu", 1)[0]
    y = s.x.double() @ s.w.dequantize(torch.float64).T
    want = torch.nn.functional.silu(y[:, :32]) * y[:, 32:]
    assert torch.allclose(inputs.reference(p, s), want, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("chunk", [0, 512])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_torch_family_computes_dense_swiglu(chunk, dtype):
    """The default family (and float64-checked like every member): build and bind, chunked over N
    (chunks cross the gate/up boundary) or not."""
    fam = registry.get("torch")
    p = Problem.dense(1024, 256, epilogue="swiglu")
    t = Tactic("torch", dequant_dtype=dtype, chunk_n=chunk)
    assert fam.verdict(p, t, SM90).ok
    s = inputs.make_inputs(p, 5, "cpu", 2)[0]
    ref = inputs.reference(p, s)
    assert inputs.check(p, fam.build(p, t, "cpu"), s, ref) < 1e-2
    y = fam.bind(p, t, s.w, "cpu")(s.x)
    assert y.shape == (5, 512) and float((y.double() - ref).norm() / ref.norm()) < 1e-2


def test_families_without_the_variant_refuse_it():
    """Triton's dense members, cuBLASLt and CUTLASS say why; a family that does not declare the
    variant (FamilyBase.dense_epilogues) is refused by the shared verdict, never run as a plain GEMM."""
    p = Problem.dense(3072, 6144, epilogue="swiglu")
    tri = registry.get("triton")
    assert "no swiglu epilogue" in (tri.supports(p) or "") and tri.enumerate(p, SM90) == []
    from autotune.tactics.cublaslt import problem_support
    from autotune.tactics.cutlass.family import problem_support as cutlass_support
    assert "epilogue" in problem_support(p) and "epilogue" in cutlass_support(p)
    from autotune.core.tactic import Verdict
    from autotune.tactics.base import FamilyBase

    class PlainOnly(FamilyBase):             # written before the variant: it would compute [M, N]
        name = "plainonly"

        def supports(self, problem):
            return None

        def validate(self, tactic):
            return None

        def verdict_checked(self, problem, tactic, arch):
            return Verdict.keep()
    fam, t = PlainOnly(), Tactic("plainonly", x=1)
    assert fam.verdict(Problem.dense(3072, 6144), t, SM90).ok
    v = fam.verdict(p, t, SM90)
    assert v.rejected and "no swiglu epilogue on dense problems" in v.reason
    assert registry.designated_default(p, SM90, "cpu").family == "torch"


# ---- space and verdicts -------------------------------------------------------------------------
def test_swiglu_and_split_space():
    space = FAM.enumerate(SHARED_GU_SW, SM90)
    assert len(space) == 16 + 18 and all(t["tiles_n"] == 2 for t in space)     # gate + up tile per CTA
    assert {t.params.get("split_k", 1) for t in space} == {1, 2, 4, 8}
    kept = [t for t in space if _fits(SHARED_GU_SW, t)]
    assert kept and all(FAM.verdict(SHARED_GU_SW, t, SM90).ok is (True if dense_gpu_checked() else None)
                        for t in kept)
    # K = 6144 is 48 k-pairs: warps_k * split_k must divide it
    v = FAM.verdict(SHARED_GU, _t(warps_k=8, stages=2, tiles_n=1, split_k=4), SM90)
    assert v.rejected and "128*warps_k*split_k=4096" in v.reason
    v = FAM.verdict(SHARED_GU_SW, _t(warps_k=4, stages=4, tiles_n=1), SM90)
    assert v.rejected and "tiles_n must be even" in v.reason
    assert FAM.validate(_t(split_k=1)) and FAM.validate(_t(split_k=3))               # split 1 has no parameter
    assert FAM.validate(_t(warps_k=2, stages=4, tiles_n=2, split_k=8)) is None
    # the 32 split-1 tactics keep their ids (no split_k parameter), so stored winners still read
    assert sum("split_k" not in t.params for t in FAM.enumerate(SHARED_GU, SM90)) == 32
    assert _fits(SHARED_GU_SW, FAM.default(SHARED_GU_SW, SM90))
    assert FAM.verdict(SHARED_GU, _t(warps_k=8, split_k=2), SM90).smem_bytes == B.smem_bytes(
        config(_t(warps_k=8, split_k=2), 8, SHARED_GU))


def test_mxfp4_dense_is_supported_and_unknown_until_run():
    p = Problem.dense(512, 6144, w_fmt="mxfp4")
    assert FAM.supports(p) is None and len(FAM.enumerate(p, SM90)) == 68
    t = _t(warps_k=4, stages=4)
    v = FAM.verdict(p, t, SM90)
    assert _fits(p, t) and (v.ok is True) == dense_gpu_checked()
    assert config(t, 1, p).fmt == "mxfp4" and D.new_form(p, t) and not D.new_form(SHARED_GU, t)
    from autotune.core.formats import quantize
    w = quantize(torch.randn(64, 512), "mxfp4")
    assert FAM.pack_inplace(FAM.layout(t), w) is None                 # its own packed copy
    assert FAM.pack(FAM.layout(t), w).fmt == "mxfp4"


def test_batch_invariance_declared_for_every_dense_tactic():
    for p in (SHARED_GU, SHARED_GU_SW):
        assert all(FAM.batch_invariant(p, t) for t in FAM.enumerate(p, SM90))
    assert not FAM.batch_invariant(Problem.moe(512, 6144, 256, 8), _t(warps_k=4, stages=4))


def test_chunk_rows_bound_the_workspace():
    t = _t(warps_k=4, stages=4, tiles_n=1, split_k=8)
    big = Problem.dense(6144, 1536)
    rows = D.chunk_rows(big, t)
    assert rows % 64 == 0 and 4 * 8 * rows * big.n <= D.MAX_WORKSPACE_BYTES
    assert D.chunk_rows(big, _t(warps_k=4, stages=4)) is None
    assert D.workspace_elems(big, t, 1) == 8 * big.n and D.workspace_elems(big, t, 10 ** 6) == 8 * rows * big.n
    assert D.workspace_elems(big, _t(), 100) == 0


def test_options_name_split_and_swiglu():
    assert "SPLITK" not in B.defines(B.Config(1, 4, 4, 1)) and "SWIGLU" not in B.defines(B.Config(1, 4, 4, 1))
    d = B.defines(B.Config(1, 4, 4, 2, 4, True))
    assert (d["SPLITK"], d["SWIGLU"]) == ("4", "1") and "SW" not in d
    mx = B.defines(B.Config(1, 4, 4, 1, fmt="mxfp4"))
    assert (mx["SW"], mx["SCALE_ADD"], mx["EPI_SCALE"]) == ("16", "0x37003700u", "65536.0f")
    keys = {B.cubin_key(c, "sm_90", (13, 0)) for c in (B.Config(1, 4, 4, 2), B.Config(1, 4, 4, 2, 2),
                                                       B.Config(1, 4, 4, 2, 1, True), B.Config(1, 4, 4, 2, 2, True))}
    assert len(keys) == 4


# the default SwiGLU shape, the largest kept ring with a split, an 8-way split at 2 M tiles, SwiGLU at
# 32 rows with 8 warps, the 64-row tile with one row tile and a split
_CONFIGS = [B.Config(1, 4, 4, 2, 1, True), B.Config(1, 8, 2, 2, 2), B.Config(2, 2, 4, 1, 8),
            B.Config(4, 8, 2, 2, 2, True), B.Config(8, 4, 2, 1, 4), B.Config(1, 4, 4, 1, fmt="mxfp4"),
            B.Config(2, 4, 4, 2, 2, True, "mxfp4")]


@NO_NVCC
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: f"mt{c.m_tiles}-wk{c.warps_k}-st{c.stages}-tn{c.tiles_n}-"
                         f"sk{c.split_k}{'-swiglu' if c.swiglu else ''}-{c.fmt}")
def test_ptxas_agrees_with_the_verdict(arch, cfg, tmp_path):
    """Shared memory is exact: ptxas' figure and the cubin's resource table (`cuobjdump -res-usage`,
    + the 1 KiB sm_80+ reserves per CTA) both equal `smem_bytes` (split-K and SwiGLU add none);
    these variants do not spill (the 64-row tile with two row tiles does, as without a split: the
    launcher then takes the 32-row tile, build.load refuses the spilling variant with its numbers)."""
    assert_ptxas_smem_exact(cfg, arch, tmp_path)


def test_largest_kept_split_smem_is_among_the_checked():
    assert_checked_covers_largest([B.smem_bytes(config(t, mt, p)) for mt in B.M_TILES
                                   for p in (SHARED_GU, SHARED_GU_SW) for t in FAM.enumerate(p, SM90)
                                   if _fits(p, t) and (t.params.get("split_k", 1) > 1 or p.epilogue == "swiglu")],
                                  _CONFIGS)


@NO_NVCC
def test_ptxas_refuses_what_the_verdict_rejects():
    t = _t(warps_k=8, stages=4, tiles_n=2, split_k=2)
    assert_ptxas_refuses_rejected(FAM, SHARED_GU_SW, t, config(t, 1, SHARED_GU_SW))


# ---- host side ------------------------------------------------------------------------------------
SMALL = Problem.dense(64, 512)
SMALL_SW = SMALL.variant("swiglu")


def test_launch_argument_checks():
    from autotune.tactics.cuda.launch import check_call
    from autotune.core.formats import quantize
    w = L.pack(quantize(torch.randn(64, 512)))
    x = torch.randn(3, 512).to(torch.bfloat16)
    m, out = check_call(SMALL_SW, x, w, None, cuda=False)
    assert m == 3 and out.shape == (3, 32)
    with pytest.raises(ValueError, match=re.escape("out must be contiguous bf16 [3, 32]")):
        check_call(SMALL_SW, x, w, torch.empty(3, 64, dtype=torch.bfloat16), cuda=False)
    with pytest.raises(ValueError, match="x must be bf16"):
        check_call(SMALL_SW, x.float(), w, None, cuda=False)
    with pytest.raises(ValueError, match="one CUDA device"):
        check_call(SMALL_SW, x, w, None)
    with pytest.raises(ValueError, match="packed weight is 64x512"):
        check_call(Problem.dense(128, 512), x, w, None, cuda=False)


def test_build_and_bind_refuse_what_the_verdict_refuses():
    from autotune.core.formats import quantize
    bad = _t(warps_k=4, split_k=2)                          # 4 k-pairs over 8
    assert_build_and_bind_refuse_rejected(FAM, SMALL, bad, L.pack(quantize(torch.randn(64, 512))))
    with pytest.raises(ValueError, match="tiles_n must be even"):
        FAM.build(SMALL_SW, _t(), "cuda")


def test_workspace_and_counters_come_from_the_pool(monkeypatch):
    """Launch takes its split-K workspace and counters from a ScratchPool: its own (per stream,
    grown at least by doubling, outgrown ones kept for graphs) until `attach` gives a shared one;
    release() frees its own pool, never an attached one; a dense launch takes no bad-id word."""
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())      # the constructor's import only
    from autotune.tactics.cuda.launch import Launch
    from autotune.tactics.scratch import ScratchPool
    t = _t(warps_k=2, stages=2, tiles_n=1, split_k=4)
    run = Launch(Problem.dense(6144, 1536), t, "cpu", config)
    assert run.workspace_bytes(1) == 4 * 4 * 6144 and run.workspace_bytes(0) == 0
    cpu = torch.device("cpu")
    a = run.workspace(1000, cpu, 7)
    assert a.dtype == torch.float32 and a.numel() == 250 and run.workspace(800, cpu, 7) is a
    b = run.workspace(1004, cpu, 7)
    assert b.numel() == 500 and run._own.retired == [a]                       # doubled, the old one kept
    assert run.workspace(4, cpu, 8) is not b                                  # another stream, its own
    c = run.counters(12, cpu, 7)
    assert c.dtype == torch.int32 and c.numel() == 12 and int(c.abs().sum()) == 0
    run.release()
    assert run._own.bytes_held() == 0 and run._own.bytes_retired() == 0
    shared = ScratchPool()
    other = Launch(Problem.dense(1536, 6144), _t(warps_k=2, stages=2, tiles_n=1, split_k=2), "cpu", config)
    for r in (run, other):
        r.attach(shared, bad_word=torch.zeros(1, dtype=torch.int32))
    assert run.bad_word() is None and other.bad_word() is None                 # no ids read: no word
    assert run.workspace(run.workspace_bytes(1), cpu, 7) is other.workspace(other.workspace_bytes(1), cpu, 7)
    assert run.counters(4, cpu, 7) is other.counters(4, cpu, 7)
    run.release()
    assert shared.bytes_held() > 0                                            # the shared pool is not its to free
    assert Launch(SMALL, _t(), "cpu", config).workspace_bytes(64) == 0


# ---- the kernel's grid on the CPU -------------------------------------------------------------------
SMALL_MX = Problem.dense(64, 512, w_fmt="mxfp4")
_CASES = [(SMALL, dict()), (SMALL, dict(warps_k=2, split_k=2)), (SMALL, dict(split_k=4, tiles_n=2)),
          (SMALL, dict(split_k=2, warps_k=2, tiles_n=2)), (SMALL_SW, dict(tiles_n=2)),
          (SMALL_SW, dict(tiles_n=2, split_k=4)), (Problem.dense(128, 256, epilogue="swiglu"), dict(tiles_n=2, split_k=2)),
          (SMALL_MX, dict(warps_k=2)), (SMALL_MX, dict(split_k=2, tiles_n=2)),
          (SMALL_MX.variant("swiglu"), dict(tiles_n=2, split_k=2))]


@pytest.mark.parametrize("prob, kw", _CASES, ids=lambda v: v.key.split("*", 1)[-1] if isinstance(v, Problem) else
                         "-".join(f"{k}{x}" for k, x in v.items()) or "plain")
def test_grid_port_matches_float64(prob, kw):
    t = _t("cudadensecpu", **kw)
    assert CPU.verdict(prob, t, SM90).ok is not False
    for m in (1, 5, 70):                                     # 70: two 64-row M tiles
        s = inputs.make_inputs(prob, m, "cpu", 10 + m)[0]
        ref = inputs.reference(prob, s)
        launch = CPU.bind(prob, t, CPU.pack(CPU.layout(t), s.w), "cpu")
        out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16)
        launch(s.x, out=out)
        assert not torch.isnan(out).any()
        err = float((out.double() - ref).norm() / ref.norm())
        assert err < 1e-2, (m, err)


@pytest.mark.parametrize("prob", [SMALL, SMALL_SW], ids=["plain", "swiglu"])
def test_every_cta_once_counters_left_zero_and_row_chunks(prob, monkeypatch):
    """Each (N tile, M tile, split) CTA runs once per row chunk with the CTA's tiles (SwiGLU: gate
    tiles and their up tiles N/2 rows on), the counters end at zero, and past the workspace bound a
    call is cut into 64-row chunks, each with the whole split (the results match float64)."""
    monkeypatch.setattr(D, "MAX_WORKSPACE_BYTES", 1)          # one 64-row tile per chunk
    t = _t(warps_k=2, tiles_n=2, split_k=2)
    m = 130                                                    # 3 chunks: 64 + 64 + 2
    s = inputs.make_inputs(prob, m, "cpu", 3)[0]
    w = L.pack(s.w)
    trace: list = []
    locks = torch.zeros(64, dtype=torch.int32)
    out = D.emulate(prob, t, s.x, w, m_tiles=2, locks=locks, trace=trace)
    assert torch.equal(locks, torch.zeros_like(locks))
    chunks = sorted({r0 for r0, *_ in trace})
    assert chunks == [0, 64, 128]
    n_tiles = prob.n // 32
    for r0 in chunks:
        rows = min(64, m - r0)
        ctas = [(nt, my, kz) for c, nt, my, kz, _ in trace if c == r0]
        assert sorted(ctas) == [(nt, my, kz) for nt in range(n_tiles) for my in range(-(-rows // 16)) for kz in range(2)]
    for _, nt, _, _, tiles in trace:
        want = [nt, 2 + nt] if prob.epilogue == "swiglu" else [2 * nt, 2 * nt + 1]
        assert list(tiles) == want
    ref = inputs.reference(prob, s)
    assert not torch.isnan(out).any() and float((out.double() - ref).norm() / ref.norm()) < 1e-2


def test_a_rows_result_does_not_depend_on_the_batch_in_the_port():
    """The port's sums follow the kernel's fixed order (warps, then splits), whatever M tile or row
    chunk a call takes: row 0 has the same bits at M = 1 and M = 70 (the GPU test checks the kernel)."""
    t = _t(warps_k=2, tiles_n=2, split_k=2)
    s = inputs.make_inputs(SMALL_SW, 70, "cpu", 4)[0]
    w = L.pack(s.w)
    assert torch.equal(D.emulate(SMALL_SW, t, s.x[:1], w)[0], D.emulate(SMALL_SW, t, s.x, w)[0])


def test_the_mnk_fast_path_keeps_the_plain_problem():
    """dispatch((M, N, K)) is the plain GEMM: a swiglu table of the same N, K never takes its place."""
    import warnings

    from autotune.runtime.dispatch import Dispatcher
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(None, record_misses=False, warn=False)
        d.table(Problem.dense(64, 256, epilogue="swiglu"))
        s = inputs.make_inputs(Problem.dense(64, 256), 2, "cpu", 5)[0]
        assert d((2, 64, 256))(s.x, s.w).shape == (2, 64)
