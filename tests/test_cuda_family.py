"""The cuda family without a GPU: space, verdicts, registration without CuPy, and the compiled
resources (nvcc 13 on the CPU: shared memory equals the verdict's figure, no spills) and the
SASS instruction mix of the decode loop. Compiles a handful of configs (~0.4 s each)."""
import importlib.util
import re

import pytest

from autotune.core.arch import get_arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics import registry
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda.family import STATIC_SMEM_LIMIT, CudaFamily, m_tiles_for

FAM = CudaFamily()
TP8_GATE_UP = Problem.dense(3072, 6144)
TP8_DOWN = Problem.dense(6144, 1536)
NO_NVCC = pytest.mark.skipif(B.nvcc() is None, reason="nvcc not on PATH")


def test_registered_and_absent_cleanly_without_cupy():
    fam = registry.get("cuda")
    assert fam.name == "cuda" and fam.compiles
    assert fam.available("cpu")[0] is False
    ok, why = fam.available("cuda")
    if importlib.util.find_spec("cupy") is None:
        assert ok is False and "CuPy is not installed" in why
    # the verdict and space never import CuPy
    assert fam.enumerate(TP8_GATE_UP, get_arch("sm90"))


def _kept(v) -> bool:
    """Kept by the exact rules: `ok`, or `unknown` only until the kernel's code passes its GPU tests."""
    from autotune.tactics.cuda.checked import awaiting_record
    return v.ok is True or awaiting_record(v)


def test_space_and_verdicts():
    sm90 = get_arch("sm90")
    space = FAM.enumerate(TP8_GATE_UP, sm90)
    # the 32 tactics without split_k (their ids unchanged) + 36 split-K ones (split 2/4/8 x 3 x 2 x 2)
    plain = [t for t in space if "split_k" not in t.params]
    assert len(space) == 68 and len(plain) == 32
    kept = [t for t in plain if _kept(FAM.verdict(TP8_GATE_UP, t, sm90))]
    rejected = {t.id: FAM.verdict(TP8_GATE_UP, t, sm90) for t in plain if t not in kept}
    assert kept and rejected
    for v in rejected.values():
        assert "static shared memory" in v.reason and v.smem_bytes > STATIC_SMEM_LIMIT
    # K = 1536 is 12 k-pairs: warps_k 8 cannot split it evenly
    v = FAM.verdict(TP8_DOWN, Tactic("cuda", warps_k=8, stages=2, tiles_n=1), sm90)
    assert v.rejected and "128*warps_k=1024" in v.reason
    assert _kept(FAM.verdict(TP8_GATE_UP, Tactic("cuda", warps_k=4, stages=4, tiles_n=2), get_arch("sm120")))
    assert FAM.verdict(TP8_GATE_UP, Tactic("cuda", warps_k=4, stages=5, tiles_n=1), sm90).rejected   # not in schema
    assert FAM.supports(Problem.dense(3072, 6144, w_fmt="mxfp4")) is None       # MXFP4 too (docs section 8)
    assert FAM.supports(Problem.dense(3072, 6144, w_fmt="fp8"))
    assert FAM.supports(Problem.dense(3000, 6144))                                       # N % 16
    v = FAM.verdict(Problem.dense(16 * 3, 6144), Tactic("cuda", warps_k=1, stages=2, tiles_n=2), sm90)
    assert v.rejected and "tiles_n" in v.reason
    assert len(FAM.enumerate(Problem.dense(3072, 6144, w_fmt="mxfp4"), sm90)) == 68
    assert FAM.enumerate(Problem.dense(3072, 6144, a_fmt="nvfp4"), sm90) == []
    assert _kept(FAM.verdict(TP8_GATE_UP, FAM.default(TP8_GATE_UP, sm90), sm90))
    assert _kept(FAM.verdict(TP8_DOWN, FAM.default(TP8_DOWN, sm90), sm90))


def test_m_tiles():
    assert [m_tiles_for(m) for m in (1, 8, 9, 16, 17, 33, 64, 65, 4096)] == [1, 1, 2, 2, 4, 8, 8, 8, 8]


# a handful of configs: extremes of the space (largest smem kept, most registers, smallest ring)
_CONFIGS = [B.Config(1, 1, 2, 1), B.Config(8, 8, 4, 1), B.Config(2, 4, 6, 1), B.Config(4, 2, 3, 2),
            B.Config(1, 8, 2, 2)]


@NO_NVCC
@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
@pytest.mark.parametrize("cfg", _CONFIGS, ids=lambda c: f"mt{c.m_tiles}-wk{c.warps_k}-st{c.stages}-tn{c.tiles_n}")
def test_ptxas_agrees_with_the_verdict(arch, cfg):
    res = B.nvcc_resources(cfg, arch)
    assert res.smem == B.smem_bytes(cfg)
    assert not res.spills, f"{cfg} on {arch} spills: {res}"
    assert res.registers <= 255


def test_parse_ptxas_spills():
    log = ("ptxas info    : Function properties for w4a16_mma\n"
           "    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers, 18432 bytes smem, 400 bytes cmem[0]\n")
    r = B.parse_ptxas(log)
    assert (r.registers, r.smem, r.local, r.spill_stores) == (255, 18432, 16, 12) and r.spills


def test_cubin_key_changes_with_everything_that_matters():
    c = B.Config(1, 4, 4)
    keys = {B.cubin_key(c, "sm_90", (13, 0)), B.cubin_key(c, "sm_120", (13, 0)),
            B.cubin_key(c, "sm_90", (12, 8)), B.cubin_key(B.Config(2, 4, 4), "sm_90", (13, 0)),
            B.cubin_key(B.Config(1, 4, 4, 2), "sm_90", (13, 0))}
    assert len(keys) == 5


@NO_NVCC
def test_decode_instruction_mix():
    from tools.cuda_sass import cuobjdump, measure
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump in Triton's wheel")
    r = measure(B.Config(1, 4, 4), "sm_90", tool)
    mix, n = r["mix"], r["elements"]
    # one bf16x2 multiply per pair, one MMA per 8 elements at M <= 8: the layout's promise
    assert mix["HMUL2.BF16_V2"] + mix.get("HFMA2.BF16_V2", 0) == n // 2
    assert r["hmma_per_element"] == 1 / 8
    assert r["decode_per_element"] <= 1.8
    assert r["per_element"] < 3.0


def test_cupy_version_found_under_its_wheel_name(monkeypatch):
    from importlib import metadata

    from autotune.core import env

    def fake(name):
        if name == "cupy-cuda13x":
            return "14.2.0"
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(env.metadata, "version", fake)
    assert env._version("cupy") == "14.2.0"
    assert env._version("torch") is None
    assert "cupy" in FAM.depends_on


def test_cubin_cache_dir_from_settings(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE_CUDA_CUBINS", str(tmp_path))
    assert B.cache_dir() == tmp_path
    monkeypatch.setenv("AUTOTUNE_CUDA_CUBINS", " ")
    assert B.cache_dir().name == "cuda-cubins"


@pytest.mark.parametrize("problem, tactic", [
    (Problem.dense(128, 1536), Tactic("cuda", warps_k=8, stages=2, tiles_n=1)),   # K: 12 k-pairs over 8 warps
    (Problem.dense(16 * 3, 256), Tactic("cuda", warps_k=1, stages=2, tiles_n=2)),  # N: 3 row tiles over pairs
])
def test_build_and_bind_refuse_what_the_verdict_refuses(problem, tactic):
    """The kernel trusts the tiling (a K or N tail would be dropped silently): build and bind refuse
    it with the verdict's reason, before anything needs CuPy."""
    import torch
    from autotune.core.formats import quantize
    from autotune.tactics.cuda import layout as L
    v = FAM.verdict(problem, tactic, get_arch("sm90"))
    assert v.rejected
    with pytest.raises(ValueError, match=re.escape(v.reason)):
        FAM.build(problem, tactic, "cuda")
    packed = L.pack(quantize(torch.randn(problem.n, problem.k)))
    with pytest.raises(ValueError, match=re.escape(v.reason)):
        FAM.bind(problem, tactic, packed, "cuda")


def _shifted(t, by: int):
    """t's bytes copied to an address `by` bytes past an aligned allocation."""
    import torch
    flat = t.contiguous().view(torch.uint8).flatten()
    buf = torch.zeros(flat.numel() + 64, dtype=torch.uint8)
    v = buf[by:by + flat.numel()]
    v.copy_(flat)
    return v.view(t.shape)


@pytest.mark.parametrize("field, by", [("packed", 8), ("packed", 3), ("scales", 2)])
def test_misaligned_pack_refused(field, by):
    """The kernel's cp.async reads the words at 16 B and the scales at 4 B: a pack whose storage
    (e.g. wrapped over checkpoint tensors) sits elsewhere is refused in one line, bound or not."""
    import dataclasses

    import torch
    from autotune.core.formats import quantize
    from autotune.core.operands import OperandError
    from autotune.tactics.cuda import layout as L
    from autotune.tactics.cuda.family import _PackCache
    problem, tactic = Problem.dense(32, 256), Tactic("cuda", warps_k=1, stages=2, tiles_n=1)
    good = L.pack(quantize(torch.randn(problem.n, problem.k)))
    bad = dataclasses.replace(good, **{field: _shifted(getattr(good, field), by)})
    assert getattr(bad, field).data_ptr() % (16 if field == "packed" else 4)
    assert torch.equal(getattr(bad, field), getattr(good, field))                # same bytes, wrong address
    with pytest.raises(ValueError, match=f"{field} is at address .* not {16 if field == 'packed' else 4}-byte"):
        FAM.bind(problem, tactic, bad, "cuda")
    with pytest.raises(OperandError, match="aligned"):
        _PackCache()(bad)
    assert _PackCache()(good) is good
