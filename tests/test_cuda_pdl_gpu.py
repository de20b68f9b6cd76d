"""Programmatic dependent launch on a CUDA GPU (sm_90+, CuPy and cuda-bindings; skipped elsewhere):
a chain of the cuda family's kernels as GLM-5 TP8 runs them (moe_mma w13:swiglu -> w2:reduce ->
w4a16_mma gate_up:swiglu -> down, an RMS norm, the next layer reading its output), launched with PDL
and without, eager and as one CUDA graph: the same bits every way. And the weights a torch kernel
writes just before a PDL launch are the ones it reads (its L2 prefetch runs before its wait)."""
import dataclasses
import importlib.util

import pytest
import torch

from autotune.core import inputs
from autotune.core.problem import Problem

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy not installed"),
              pytest.mark.skipif(importlib.util.find_spec("cuda") is None, reason="cuda-bindings not installed"),
              pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                                 reason="no sm_90+ CUDA device")]

E, TOP_K, H, I = 256, 8, 6144, 256
PROBS = {"w13": Problem.moe(2 * I, H, E, TOP_K, epilogue="swiglu"), "w2": Problem.moe(H, I, E, TOP_K, epilogue="reduce"),
         "gate_up": Problem.dense(2 * I, H, epilogue="swiglu"), "down": Problem.dense(H, I)}


def _fam():
    from autotune.tactics import registry
    return registry.get("cuda")


def _tactic(p, split: bool):
    from autotune.core.arch import detect
    fam, arch = _fam(), detect()
    from autotune.tactics.cuda.checked import awaiting_record     # these tests are part of the kernels' check
    kept = [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok or awaiting_record(fam.verdict(p, t, arch))]
    return next((t for t in kept if (t.params.get("split_k", 1) > 1) == split), kept[0])


_PACKED: dict = {}


def _layers(n):
    """n layers' packed weights (two distinct sets, cycled: the chain's bits, not its bytes, matter)."""
    fam = _fam()
    out = []
    for i in range(n):
        key = i % 2
        if key not in _PACKED:
            _PACKED[key] = {name: fam.pack("cuda-mma-a-frag-v1", inputs.seeded_weight(p, "cuda", 11 + 4 * key + j))
                            for j, (name, p) in enumerate(PROBS.items())}
        out.append(_PACKED[key])
    return out


def _kernels(monkeypatch, pdl: str):
    monkeypatch.setenv("AUTOTUNE_PDL", pdl)
    fam = _fam()
    return {name: fam.build(p, _tactic(p, split=name in ("w13", "gate_up")), "cuda") for name, p in PROBS.items()}


def _step(ks, layers, x, ids, tw):
    for w in layers:
        h = ks["w13"](x, w["w13"], ids, None)                 # [M, top_k, I]
        r = ks["w2"](h, w["w2"], ids, tw)                     # [M, H]
        g = ks["gate_up"](r, w["gate_up"])                    # [M, I]
        x = torch.nn.functional.rms_norm(ks["down"](g, w["down"]), (H,))   # the next layer's input
    return x


def _runs(ks):
    """The launch kinds the chain's launchers used (pdl.PdlRun / pdl.CupyRun)."""
    from autotune.tactics.cuda import moe as MOE
    kinds = set()
    for k in ks.values():
        if isinstance(k.run, MOE.MoeLaunch):                  # grouped: _Packing -> MoeLaunch
            kinds |= {type(r) for r in k.run._runs.values()}
        else:                                                 # dense: _Packing -> Launch, a run per plan
            kinds |= {type(plan[0]) for plan in k.run._plans.values()}
    return kinds


@pytest.mark.parametrize("m", [1, 16])
def test_a_pdl_chain_gives_the_bits_of_plain_launches_eager_and_in_a_graph(monkeypatch, m):
    from autotune.tactics.cuda import pdl
    layers = _layers(6)
    ids, tw = inputs.routing(m, E, TOP_K, torch.Generator().manual_seed(m), skew=1.2)
    ids, tw = ids.cuda(), tw.cuda()
    x = (torch.randn(m, H, device="cuda") * 0.5).to(torch.bfloat16)
    plain = _kernels(monkeypatch, "0")
    ref = _step(plain, layers, x, ids, tw)
    assert _runs(plain) == {pdl.CupyRun}
    ks = _kernels(monkeypatch, "1")
    eager = _step(ks, layers, x, ids, tw)
    assert _runs(ks) == {pdl.PdlRun}
    torch.cuda.synchronize()
    assert torch.isfinite(ref.float()).all() and torch.equal(eager, ref)
    xs = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _step(ks, layers, xs, ids, tw)                        # warm: plans and scratch before capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = _step(ks, layers, xs, ids, tw)
    for _ in range(3):
        y.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, ref)


def test_weights_written_just_before_a_pdl_launch_are_read(monkeypatch):
    ks = _kernels(monkeypatch, "1")
    a, b = _layers(2)
    x = torch.randn(1, H, device="cuda").to(torch.bfloat16)
    want = ks["down"](ks["gate_up"](x, b["gate_up"]), b["down"])
    w = {k: dataclasses.replace(v, packed=v.packed.clone(), scales=v.scales.clone(), global_scale=v.global_scale.clone())
         for k, v in a.items()}
    got = []
    for _ in range(20):
        for name in ("gate_up", "down"):                      # a torch copy kernel, then the launch
            for dst, src in zip(_tensors(w[name]), _tensors(b[name])):
                dst.copy_(src)
        got.append(ks["down"](ks["gate_up"](x, w["gate_up"]), w["down"]))
        for name in ("gate_up", "down"):
            for dst, src in zip(_tensors(w[name]), _tensors(a[name])):
                dst.copy_(src)
    torch.cuda.synchronize()
    assert all(torch.equal(g, want) for g in got)


def _tensors(packed):
    return [packed.packed, packed.scales, packed.global_scale]
