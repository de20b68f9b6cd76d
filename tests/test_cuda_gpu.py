"""The cuda family on a CUDA GPU with CuPy (skipped elsewhere): float64 check of a few configs
at GLM-5 TP8 shapes, the bound prepacked launcher under CUDA-graph capture, the resource gate; the
dense kernel's split-K and SwiGLU forms (float64, split order under replay and row chunks, a row's
bits independent of the batch, loaded resources = verdict) and FP4MLP on cuda tactics."""
import importlib.util

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import detect
from autotune.core.problem import Problem
from autotune.tactics import registry
from autotune.tactics.cuda.checked import awaiting_record

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy not installed")]


@pytest.mark.parametrize("p", [Problem.dense(3072, 6144), Problem.dense(6144, 1536), Problem.dense(6144, 256)],
                         ids=lambda p: p.key)
def test_configs_match_float64(p):
    fam, arch = registry.get("cuda"), detect()
    kept = [t for t in fam.enumerate(p, arch)      # unknown only for want of the record: these tests are its check
            if fam.verdict(p, t, arch).ok or awaiting_record(fam.verdict(p, t, arch))]
    assert kept
    for m in (1, 13, 64, 100):
        s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
        ref = inputs.reference(p, s)
        for t in kept[:: max(1, len(kept) // 4)]:
            assert inputs.check(p, fam.build(p, t, "cuda"), s, ref) < 1e-2


def test_bound_launcher_replays_in_a_graph():
    p = Problem.dense(3072, 6144)
    fam, arch = registry.get("cuda"), detect()
    t = fam.default(p, arch)
    w = inputs.make_inputs(p, 1, "cuda", seed=3)[0].w
    launch = fam.bind(p, t, fam.pack(fam.layout(t), w), "cuda")
    x = torch.randn(8, p.k, device="cuda").to(torch.bfloat16)
    y = torch.empty(8, p.n, dtype=torch.bfloat16, device="cuda")
    launch(x, out=y)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch(x, out=y)
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, launch(x))
    with pytest.raises(TypeError, match="packed weight"):
        fam.bind(p, t, w, "cuda")


def test_loaded_functions_do_not_spill():
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda.family import config
    p, fam, arch = Problem.dense(3072, 6144), registry.get("cuda"), detect()
    t = fam.default(p, arch)
    for mt in B.M_TILES:
        r = B.runtime_resources(B.load(config(t, mt), f"sm_{arch.cc_int}", 0))
        assert r["local_size_bytes"] == 0 and r["shared_size_bytes"] == B.smem_bytes(config(t, mt))


# ---- split-K, SwiGLU and MXFP4 -----
TP8 = {"shared_gate_up": (512, 6144), "gate_up": (3072, 6144), "down": (6144, 1536), "shared_down": (6144, 256)}


def _fits(p, t, fam, arch):
    from autotune.tactics.cuda.family import DENSE_UNRUN
    v = fam.verdict(p, t, arch)
    return v.ok is True or (v.ok is None and v.reason == DENSE_UNRUN)


def _new_forms(p, fam, arch, extra=5):
    """The problem's default and a spread of its kept split-K (and, on swiglu problems, all) tactics."""
    from autotune.tactics.cuda.dense import new_form
    kept = [t for t in fam.enumerate(p, arch) if _fits(p, t, fam, arch) and new_form(p, t)]
    pick = [t for t in (fam.default(p, arch),) if t in kept]
    for want in (dict(split_k=2), dict(split_k=4), dict(split_k=8), dict(tiles_n=2, stages=2), dict(warps_k=8)):
        t = next((t for t in kept if all(t.params.get(k) == v for k, v in want.items()) and t not in pick), None)
        if t is not None:
            pick.append(t)
    return (pick or kept)[:1 + extra]


@pytest.mark.parametrize("name, epi, fmt", [
    ("shared_gate_up", "none", "nvfp4"), ("shared_gate_up", "swiglu", "nvfp4"), ("gate_up", "swiglu", "nvfp4"),
    ("gate_up", "none", "nvfp4"), ("down", "none", "nvfp4"),
    ("shared_gate_up", "none", "mxfp4"), ("shared_gate_up", "swiglu", "mxfp4"), ("shared_down", "none", "mxfp4")])
def test_split_k_swiglu_and_mxfp4_match_float64(name, epi, fmt):
    """NaN-poisoned outputs (inputs.check), M = 1 (one M tile), 13, 64 and 100 (two 64-row tiles).
    (The shared down, K = 256, has 2 k-pairs: no split-K tactic of the space fits it; in MXFP4 its
    plain tactics are new.)"""
    fam, arch = registry.get("cuda"), detect()
    p = Problem.dense(*TP8[name], w_fmt=fmt, epilogue=epi)
    ts = _new_forms(p, fam, arch)
    assert ts, p.key
    fails = []
    for m in (1, 13, 64, 100):
        s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
        ref = inputs.reference(p, s)
        for t in ts:
            try:
                err = inputs.check(p, fam.build(p, t, "cuda"), s, ref)
            except Exception as e:  # noqa: BLE001 - every failing tactic is reported
                fails.append(f"M={m} {t}: {e}")
                continue
            if not err < 1e-2:
                fails.append(f"M={m} {t}: rel err {err:.3g}")
    assert not fails, "\n".join(fails)


def test_split_k_is_deterministic_replays_in_a_graph_and_chunks_bitwise(monkeypatch):
    """Split order, not arrival order: two calls give the same bits; a CUDA-graph replay equals the
    eager call; after release() the scratch is made again; a call cut into row chunks (workspace
    bound lowered) gives the same bits as one launch (each chunk takes the whole split)."""
    from autotune.tactics.cuda import dense as D
    fam, arch = registry.get("cuda"), detect()
    for epi in ("none", "swiglu"):
        p = Problem.dense(512, 6144, epilogue=epi)
        t = next(t for t in _new_forms(p, fam, arch) if t.params.get("split_k", 1) > 1)
        w = inputs.make_inputs(p, 1, "cuda", seed=5)[0].w
        launch = fam.bind(p, t, fam.pack(fam.layout(t), w), "cuda")
        assert launch.caps.capture_safe and launch.caps.batch_invariant
        x = torch.randn(200, p.k, device="cuda").to(torch.bfloat16)
        y = launch(x[:16])
        assert torch.equal(launch(x[:16]), y)
        g = torch.cuda.CUDAGraph()
        out = torch.empty_like(y)
        launch(x[:16], out=out)
        with torch.cuda.graph(g):
            launch(x[:16], out=out)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, y)
        whole = launch(x)
        launch.release()
        assert torch.equal(launch(x), whole)
        monkeypatch.setattr(D, "MAX_WORKSPACE_BYTES", 1)            # 64-row chunks: 4 launches for 200 rows
        chunked = fam.bind(p, t, fam.pack(fam.layout(t), w), "cuda")
        assert torch.equal(chunked(x), whole), p.key
        monkeypatch.undo()


def test_a_rows_result_does_not_depend_on_the_batch():
    """Every dense cuda tactic is declared batch-invariant: row 0's bits at M = 1, 64 and 100 (three
    M tiles, grid.y 1 and 2) are the same, with and without split-K and SwiGLU."""
    fam, arch = registry.get("cuda"), detect()
    for epi in ("none", "swiglu"):
        p = Problem.dense(512, 6144, epilogue=epi)
        s = inputs.make_inputs(p, 100, "cuda", seed=8)[0]
        ts = _new_forms(p, fam, arch, 3) + ([fam.default(p, arch)] if epi == "none" else [])
        for t in ts:
            assert fam.batch_invariant(p, t)
            kern = fam.build(p, t, "cuda")
            one = kern(s.x[:1], s.w)
            for m in (64, 100):
                assert torch.equal(kern(s.x[:m], s.w)[:1], one), (t, m)


def test_loaded_split_and_swiglu_variants_match_the_verdict():
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda.family import config
    fam, arch = registry.get("cuda"), detect()
    for p in (Problem.dense(512, 6144), Problem.dense(512, 6144, epilogue="swiglu")):
        for t in _new_forms(p, fam, arch):
            for mt in B.M_TILES:
                c = config(t, mt, p)
                try:
                    r = B.runtime_resources(B.load(c, f"sm_{arch.cc_int}", 0))   # load raises on a difference
                except B.SpillError:
                    continue                  # refused with its numbers; the launcher takes a smaller tile
                assert r["shared_size_bytes"] == B.smem_bytes(c) and r["local_size_bytes"] == 0


def test_fp4mlp_on_cuda_tactics_matches_float64_and_replays():
    """FP4MLP with both problems pinned to cuda tactics (the SwiGLU gate_up split-K, down plain):
    float64 at M = 1 and 16, and a CUDA-graph replay of the whole MLP equals the eager call."""
    import warnings

    from autotune.core.formats import quantize
    from autotune.runtime.dispatch import Dispatcher
    from autotune.runtime.nn import FP4MLP
    fam, arch = registry.get("cuda"), detect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(None, record_misses=False, warn=False)
    p13, p2 = Problem.dense(512, 6144, epilogue="swiglu"), Problem.dense(6144, 256)
    d.pin(p13, next(t for t in _new_forms(p13, fam, arch) if t.params.get("split_k", 1) > 1))
    d.pin(p2, fam.default(p2, arch))
    torch.manual_seed(0)
    gate, up, down = torch.randn(256, 6144) * 0.02, torch.randn(256, 6144) * 0.1, torch.randn(6144, 256) * 0.05
    from autotune.runtime.nn import _cat_rows
    g, u, dn = quantize(gate), quantize(up), quantize(down)             # on the CPU: the reference's bytes
    m = FP4MLP(_cat_rows(g, u).to("cuda"), dn.to("cuda"), up_scale=u.global_scale.cuda(), dispatcher=d)
    assert [d.rung_for(p, 1)[1].family for p in (p13, p2)] == ["cuda", "cuda"]
    for rows in (1, 16):
        x = torch.randn(rows, 6144)
        xd = x.to(torch.bfloat16).double()
        ref = (torch.nn.functional.silu(xd @ g.dequantize(torch.float64).T) * (xd @ u.dequantize(torch.float64).T)) \
            @ dn.dequantize(torch.float64).T
        y = m(x.cuda().to(torch.bfloat16))
        assert float((y.double().cpu() - ref).norm() / ref.norm()) < 1e-2
    x = torch.randn(4, 6144, device="cuda").to(torch.bfloat16)
    m.warmup([4])
    eager = m(x)
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        y = m(x)
    gr.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, eager)
    # the split-K workspace and counters came from the dispatcher's pool: a second
    # MLP on the same tactics adds no workspace, and gives the same rows for the same weights
    held = d.scratch.bytes_held()
    assert {k[2] for k in d.scratch.bufs} >= {"splitk.ws", "splitk.locks"}
    m2 = FP4MLP(_cat_rows(g, u).to("cuda"), dn.to("cuda"), up_scale=u.global_scale.cuda(), dispatcher=d)
    assert torch.equal(m2(x), eager) and d.scratch.bytes_held() == held
