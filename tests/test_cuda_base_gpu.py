"""The cuda kernels' texts composed from shared parts against the base commit's texts (f4cc350,
tests/data/cuda_base) on a CUDA GPU with CuPy (skipped elsewhere): the same inputs through the same
launcher, once with each text, give the same bits. tools/cuda_sass_same.py compares the SASS on the
CPU; these run the configs whose SASS it finds different (in a refactor: the register allocation
and the schedule, not the arithmetic): the default and a spread of the kept tactics of each kernel,
each epilogue, NVFP4 and MXFP4, at M = 1, 4, 16 and 64 (both routes)."""
import importlib.util

import pytest
import torch

from autotune.core import inputs
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy not installed"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

E, TOP_K = 256, 8
MOE = {"w13": (512, 6144, "swiglu"), "w13n": (512, 6144, "none"), "w2": (6144, 256, "reduce")}
DENSE = {"gate_up": (3072, 6144, "swiglu"), "down": (6144, 1536, "none"), "shared_down": (6144, 256, "none")}


def _fam():
    from autotune.tactics import registry
    return registry.get("cuda")


def _spread(prob, want):
    from autotune.core.arch import detect
    from autotune.tactics.cuda import moe as MOE_
    fam, arch = _fam(), detect()
    kept = [t for t in fam.enumerate(prob, arch)
            if (MOE_.verdict(prob, t, arch).ok if MOE_.is_moe(t) else fam.verdict_checked(prob, t, arch).ok is not False)]
    pick = [fam.default(prob, arch)]
    for w in want:
        t = next((t for t in kept if all(t.params.get(k) == v for k, v in w.items()) and t not in pick), None)
        if t is not None:
            pick.append(t)
    return pick


def _both_texts(run, monkeypatch):
    """run() with the current texts, then with the base commit's: both outputs."""
    from autotune.tactics.cuda import build as B
    from tools import cuda_sass_same as S
    B._LOADED.clear()
    new = run()
    monkeypatch.setattr(B, "source_text", S.base_text)
    B._LOADED.clear()
    old = run()
    monkeypatch.undo()
    B._LOADED.clear()
    return new, old


def _differing(prob, tactics, calls, monkeypatch):
    """Every tactic on every (M, arguments) call with each text: those whose bits differ."""
    fam, fails = _fam(), []
    for m, args in calls:
        for t in tactics:
            def run():
                out = fam.build(prob, t, "cuda")(*args)
                torch.cuda.synchronize()
                return out
            new, old = _both_texts(run, monkeypatch)
            if not torch.equal(new.view(torch.int16), old.view(torch.int16)):
                fails.append(f"{prob.key} M={m} {t}")
    return fails


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("name", sorted(MOE))
def test_grouped_kernels_give_the_base_texts_bits(name, fmt, monkeypatch):
    n, k, epi = MOE[name]
    prob = Problem.moe(n, k, E, TOP_K, fmt, epilogue=epi)
    fam = _fam()
    w = inputs.seeded_weight(prob, "cuda", 11)
    packed = fam.pack("cuda-mma-a-frag-v1", w)
    tactics = _spread(prob, [dict(split_k=2), dict(split_k=8), dict(m_tiles=2), dict(tiles_n=4),
                             dict(tiles_n=2, stages=2), dict(kernel="moe_tok"), dict(kernel="moe_tok", warps_k=1)])
    if epi == "reduce":
        tactics.append(Tactic("cuda", kernel="moe_mma", warps_k=2, stages=2, tiles_n=2, m_tiles=1, split_k=1, n_walk=4))
    calls = []
    for m in (1, 4, 16, 64):
        ids, tw = inputs.routing(m, E, TOP_K, torch.Generator().manual_seed(m), skew=1.2)
        if m > 1:
            ids[m // 2, 3] = -1
        lead = (m, TOP_K) if epi == "reduce" else (m,)      # w2 reads one row per (token, slot)
        x = torch.randn(*lead, k, device="cuda").to(torch.bfloat16)
        calls.append((m, (x, packed, ids.cuda(), tw.cuda() if epi == "reduce" else None)))
    fails = _differing(prob, tactics, calls, monkeypatch)
    assert not fails, "\n".join(fails)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("name", sorted(DENSE))
def test_dense_kernel_gives_the_base_texts_bits(name, fmt, monkeypatch):
    n, k, epi = DENSE[name]
    prob = Problem(kind="dense", a_fmt="bf16", w_fmt=fmt, out_dtype="bf16", n=n, k=k, epilogue=epi)
    fam = _fam()
    w = inputs.seeded_weight(prob, "cuda", 13)
    packed = fam.pack("cuda-mma-a-frag-v1", w)
    tactics = _spread(prob, [dict(split_k=2), dict(split_k=4), dict(warps_k=1), dict(tiles_n=2), dict(stages=2)])
    calls = [(m, (torch.randn(m, k, device="cuda").to(torch.bfloat16), packed)) for m in (1, 4, 16, 64)]
    fails = _differing(prob, tactics, calls, monkeypatch)
    assert not fails, "\n".join(fails)
