"""cuBLASLt family: verdicts, serialization of the 96-byte heuristic result, every message."""
from __future__ import annotations

import json
import struct

import pytest

from autotune.core.problem import Problem
from autotune.tactics import cublaslt as cl
from autotune.tactics import registry
from autotune.core.arch import ARCHS, get_arch
from autotune.core.tactic import Tactic

FAM = cl.CublasLtFamily()
BF16 = Problem.from_key("dense:bf16*bf16->bf16:n4096:k6144")
FP8 = Problem.from_key("dense:fp8*fp8->bf16:n4096:k6144")
NVFP4 = Problem.dense(4096, 6144)


def raw_result(algo_words=(1, 2, 3, 4, 5, 6, 7, 8), ws=1 << 20, state=0, waves=1.5) -> bytes:
    return struct.pack("<8QQif4i", *algo_words, ws, state, waves, 0, 0, 0, 0)


def a_tactic(**kw) -> Tactic:
    p = {"algo_id": 66, "tile": "(128, 256, 64)", "stages": "(64, 3)", "split_k": 1, "reduction_scheme": "NONE",
         "cta_swizzling": 0, "custom_option": 0, "inner_shape": "UNDEFINED", "cluster_shape": "(1, 1, 1)",
         "algo": raw_result().hex(), "cublas": "130200"}
    return Tactic("cublaslt", {**p, **kw})


def test_heuristic_result_layout():
    r = cl.HeuristicResult.from_bytes(raw_result())
    assert len(r.algo) == cl.ALGO_BYTES == 64
    assert (r.workspace_size, r.state, r.waves_count) == (1 << 20, 0, 1.5)
    with pytest.raises(ValueError, match="96 bytes"):
        cl.HeuristicResult.from_bytes(b"\0" * 64)


def test_tactic_round_trips_byte_exact():
    t = a_tactic()
    back = Tactic.from_json(t.to_json())
    assert back == t and back.id == t.id
    assert cl.decode(back["algo"]) == raw_result()
    assert FAM.validate(back) is None and registry.validate("cublaslt", back.params) is None


def test_nvmath_algorithm_round_trip_without_a_gpu():
    pytest.importorskip("nvmath")
    import numpy as np
    from nvmath.bindings import cublasLt
    arr = np.frombuffer(raw_result(), dtype=cublasLt.matmul_heuristic_result_dtype)
    assert arr.nbytes == cl.HEURISTIC_BYTES
    alg = cl.algorithm_from_tactic(a_tactic())
    back = alg.as_numpy()
    assert back.tobytes()[:64] == raw_result()[:64]                # the algorithm struct, byte-exact
    assert int(back["workspace_size"][0]) == cl.REPLAY_WORKSPACE      # 1 MiB stored, raised for replay
    big = a_tactic(algo=raw_result(ws=64 << 20).hex())
    assert int(cl.algorithm_from_tactic(big).as_numpy()["workspace_size"][0]) == 64 << 20


@pytest.mark.parametrize("change, msg", [
    (dict(algo="zz"), "not hex"), (dict(algo="00" * 64), "96 bytes"), (dict(cublas=""), "cuBLASLt version"),
    (dict(split_k="1"), "split_k must be int"), (dict(algo=cl.HEURISTIC), "carries no configuration"),
])
def test_validate_messages(change, msg):
    assert msg in FAM.validate(a_tactic(**change))


@pytest.mark.parametrize("problem, arch, ok, msg", [
    (BF16, "sm90", None, "unknown until cuBLASLt checks it on the device"),
    (FP8, "sm90", None, "unknown until cuBLASLt checks it on the device"),
    (FP8, "sm86", False, "SM86: cuBLASLt FP8 needs compute capability 8.9+"),
    (NVFP4, "sm90", False, "SM90: cuBLASLt NVFP4 block scaling needs compute capability 10.0+"),
    (NVFP4, "sm100", None, "unknown until cuBLASLt checks it"),
    (NVFP4, "sm120", None, "without saying whether SM12x has kernels"),
    (NVFP4, "cpu", False, "no CUDA GPU"),
    (Problem.dense(4096, 6144, w_fmt="mxfp4"), "sm100", False, "no MXFP4 scaling mode"),
    (Problem.moe(4096, 6144, 256, 8), "sm100", False, "dense GEMMs only"),
    (Problem.dense(4096, 6144, out_dtype="fp32"), "sm100", False, "writes bf16"),
    (Problem.dense(4000, 6144), "sm100", False, "NVFP4 needs N % 128 == 0"),
])
def test_verdicts(problem, arch, ok, msg):
    a = ARCHS["cpu"] if arch == "cpu" else get_arch(arch)
    v = FAM.verdict(problem, a_tactic(), a)
    assert v.ok is ok and msg in v.reason


def test_planning_without_the_device_lists_the_heuristic_placeholder():
    ts = FAM.enumerate(NVFP4, get_arch("sm120"))
    assert ts == [cl.heuristic_tactic()]
    v = FAM.verdict(NVFP4, ts[0], get_arch("sm120"))
    assert v.ok is None and "unknown until" in v.reason
    assert FAM.enumerate(NVFP4, get_arch("sm90")) == []         # ruled out by the docs: nothing to list
    assert FAM.default(NVFP4, get_arch("sm100")) == cl.heuristic_tactic()


@pytest.mark.parametrize("device, msg", [("cpu", "no CUDA GPU: cuBLASLt runs on a GPU only")])
def test_available_messages(device, msg):
    assert FAM.available(device) == (False, msg)


def test_available_without_nvmath(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_nvmath(name, *a, **kw):   # the import machinery is the real one; only nvmath is hidden
        if name == "nvmath" or name.startswith("nvmath."):
            raise ImportError("hidden for this test")
        return real(name, *a, **kw)
    monkeypatch.setattr(builtins, "__import__", no_nvmath)
    assert FAM.available("cuda") == (False, cl._NO_NVMATH)


def test_available_when_cublaslt_cannot_load():
    pytest.importorskip("nvmath")
    import torch
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    ok, why = FAM.available("cuda")
    assert not ok and why.startswith("cuBLASLt could not be loaded")


def test_build_refuses_another_cublas_version():
    pytest.importorskip("nvmath")
    try:
        live = cl.cublas_version()
    except Exception:
        pytest.skip("cuBLASLt not loadable here")
    with pytest.raises(RuntimeError, match="cannot be replayed"):
        FAM.build(BF16, a_tactic(cublas=live + "0"), "cuda")


def test_depends_on_keys_the_cublas_version():
    assert "cublas" in FAM.depends_on
    from autotune.core.env import current
    assert "cublas" in current().lib_versions(FAM.depends_on)


@pytest.mark.gpu
def test_live_enumeration_serialization_and_replay():
    import torch
    ok, why = FAM.available("cuda")
    if not ok:
        pytest.skip(why)
    from autotune.core.arch import detect
    arch = detect()
    ts = FAM.enumerate(BF16, arch)
    assert ts and all(t["algo"] != cl.HEURISTIC for t in ts)
    x, w = cl.operands(BF16, 256, "cuda")
    ref = x.float() @ w.float().T
    ran = 0
    for t in ts[:6]:
        t2 = Tactic.from_json(json.loads(json.dumps(t.to_json())))
        try:
            y = FAM.build(BF16, t2, "cuda")(x, w)
        except RuntimeError as e:          # an algorithm listed at another M may not support this one
            assert "cuBLASLt" in str(e)
            continue
        ran += 1
        assert float((y.float() - ref).norm() / ref.norm()) < 1e-2
    assert ran
    torch.cuda.synchronize()


# ---- weight layout: swizzled once at load -----------------------------------------------

def _weight(n=256, k=256):
    import torch
    from autotune.core.formats import quantize
    return quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(0)), "nvfp4")


def test_layout_and_pack_round_trip():
    import torch
    from autotune.runtime.bound import extra_bytes
    w = _weight(n=200)
    t = a_tactic()
    assert FAM.layout(t) == "swizzled-128x4"
    sw = FAM.pack(FAM.layout(t), w)
    assert sw.packed.data_ptr() == w.packed.data_ptr()
    assert torch.equal(sw.linear_scales().view(torch.uint8), w.scales.view(torch.uint8))


def test_launcher_does_not_swizzle_the_packed_weight_per_call(swizzle_calls):
    """The operands of five calls: the activation's scales are swizzled each call (they are new),
    the weight's never (before: both, on every call)."""
    import torch
    p = Problem.dense(256, 256)
    w = _weight()
    sw = FAM.pack("swizzled-128x4", w)
    launcher = cl.Launcher(p, a_tactic())                     # plans nothing until the first call
    x = torch.randn(128, 256).to(torch.bfloat16)
    swizzle_calls.clear()
    for _ in range(5):
        a, b, opts, scales = cl._quantize_operands(p, x, launcher.weight(sw))
    assert swizzle_calls == [(128, 16)] * 5                   # activation scales only
    assert scales["b"].data_ptr() == sw.scales.data_ptr()     # the packed bytes themselves
    assert b.data_ptr() == w.packed.data_ptr() and opts["alpha"] == float(w.global_scale)


def test_launcher_reads_the_weight_scalars_once_per_weight(monkeypatch):
    """float() of the weight's global / input scale is a device sync: once per weight, not per call."""
    import torch
    made = []
    real = cl.nvfp4_weight
    monkeypatch.setattr(cl, "nvfp4_weight", lambda w: made.append(w) or real(w))
    p, sw = Problem.dense(256, 256), FAM.pack("swizzled-128x4", _weight())
    launcher, x = cl.Launcher(p, a_tactic()), torch.randn(128, 256).to(torch.bfloat16)
    for _ in range(5):
        cl._quantize_operands(p, x, launcher.weight(sw))
    assert made == [sw]


def test_launcher_swizzles_a_plain_weight_once(swizzle_calls):
    launcher, w = cl.Launcher(Problem.dense(256, 256), a_tactic()), _weight()
    for _ in range(5):
        launcher.weight(w)
    assert swizzle_calls == [(256, 16)]


def test_mismatched_weight_is_refused_once_where_it_arrives():
    sw = FAM.pack("swizzled-128x4", _weight(n=128))
    with pytest.raises(ValueError, match=r"weight packed 128x128 does not match the problem's 256x128"):
        cl.Launcher(Problem.dense(256, 256), a_tactic()).weight(sw)
    with pytest.raises(ValueError, match="does not match the problem's"):
        FAM.bind(Problem.dense(256, 256), a_tactic(), sw, "cuda")


@pytest.mark.gpu
@pytest.mark.requires_sm100
def test_nvfp4_bound_launcher_matches_the_unbound_one():
    import torch
    ok, why = FAM.available("cuda")
    if not ok:
        pytest.skip(why)
    x, w = cl.operands(NVFP4, 256, "cuda")
    t = cl.heuristic_tactic()
    y = FAM.build(NVFP4, t, "cuda")(x, w)
    y_bound = FAM.bind(NVFP4, t, FAM.pack(FAM.layout(t), w), "cuda")(x)
    assert (y_bound == y).all()
    ref = x.float() @ w.dequantize(torch.float32).T
    assert float((y.float() - ref).norm() / ref.norm()) < 0.25   # W4A4: activations quantized too
