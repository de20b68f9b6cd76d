"""Programmatic dependent launch, what runs without a GPU: the kernels' PTX carries the grid
dependency controls and the L2 prefetch on sm_90+ only (nvcc), the argument buffer is laid out as
the C signature declares (against ctypes' C layout) and both launchers give their kernel exactly
those arguments, and the setting. The launches themselves: tests/test_cuda_pdl_gpu.py."""
import ctypes
import importlib.util
import shutil
import struct
import subprocess

import numpy as np
import pytest
import torch

from autotune.core import inputs, settings
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import dense as D
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda import launch as LA
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda import pdl

DENSE = B.Config(1, 4, 2, tiles_n=2, split_k=4, swiglu=True)
GROUPED = B.MoeConfig(1, 4, 2, 2, 2, swiglu=True)
TOKEN = B.MoeConfig(1, 2, 8, 2, 1, reduce=True, token=True)       # moe_tok


def _ptx(c, arch):
    exe = shutil.which("nvcc")
    if exe is None:
        pytest.skip("nvcc not on PATH")
    r = subprocess.run([exe, "-ptx", f"-arch={arch}", "-x", "cu", "-o", "-", *B.options(c), "-"],
                       input=B.text(c), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.parametrize("c", [DENSE, GROUPED, TOKEN], ids=["dense", "grouped", "token"])
def test_sm90_ptx_waits_first_and_releases_sm80_has_neither(c):
    p90, p80 = _ptx(c, "sm_90"), _ptx(c, "sm_80")
    for op in ("griddepcontrol.wait", "griddepcontrol.launch_dependents"):
        assert op in p90 and op not in p80, op
    # the wait comes before any global load or store and any cp.async (the kernel reads nothing first)
    body = p90[p90.index(".entry"):]
    before = body[:body.index("griddepcontrol.wait")]
    assert "ld.global" not in before and "st.global" not in before and "cp.async" not in before


def test_the_grouped_weight_prologue_runs_after_the_rank_scan():
    """A CTA that does not lead fetches no weight: the first cp.async follows the rank scan's
    barrier (issued before it, the early prologue measured 0-9 % slower and was taken out)."""
    body = _ptx(GROUPED, "sm_90")
    body = body[body.index(".entry"):]
    assert body.index("bar.red.popc") < body.index("cp.async.cg.shared.global")
    assert "EARLY" not in B.defines(GROUPED) and "EARLY" not in B.text(GROUPED)


def test_signatures_parse_and_refuse_other_types():
    assert pdl.signature(B.text(DENSE), "w4a16_mma") == "@PPPPPiiiPP"
    assert pdl.signature(B.text(GROUPED), "moe_mma") == "@" + "P" * 12 + "i" * 11 + "PPii" + "PPii"
    with pytest.raises(ValueError, match="neither"):
        pdl.signature('extern "C" __global__ void k(float a, int* b)', "k")
    with pytest.raises(ValueError, match="no extern"):
        pdl.signature("", "k")


@pytest.mark.parametrize("fmt", ["@PPPPPiiiPP", "@" + "P" * 12 + "i" * 11 + "PPii" + "PPii"])
def test_the_buffer_layout_is_the_c_layout(fmt):
    fields = [(f"a{i}", ctypes.c_void_p if ch == "P" else ctypes.c_int) for i, ch in enumerate(fmt[1:])]
    S = type("S", (ctypes.Structure,), {"_fields_": fields})
    vals = [(0x1000 * (i + 1) + i) if ch == "P" else np.int32(-i) for i, ch in enumerate(fmt[1:])]
    c = S(*[int(v) for v in vals])
    assert pdl.offsets(fmt) == [getattr(S, f).offset for f, _ in fields]
    assert struct.pack(fmt, *vals) == bytes(c)[:struct.calcsize(fmt)]


class _Record:
    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, stream):
        self.calls.append((grid, block, tuple(args), stream))


def _check_args(calls, fmt):
    assert calls
    for grid, block, args, stream in calls:
        assert len(args) == len(fmt) - 1 and isinstance(stream, int)
        for a, ch in zip(args, fmt[1:]):           # pointers as Python ints, ints as NumPy int32
            assert (type(a) is int) if ch == "P" else (type(a) is np.int32), (a, ch)
        struct.pack(fmt, *args)


def test_both_launchers_pass_what_the_signature_declares(monkeypatch):
    rec = _Record()
    p = Problem.dense(512, 6144, epilogue="swiglu")
    t = Tactic("cuda", m_tiles=1, warps_k=4, stages=2, tiles_n=2, split_k=4)

    class Dense(LA.Launch):
        def function(self, m_tiles, dev):
            return m_tiles, None

        def _run(self, fn, c, dev):
            return rec

    real = LA.check_call
    monkeypatch.setattr(LA, "check_call", lambda *a: real(*a, cuda=False))
    from autotune.tactics.cuda.family import config
    w = L.pack(inputs.seeded_weight(p, "cpu", 1))
    x = torch.randn(3, p.k).to(torch.bfloat16)
    Dense(p, t, "cpu", config)(x, w, None)
    _check_args(rec.calls, pdl.signature(B.text(config(t, 1, p)), "w4a16_mma"))
    assert rec.calls[0][0] == (p.n // (L.ROWS * 2), 1, 4) and D.split_k(t) == 4

    rec.calls.clear()
    pm = Problem.moe(512, 6144, 16, 8, epilogue="swiglu")
    tm = Tactic("cuda", kernel="moe_mma", m_tiles=1, warps_k=4, stages=2, tiles_n=2, split_k=2)

    class Grouped(MOE.MoeLaunch):
        def check(self, x, w, ids, tw, out, **kw):
            return MOE.check_call(self.problem, x, w, ids, tw, out, cuda=False, **kw)

        def _run(self, dev):
            return rec

    wm = L.pack_experts(inputs.seeded_weight(pm, "cpu", 2).contiguous())
    ids = torch.randint(0, 16, (2, 8))
    Grouped(pm, tm, "cpu")(torch.randn(2, pm.k).to(torch.bfloat16), wm, ids, torch.rand(2, 8))
    _check_args(rec.calls, pdl.signature(B.text(MOE.config(pm, tm)), "moe_mma"))


def test_the_setting(monkeypatch):
    for v, on in (("", True), ("1", True), ("true", True), ("0", False), ("false", False)):
        monkeypatch.setenv(settings.PDL, v)
        assert settings.pdl() is on
    monkeypatch.setenv(settings.PDL, "yes")
    with pytest.raises(ValueError, match="AUTOTUNE_PDL"):
        settings.pdl()
    monkeypatch.setenv(settings.PDL, "0")
    assert pdl.available(0) is False                 # off: decided before any CUDA call


@pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-bindings not installed")
def test_a_pdl_run_builds_its_config_without_a_driver():
    r = pdl.PdlRun(0, "@PPi", "k")
    c = r._config((8, 4, 2), (128, 1, 1))
    assert (c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.numAttrs) == (8, 4, 2, 128, 1)
    from cuda.bindings import driver as cu
    assert c.attrs[0].id == cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert c.attrs[0].value.programmaticStreamSerializationAllowed == 1
