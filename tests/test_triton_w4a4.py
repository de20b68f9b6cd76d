"""The W4A4 member of the `triton` family (`w4a4_dot_scaled`): space and verdicts, the activation
quantizer against autotune/formats.py (bit-exact, interpreter), MXFP4 W4A4 numerics in the
interpreter, the smem/tmem model against Triton 3.9's compiler on every target, and (gpu) NVFP4 /
MXFP4 numerics on real hardware.

The interpreter mis-computes NVFP4 dot_scaled (Triton 3.9.0; shared/reference/triton-fp4.md), so
NVFP4 W4A4 numerics are only checked on a GPU (the requires_sm100 / requires_sm120 tests, or any
GPU where the verdict keeps it).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.core.problem import Problem
from autotune.core.arch import ARCHS, get_arch
from autotune.core.tactic import Tactic
from autotune.tactics.triton_fp4 import TritonFamily, compat, smem_w4a4, w4a4
from autotune.tactics.triton_fp4.compile import compile_kernel
from autotune.tactics.triton_fp4.family import cross_compile

ROOT = Path(__file__).resolve().parents[1]
FAM = TritonFamily()
W4A4_NV = Problem.dense(4096, 4096, "nvfp4", a_fmt="nvfp4")
W4A4_MX = Problem.dense(4096, 4096, "mxfp4", a_fmt="mxfp4")
W4A16_NV = Problem.dense(4096, 4096, "nvfp4")


def _triton_version() -> tuple[int, int]:
    try:
        import triton
    except ImportError:
        return (0, 0)
    return tuple(int(x) for x in triton.__version__.split(".")[:2])


# ---- space, ids, validate, verdicts (pure) ---------------------------------------------------------

def test_space_ids_and_separation_from_w4a16():
    a = FAM.enumerate(W4A4_NV, get_arch("sm120"))
    assert a == FAM.enumerate(W4A4_NV, get_arch("sm120")) and len(a) == 126
    assert {t["kernel"] for t in a} == {"w4a4_dot_scaled"} and len({t.id for t in a}) == len(a)
    for t in a:
        assert FAM.validate(t) is None and Tactic.from_json(t.to_json()) == t
    d = FAM.default(W4A4_NV, get_arch("sm120"))
    assert d in a and d.id == "dcb67be538b5fde9", d.id     # a pure function of the parameters
    # W4A16 problems never see the W4A4 member, W4A4 problems never the W4A16 kernels
    w16 = FAM.enumerate(W4A16_NV, get_arch("sm120"))
    assert w16 and not any(t["kernel"] == "w4a4_dot_scaled" for t in w16)
    v = FAM.verdict(W4A16_NV, d, get_arch("sm120"))
    assert v.rejected and "needs FP4 activations in the weight's format" in v.reason
    v = FAM.verdict(W4A4_NV, FAM.default(W4A16_NV, get_arch("sm120")), get_arch("sm120"))
    assert v.rejected and "needs bf16 activations" in v.reason
    # mixed formats are not W4A4 problems of this member
    assert FAM.enumerate(Problem.dense(4096, 4096, "nvfp4", a_fmt="mxfp4"), get_arch("sm120")) == []
    with pytest.raises(ValueError, match="needs FP4 activations"):
        FAM.build(W4A16_NV, d, "cpu")


def test_validate_rejects_bad_parameters():
    d = FAM.default(W4A4_MX, get_arch("sm100")).params
    assert FAM.validate(Tactic("triton", {**d, "block_k": 64})) is not None
    assert FAM.validate(Tactic("triton", {**d, "block_m": 48})) is not None
    assert FAM.validate(Tactic("triton", {**d, "num_stages": 1})) is not None
    assert FAM.validate(Tactic("triton", {**d, "split_k": 1})) is not None
    assert FAM.validate(Tactic("triton", {**d, "num_warps": 8.0})) is not None
    assert FAM.validate(Tactic("triton", {**d, "block_k": 512})) == "triton w4a4_dot_scaled tactic block_k=512 not in (128, 256)"
    # valid but pruned from the space: the verdict does not vouch for it
    v = FAM.verdict(W4A4_MX, Tactic("triton", {**d, "block_m": 16, "block_n": 32, "num_warps": 8}), get_arch("sm100"))
    assert v.rejected and "pruned" in v.reason


def test_verdicts_compat_arch_and_smem(monkeypatch):
    t = FAM.default(W4A4_NV, get_arch("sm90"))
    # the H200's Triton 3.6: NVFP4 dot_scaled does not compile on sm90 -> rejected with the reason
    monkeypatch.setattr(compat, "installed_triton", lambda: (3, 6))
    v = FAM.verdict(W4A4_NV, t, get_arch("sm90"))
    assert v.rejected and "does not compile on sm90 with Triton < 3.7" in v.reason and "(installed 3.6)" in v.reason
    assert FAM.verdict(W4A4_MX, t, get_arch("sm90")).ok                 # MXFP4 compiles there
    assert FAM.verdict(W4A4_NV, t, get_arch("sm120")).ok                # only sm90 is listed
    monkeypatch.setattr(compat, "installed_triton", lambda: (3, 9))
    assert FAM.verdict(W4A4_NV, t, get_arch("sm90")).ok                 # 3.9 emulates it (cross-compiled)
    # NVFP4's e4m3 scale pointer has no type on sm80/86; MXFP4 is fine there
    v = FAM.verdict(W4A4_NV, t, get_arch("sm80"))
    assert v.rejected and "fp8e4nv not supported" in v.reason
    assert FAM.verdict(W4A4_MX, t, get_arch("sm86")).ok
    # K tiling and shared memory, with the model's figure in the reason
    v = FAM.verdict(Problem.dense(4096, 4096 + 128, "nvfp4", a_fmt="nvfp4"), t, get_arch("sm120"))
    assert v.rejected and "BLOCK_K=256 does not divide K=4224" in v.reason
    big = Tactic("triton", kernel="w4a4_dot_scaled", block_m=128, block_n=256, block_k=256, num_warps=8, num_stages=4)
    need = smem_w4a4.smem_bytes(big.params, "nvfp4", get_arch("sm120"))
    v = FAM.verdict(W4A4_NV, big, get_arch("sm120"))
    assert v.rejected and v.reason == f"smem {need} > 101376" and need == 165888
    assert FAM.verdict(W4A4_NV, big, get_arch("sm100")).ok
    # every config's tensor memory fits sm100's 512 columns; every target keeps some configs
    for arch in ("sm89", "sm90", "sm100", "sm120", "sm121"):
        kept = [x for x in FAM.enumerate(W4A4_NV, get_arch(arch)) if FAM.verdict(W4A4_NV, x, get_arch(arch)).ok]
        assert len(kept) > 50, arch
        assert FAM.verdict(W4A4_NV, FAM.default(W4A4_NV, get_arch(arch)), get_arch(arch)).ok
    assert max(smem_w4a4.tmem_columns(x.params, "nvfp4", get_arch("sm100"))
               for x in FAM.enumerate(W4A4_NV, get_arch("sm100"))) == 512


def test_inputs_and_reference_helpers():
    """make_inputs adds the checkpoint-style input_scale; the reference multiplies the
    dequantized quantized activations (so it differs from the bf16-activation reference)."""
    import torch

    from autotune.core import inputs
    from autotune.engine import timing
    s = inputs.make_inputs(Problem.dense(64, 256, "nvfp4", a_fmt="nvfp4"), 8, "cpu", seed=3)[0]
    amax = s.x.float().abs().amax()
    assert s.w.input_scale is not None and float(s.w.input_scale) == pytest.approx(float(amax) / (6 * 448), rel=1e-6)
    p = Problem.dense(64, 256, "nvfp4", a_fmt="nvfp4")
    ref = inputs.reference(p, s)
    ref16 = s.x.double() @ s.w.dequantize(torch.float64).T
    rel = float((ref - ref16).norm() / ref16.norm())
    assert 0.02 < rel < 0.3, rel           # FP4 activations: far beyond bench's 1e-2 bf16 tolerance
    assert inputs.TOLERANCE["bf16"] == 1e-2


# ---- interpreter: activation quantizer (bit-exact) and MXFP4 GEMM ----------------------------------

_INTERP = textwrap.dedent("""
    import json, sys, torch
    from autotune.core.formats import quantize, quantize_activation_nvfp4
    from autotune.core.problem import Problem
    from autotune.core.arch import ARCHS
    from autotune.core.tactic import Tactic
    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.tactics.triton_fp4.args import pack_u8
    from autotune.tactics.triton_fp4.family import TritonFamily

    import triton, triton.language as tl
    from autotune.tactics.triton_fp4.w4a4_kernels import e4m3_rne

    @triton.jit
    def rne(s_ptr, b_ptr, v_ptr, n, BLOCK: tl.constexpr):
        o = tl.arange(0, BLOCK)
        b, v = e4m3_rne(tl.load(s_ptr + o, mask=o < n, other=1.0))
        tl.store(b_ptr + o, b.to(tl.uint8), mask=o < n)
        tl.store(v_ptr + o, v, mask=o < n)

    # e4m3 rounding on every code in [2^-9, 448], every midpoint (ties) and their fp32 neighbours
    codes = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (codes[:-1] + codes[1:]) / 2
    sv = torch.cat([codes, mids, torch.nextafter(mids, mids * 2), torch.nextafter(mids, mids * 0)])
    bb, vv = torch.empty(len(sv), dtype=torch.uint8), torch.empty(len(sv))
    rne[(1,)](sv, bb, vv, len(sv), BLOCK=1024)
    want = sv.to(torch.float8_e4m3fn)
    res = {"quant": [], "gemm": [], "rne": [int((bb != want.view(torch.uint8)).sum()), int((vv != want.float()).sum()), len(sv)]}
    torch.manual_seed(0)
    # activation quantizer vs autotune/formats.py: rows over 10 decades (e4m3 subnormal scales),
    # zero blocks, exact rounding bounds and ties, values past 6
    m, k = 45, 512
    x = torch.randn(m, k) * torch.logspace(-6, 3, m)[:, None]
    x[3, :32] = 0
    x[7] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, 6.0, 7.0, -7.0, 0.0, -0.0, 1.0, 0.5] * 32)
    x = x.to(torch.bfloat16)
    for fmt in ("nvfp4", "mxfp4"):
        for isc in ([float(x.float().abs().amax()) / 2688, 1.0, 3e-4] if fmt == "nvfp4" else [None]):
            p = Problem.dense(64, k, fmt, a_fmt=fmt)
            t = Tactic("triton", kernel="w4a4_dot_scaled", block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=2)
            kern = TritonFamily().build(p, t, "cpu")
            w = quantize(torch.randn(64, k), fmt)
            if isc is not None:
                w.input_scale = torch.tensor(isc, dtype=torch.float32)
            q, s = kern.quantize(x, w)
            if fmt == "nvfp4":
                rq, rs = quantize_activation_nvfp4(x, w.input_scale)
            else:
                r = quantize(x, "mxfp4"); rq, rs = r.packed, r.scales
            sb, rsb = s.view(torch.uint8), rs.view(torch.uint8)
            res["quant"].append([fmt, isc, int((q != rq).sum()), int((sb != rsb).sum()), len(set(rsb.flatten().tolist()))])
    # MXFP4 W4A4 through the family (interpreter) vs float64 on the dequantized quantized activations
    for m, n, k, cfgs in json.loads(sys.argv[1]):
        p = Problem.dense(n, k, "mxfp4", a_fmt="mxfp4")
        s = inputs.make_inputs(p, m, "cpu", seed=11)[0]
        ref = inputs.reference(p, s)
        for bm, bn, bk in cfgs:
            t = Tactic("triton", kernel="w4a4_dot_scaled", block_m=bm, block_n=bn, block_k=bk, num_warps=4, num_stages=2)
            fam = TritonFamily()
            assert fam.verdict(p, t, ARCHS["cpu"]).ok
            kern = fam.build(p, t, "cpu")
            y = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
            assert kern(s.x, s.w, out=y) is y
            err = float((y.double() - ref).norm() / ref.norm())
            u8 = bool(torch.equal(kern(s.x, pack_u8(s.w)), y))       # the family's prepacked layout
            res["gemm"].append([m, n, k, bm, bn, bk, int(torch.isnan(y).sum()), err, kern.includes_activation_quant, u8])
    print(json.dumps(res))
""")


@pytest.mark.skipif(_triton_version() < (3, 9), reason="interpreter checks are validated on Triton >= 3.9")
def test_interpreter_activation_quant_and_mxfp4_gemm():
    cases = [[21, 64, 512, [[16, 32, 128], [32, 64, 256]]], [5, 48, 256, [[16, 32, 128]]]]
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP, json.dumps(cases)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(res["quant"]) == 4 and len(res["gemm"]) == 3
    assert res["rne"] == [0, 0, 126 + 3 * 125], res["rne"]       # e4m3 round-to-nearest-even == torch's cast
    for fmt, isc, dq, ds, distinct in res["quant"]:
        assert dq == 0 and ds == 0, f"{fmt} input_scale={isc}: {dq} packed / {ds} scale bytes differ from formats.py"
        assert distinct > 20, (fmt, isc, distinct)      # the sample spans many scale codes
    for m, n, k, bm, bn, bk, nan, err, incl, u8 in res["gemm"]:
        assert m % bm or n % bn, "the sample must exercise masking"
        assert nan == 0 and err < 5e-3, (m, n, k, bm, bn, bk, nan, err)     # bf16 output rounding only
        assert incl is True and u8 is True


def test_launcher_input_checks():
    import torch

    from autotune.core.formats import quantize
    p = Problem.dense(32, 256, "nvfp4", a_fmt="nvfp4")
    kern = FAM.build(p, FAM.default(p, ARCHS["cpu"]), "cpu")
    w = quantize(torch.randn(32, 256), "nvfp4")
    assert w.input_scale is None and float(w4a4.input_scale_of(w)) == 1.0   # cutlass/cublaslt's convention
    with pytest.raises(ValueError, match="does not match the problem's nvfp4"):
        kern(torch.randn(4, 256).to(torch.bfloat16), quantize(torch.randn(32, 256), "mxfp4"))
    w.input_scale = torch.tensor(0.01)
    with pytest.raises(ValueError, match=r"bf16 \[M, 256\]"):
        kern(torch.randn(4, 128).to(torch.bfloat16), w)


# ---- cross-compiling (Triton 3.9): smem/tmem model == compiler, native instructions ----------------

needs39 = pytest.mark.skipif(_triton_version()[:2] != (3, 9), reason="the W4A4 smem model is fitted on Triton 3.9")
TARGETS = ("sm89", "sm90", "sm100", "sm120", "sm121")


def _sample(fmt: str, arch: str, n: int = 3) -> list[Tactic]:
    space = FAM.enumerate(Problem.dense(4096, 4096, fmt, a_fmt=fmt), get_arch(arch))
    return random.Random(f"w4a4-{fmt}-{arch}-3").sample(space, n)


CASES = [(fmt, arch, t) for arch in TARGETS for fmt in ("nvfp4", "mxfp4") for t in _sample(fmt, arch)]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("triton-cache-w4a4"))


@needs39
@pytest.mark.parametrize("fmt,arch,tactic", CASES, ids=[f"{a}-{f}-{t.id}" for f, a, t in CASES])
def test_model_equals_compiler(fmt, arch, tactic, cache):
    ck = cross_compile(fmt, tactic.params, arch, cache_dir=cache)
    a = get_arch(arch)
    assert smem_w4a4.smem_bytes(tactic.params, fmt, a) == int(ck.metadata.shared), (arch, fmt, tactic.params)
    assert smem_w4a4.tmem_columns(tactic.params, fmt, a) == int(getattr(ck.metadata, "tmem_size", 0) or 0)


@needs39
@pytest.mark.parametrize("arch,needle", [("sm120", "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X"),
                                         ("sm100", "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16")])
def test_nvfp4_is_native_and_model_exact(arch, needle, cache):
    """NVFP4 W4A4 lowers to the FP4 tensor-core instruction; the verdict's smem (and sm100's tmem)
    is the compiled figure; precompile() (the search's path) returns it too."""
    t = Tactic("triton", kernel="w4a4_dot_scaled", block_m=128, block_n=128, block_k=256, num_warps=4, num_stages=2)
    ck = cross_compile("nvfp4", t.params, arch, stop_at="cubin", cache_dir=cache)
    import re
    mmas = set(re.findall(r"(?:mma\.sync|tcgen05\.mma|wgmma\.mma_async)[\w.:]*", ck.asm["ptx"]))
    assert len(mmas) == 1 and needle in mmas.pop()        # the FP4 instruction only, no bf16 fallback
    v = FAM.verdict(W4A4_NV, t, get_arch(arch))
    assert v.ok and v.smem_bytes == int(ck.metadata.shared)
    if arch == "sm100":
        assert smem_w4a4.tmem_columns(t.params, "nvfp4", get_arch(arch)) == ck.metadata.tmem_size == 256
    from triton import knobs
    old = knobs.cache.dir
    knobs.cache.dir = cache
    try:
        assert FAM.precompile(W4A4_NV, t, get_arch(arch)) == int(ck.metadata.shared)
    finally:
        knobs.cache.dir = old


@needs39
def test_activation_quantizer_compiles_everywhere(cache):
    """The quantizer is one fixed tile: small shared memory on every target, correctly-rounded
    division (div.rn), and NVFP4's fails nowhere that the GEMM runs."""
    for arch in TARGETS + ("sm80",):
        for fmt in ("nvfp4", "mxfp4"):
            ck = compile_kernel(*w4a4.quant_source(fmt), arch, stop_at="cubin", cache_dir=cache)
            assert int(ck.metadata.shared) <= 16384 and "div.rn.f32" in ck.asm["ptx"], (arch, fmt)


# ---- real hardware ---------------------------------------------------------------------------------

def _gpu_check(fmt: str, problems=((3072, 6144), (512, 1536))):
    import torch

    from autotune.core import inputs
    from autotune.engine import timing

    from autotune.core.arch import detect
    arch = detect()
    for n, k in problems:
        p = Problem.dense(n, k, fmt, a_fmt=fmt)
        kept = [t for t in FAM.enumerate(p, arch) if FAM.verdict(p, t, arch).ok]
        assert kept
        for m in (1, 37, 256):
            s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
            ref = inputs.reference(p, s)
            for t in kept[:: max(1, len(kept) // 12)]:
                kern = FAM.build(p, t, "cuda")
                y = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                kern(s.x, s.w, out=y)
                torch.cuda.synchronize()
                err = float((y.double() - ref).norm() / ref.norm())
                assert not torch.isnan(y).any() and err < 5e-3, (fmt, n, k, m, t, err)
                if _triton_version() == (3, 9):     # the version the model is fitted on
                    assert kern.smem_compiled == FAM.verdict(p, t, arch).smem_bytes, (t, kern.smem_compiled)
            # our quantizer on the GPU == the torch reference on the GPU
            q, sc = kern.quantize(s.x, s.w)
            r = inputs.quantize_activations(p, s.x, s.w)
            assert torch.equal(q, r.packed) and torch.equal(sc.view(torch.uint8), r.scales.view(torch.uint8))


@pytest.mark.gpu
def test_gpu_mxfp4_w4a4():
    _gpu_check("mxfp4")


@pytest.mark.gpu
def test_gpu_nvfp4_w4a4_where_kept():
    """On the H200 (Triton 3.6) every NVFP4 config is rejected by the compat table: nothing runs."""
    from autotune.core.arch import detect
    arch = detect()
    if not any(FAM.verdict(W4A4_NV, t, arch).ok for t in FAM.enumerate(W4A4_NV, arch)):
        pytest.skip(f"NVFP4 W4A4 does not compile on {arch.name} with this Triton (compat table)")
    _gpu_check("nvfp4")


@pytest.mark.requires_sm100
def test_sm100_native_nvfp4_w4a4():
    _gpu_check("nvfp4")


@pytest.mark.requires_sm120
def test_sm120_native_nvfp4_w4a4():
    _gpu_check("nvfp4")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_search_inputs_and_reference_quantize_the_activations(fmt):
    # the search's check (autotune.core.inputs) must judge a W4A4 kernel against quantized activations
    import torch

    from autotune.core import inputs
    p = Problem.dense(256, 512, fmt, a_fmt=fmt)
    s = inputs.make_inputs(p, 8, "cpu", seed=3)[0]
    assert (s.w.input_scale is not None) == (fmt == "nvfp4")
    ref = inputs.reference(p, s)
    # spelled out with autotune.core.formats: dequant(quant(x)) · dequant(W)ᵀ in float64
    from autotune.core.formats import FP4Weight, quantize, quantize_activation_nvfp4
    if fmt == "nvfp4":
        q, sc = quantize_activation_nvfp4(s.x, s.w.input_scale)
        xa = FP4Weight(q, sc, s.w.input_scale, "nvfp4").dequantize(torch.float64)
    else:
        xa = quantize(s.x, "mxfp4").dequantize(torch.float64)
    assert torch.equal(ref, xa @ s.w.dequantize(torch.float64).T)
    plain = s.x.double() @ s.w.dequantize(torch.float64).T
    assert 0.03 < float((ref - plain).norm() / plain.norm()) < 0.3     # the activation rounding is the problem's
