"""Issue #15: the fused MoE problem variants (swiglu, reduce) and FP4MoE, the whole routed block.

On the CPU: the variants' keys, shapes and float64 reference; the torch family computing them;
FP4MoE (fused and unfused) against a float64 block built from separately quantized gate, up and
down weights, with an expert_map whose -1 slots contribute nothing; the search's own check of the
variants. In Triton's interpreter (one subprocess): moe_decode through the family's bound
launchers for each variant against core.inputs.reference, and FP4MoE with moe_decode winners in
a real cache (aligned route at both GEMMs with different BLOCK_M: one moe_align per forward).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.operands import OperandError, check_x
from autotune.core.problem import Problem
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE
from autotune.runtime.nn import FP4MoE as reexported
from autotune.tactics import registry

ROOT = Path(__file__).resolve().parents[1]
T = registry.get("torch")


@pytest.fixture
def disp(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["cpu"], record_misses=False, warn=False)


def test_variant_keys_shapes_and_checks():
    p = Problem.moe(512, 6144, 256, 8)
    s, r = p.variant("swiglu"), Problem.moe(6144, 256, 256, 8, epilogue="reduce")
    assert p.key == "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8"          # unchanged keys
    assert s.key == p.key + ":swiglu" and Problem.from_key(s.key) == s and Problem.from_key(r.key) == r
    assert s.out_n == 256 and "epilogue" not in s.to_dict()
    with pytest.raises(ValueError, match="grouped_moe variant"):
        Problem("dense", epilogue="reduce", n=8, k=16)            # dense takes swiglu (FP4MLP), not reduce
    with pytest.raises(ValueError, match="even N"):
        Problem.moe(63, 64, 4, 2, epilogue="swiglu")
    w = quantize(torch.randn(4, 6144, 256))
    with pytest.raises(OperandError, match=r"x is 3x256, expected M x 8 x 256 \(one row per token and slot\)"):
        check_x(r, torch.zeros(3, 256, dtype=torch.bfloat16), w)


@pytest.mark.parametrize("epi", ["swiglu", "reduce"])
def test_torch_family_variants_match_float64_with_minus_one(epi):
    p = Problem.moe(64, 128, 5, 3, epilogue=epi)
    s = inputs.make_inputs(p, 6, "cpu", seed=4)[0]
    s.topk_ids[1, 2] = -1
    s.topk_ids[4] = -1                                    # a token routed entirely off this rank
    assert s.x.shape == ((6, 3, 128) if epi == "reduce" else (6, 128))
    ref = inputs.reference(p, s)
    assert ref.shape == ((6, 64) if epi == "reduce" else (6, 3, 32))
    launch = T.bind(p, T.default(p, ARCHS["cpu"]), T.pack("fp4-linear", s.w), "cpu")
    assert inputs.check(p, lambda x, w, ids, tw, out: launch(x, ids, tw, out=out), s, ref) < 1e-2
    assert not ref[4].any()                               # -1 contributes nothing


def _ref_block(x, gate, up, down, ids_local, tw):
    g, u, d = (w.dequantize(torch.float64) for w in (gate, up, down))
    y = torch.zeros(x.shape[0], d.shape[1], dtype=torch.float64)
    for i in range(x.shape[0]):
        for j in range(ids_local.shape[1]):
            e = int(ids_local[i, j])
            if e >= 0:
                xi = x[i].double()
                y[i] += float(tw[i, j]) * (d[e] @ (torch.nn.functional.silu(g[e] @ xi) * (u[e] @ xi)))
    return y


@pytest.mark.parametrize("fused", [True, False])
def test_fp4moe_block_expert_map_and_gate_up_scales(disp, fused):
    torch.manual_seed(0)
    e, h, i, top_k = 5, 64, 32, 2
    gate, up, down = torch.randn(e, i, h), torch.randn(e, i, h) * 4, torch.randn(e, h, i)
    emap = torch.tensor([3, -1, 0, 1, -1, 2, 4])                                # 7 global ids, 5 here
    blk = FP4MoE.from_float(gate, up, down, top_k, fused=fused, expert_map=emap, dispatcher=disp)
    assert reexported is FP4MoE and blk.problem13.epilogue == ("swiglu" if fused else "none")
    gq, uq, dq = quantize(gate), quantize(up), quantize(down)
    assert not torch.equal(gq.global_scale, uq.global_scale)                    # separate scales
    x = torch.randn(4, h).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [4, 1], [6, 2], [5, -1]])
    tw = torch.rand(4, top_k)
    y = blk(x, ids, tw)
    assert torch.equal(blk.to(torch.bfloat16)(x, ids, tw), y)                 # no scale is cast
    local = blk.local_ids(ids)
    assert local.tolist() == [[3, -1], [-1, -1], [4, 0], [2, -1]]
    ref = _ref_block(x, gq, uq, dq, local, tw)
    assert y.shape == (4, h) and not y[1].any()                                 # no expert here: zeros
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    # an id >= E_global: no host read, its token's row NaN, the layer's word set until read
    assert blk.routing_errors() == []
    bad = blk(x, torch.tensor([[0, 2], [7, 2], [0, 2], [-3, -1]]), tw)
    assert torch.isnan(bad[[1, 3]]).all() and not torch.isnan(bad[[0, 2]]).any()
    assert blk.routing_errors(clear=False) == [blk.label] == blk.routing_errors() and blk.routing_errors() == []
    blk.check_ids = True                             # AUTOTUNE_CHECK_IDS=1: the per-call raise
    with pytest.raises(OperandError, match=r"topk_ids hold expert ids outside \[-1, 7\)"):
        blk(x, torch.tensor([[0, 7]] * 4), tw)
    with pytest.raises(ValueError, match="expert_map must map each"):
        FP4MoE.from_float(gate, up, down, top_k, expert_map=torch.tensor([0, 1, 1, 2, 3]), dispatcher=disp)


def test_fp4moe_compiles_without_a_graph_break(disp):
    torch.manual_seed(1)
    blk = FP4MoE.from_float(torch.randn(4, 16, 64), torch.randn(4, 16, 64), torch.randn(4, 64, 16), 2, dispatcher=disp)
    x, ids, tw = torch.randn(3, 64), torch.tensor([[0, 3], [2, -1], [1, 0]]), torch.rand(3, 2)
    y = blk(x, ids, tw)
    assert y.dtype == torch.float32 and y.shape == (3, 64)
    torch._dynamo.reset()
    assert torch.equal(torch.compile(blk, fullgraph=True)(x, ids, tw), y)       # fp4_autotune::moe_block


def test_fp4moe_from_modelopt_keeps_gate_and_up_scales(disp, tmp_path):
    from safetensors.torch import save_file
    from autotune.core.modelopt import to_modelopt
    torch.manual_seed(2)
    t, ws = {}, {}
    for e in range(3):
        for name, shape, scale in (("gate_proj", (32, 64), 1), ("up_proj", (32, 64), 5), ("down_proj", (64, 32), 1)):
            ws[e, name] = quantize(torch.randn(*shape) * scale)
            t.update(to_modelopt(ws[e, name], f"model.layers.3.mlp.experts.{e}.{name}"))
    save_file(t, str(tmp_path / "m.safetensors"))
    blk = FP4MoE.from_modelopt(str(tmp_path / "m.safetensors"), "model.layers.3.mlp", range(3), 2, dispatcher=disp)
    x, ids, tw = torch.randn(3, 64).to(torch.bfloat16), torch.tensor([[0, 2], [1, 0], [2, 1]]), torch.rand(3, 2)
    ref = torch.zeros(3, 64, dtype=torch.float64)
    for r in range(3):
        for j in range(2):
            e = int(ids[r, j])
            g, u, d = (ws[e, n].dequantize(torch.float64) for n in ("gate_proj", "up_proj", "down_proj"))
            ref[r] += float(tw[r, j]) * (d @ (torch.nn.functional.silu(g @ x[r].double()) * (u @ x[r].double())))
    assert blk.w13.shape == (3, 64, 64) and blk.w2.global_scale.shape == (3,)
    assert float((blk(x, ids, tw).double() - ref).norm() / ref.norm()) < 1e-2


def test_search_checks_the_variants_against_float64(tmp_path):
    from autotune import api
    from autotune.cache import Store
    ps = [Problem.moe(64, 128, 4, 2, epilogue="swiglu"), Problem.moe(128, 32, 4, 2, epilogue="reduce")]
    r = api.run(ps, families="torch", buckets=[1, 3], cache=str(tmp_path / "c.db"), budget_s=0.05, isolate=False)
    assert r.report.failed == 0 and r.report.measured > 0
    keys = {(w.problem_key, w.bucket) for w in Store(tmp_path / "c.db", readonly=True).winners()}
    assert keys == {(p.key, b) for p in ps for b in (1, 3)}


_INTERP = textwrap.dedent("""
    import json, sys, tempfile, os, torch
    from autotune.core import inputs
    from autotune.core.arch import ARCHS
    from autotune.core.env import cpu
    from autotune.core.formats import quantize
    from autotune.core.problem import Problem
    from autotune.core.records import Winner
    from autotune.core.tactic import Tactic
    from autotune.runtime.dispatch import Dispatcher
    from autotune.runtime.moe import FP4MoE
    from autotune.cache import Store
    from autotune.tactics import registry
    from autotune.tactics.triton_fp4 import moe_align
    from autotune.tactics.triton_fp4.family import TritonFamily
    TritonFamily.available = lambda self, device: (True, "")     # the interpreter runs it on the CPU
    fam = registry.get("triton")
    cfg = lambda route, bm, sk: Tactic("triton", kernel="moe_decode", route=route, block_m=bm, block_n=32,
                                       block_k=128, split_k=sk, num_warps=4, num_stages=2)
    out = {"variants": []}
    for p, t in [(Problem.moe(64, 256, 5, 2, epilogue="swiglu"), cfg("direct", 16, 2)),
                 (Problem.moe(64, 128, 5, 3, epilogue="reduce"), cfg("aligned", 16, 1)),
                 (Problem.moe(64, 128, 5, 3, epilogue="reduce"), cfg("direct", 16, 1)),
                 (Problem.moe(64, 128, 5, 3), cfg("direct", 16, 1)),
                 (Problem.moe(64, 128, 5, 3), Tactic("triton", kernel="moe_w4a16", block_m=16, block_n=32,
                                                     block_k=128, num_warps=4, num_stages=2))]:
        s = inputs.make_inputs(p, 5, "cpu", seed=3)[0]
        s.topk_ids[0, 1] = -1
        if p.epilogue == "none":                               # a plain problem also takes a row per pair
            s.x = torch.randn(5, 3, 128).to(torch.bfloat16)
        launch = fam.bind(p, t, fam.pack(fam.layout(t), s.w), "cpu")
        err = inputs.check(p, lambda x, w, ids, tw, out: launch(x, ids, tw, out=out), s, inputs.reference(p, s))
        out["variants"].append([p.key, t["kernel"], err])
    # FP4MoE with moe_decode winners from a real cache: aligned route at both GEMMs, BLOCK_M 32 and 16
    torch.manual_seed(5)
    e, h, i, top_k, m = 5, 256, 128, 2, 4
    gate, up, down = torch.randn(e, i, h), torch.randn(e, i, h) * 3, torch.randn(e, h, i)
    env, db = cpu(), os.path.join(tempfile.mkdtemp(), "c.db")
    lib = env.lib_key(("triton",))
    with Store(db) as st:
        for p, t in [(Problem.moe(2 * i, h, e, top_k, epilogue="swiglu"), cfg("aligned", 32, 1)),
                     (Problem.moe(h, i, e, top_k, epilogue="reduce"), cfg("aligned", 16, 1)),
                     (Problem.moe(2 * i, h, e, top_k), cfg("aligned", 16, 1)),
                     (Problem.moe(h, i, e, top_k), cfg("direct", 16, 1))]:
            st.put_winner(Winner(p.key, m, env.device_key, t.id, t.family, t.to_json(), lib, 1.0, t.id, 1.0, 1.0,
                                 registry.code_key(t, lib)))     # this code's key: else not served
    d = Dispatcher(db, env=env, arch=ARCHS["cpu"], record_misses=False, warn=False)
    calls = []
    real = moe_align.Aligner.__call__
    moe_align.Aligner.__call__ = lambda self, ids: (calls.append(self.block_m), real(self, ids))[1]
    emap = torch.tensor([4, -1, 3, 2, 1, -1, 0])
    x, ids, tw = torch.randn(m, h).to(torch.bfloat16), torch.tensor([[0, 2], [1, 5], [6, 3], [4, 0]]), torch.rand(m, 2)
    g, u, dn = (quantize(w).dequantize(torch.float64) for w in (gate, up, down))
    out["block"] = []
    for fused in (True, False):
        blk = FP4MoE.from_float(gate, up, down, top_k, fused=fused, expert_map=emap, dispatcher=d)
        calls.clear()
        y = blk(x, ids, tw)
        local = blk.local_ids(ids)
        ref = torch.zeros(m, h, dtype=torch.float64)
        for r in range(m):
            for j in range(top_k):
                k = int(local[r, j])
                if k >= 0:
                    xr = x[r].double()
                    ref[r] += float(tw[r, j]) * (dn[k] @ (torch.nn.functional.silu(g[k] @ xr) * (u[k] @ xr)))
        rungs = [d.rung_for(blk.problem13, m)[1].params.get("kernel"), d.rung_for(blk.problem2, m)[1].params.get("kernel")]
        out["block"].append(dict(fused=fused, err=float((y.double() - ref).norm() / ref.norm()), aligns=list(calls),
                                 rungs=rungs))
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def interp():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_moe_decode_variants_in_the_interpreter(interp):
    assert len(interp["variants"]) == 5                 # the last two: x per pair on moe_decode, moe_w4a16
    for key, kernel, err in interp["variants"]:
        assert err < 1e-2, (key, kernel, err)


def test_fp4moe_with_moe_decode_winners_shares_one_alignment(interp):
    fused, unfused = interp["block"]
    assert fused["rungs"] == ["moe_decode", "moe_decode"] and fused["err"] < 1e-2
    assert fused["aligns"] == [32]                 # one moe_align (BLOCK_M 32), regrouped for w2's 16
    assert unfused["err"] < 1e-2 and unfused["aligns"] == [16]    # w2 runs direct: w13 aligns for itself


def test_expert_map_loaded_by_state_dict_is_used_and_checked(disp):
    """load_state_dict copies a new expert_map in place: the block maps with it (not a cached copy
    of the old one) and refuses a map that is not one-to-one, in one line."""
    torch.manual_seed(3)
    g, u, d = torch.randn(2, 16, 64), torch.randn(2, 16, 64), torch.randn(2, 64, 16)
    a = FP4MoE.from_float(g, u, d, 1, expert_map=torch.tensor([0, 1, -1, -1]), dispatcher=disp)
    b = FP4MoE.from_float(g, u, d, 1, expert_map=torch.tensor([-1, -1, 0, 1]), dispatcher=disp)
    ids = torch.tensor([[0], [2]])
    assert a.local_ids(ids).tolist() == [[0], [-1]]
    a.load_state_dict(b.state_dict())
    assert a.local_ids(ids).tolist() == b.local_ids(ids).tolist() == [[-1], [0]]
    bad = {**b.state_dict(), "expert_map": torch.tensor([0, 0, 0, 0], dtype=torch.int32)}
    with pytest.raises(ValueError, match="expert_map must map each"):
        a.load_state_dict(bad)


def test_routing_weights_and_x_must_be_floating_point(disp):
    torch.manual_seed(4)
    blk = FP4MoE.from_float(torch.randn(2, 16, 64), torch.randn(2, 16, 64), torch.randn(2, 64, 16), 1, dispatcher=disp)
    x, ids = torch.randn(2, 64), torch.tensor([[0], [1]])
    with pytest.raises(OperandError, match="topk_weights must be floating point"):
        blk(x, ids, torch.ones(2, 1, dtype=torch.int64))
    with pytest.raises(OperandError, match="x is torch.int64; the FP4 layers take"):
        blk(torch.ones(2, 64, dtype=torch.int64), ids, torch.rand(2, 1))
