"""Issue #15, build item 3's last clause: the shared expert folded into FP4MoE's two calls as local
expert E with one always-routed slot (weight 1.0), and the folded problems listed on request.

On the CPU: the folded block (fused and unfused, expert_map with -1, gate ≠ up global scales on the
routed and the shared expert) against a float64 reference of the routed block plus the shared
expert's MLP; shared inputs of the wrong shape / format / scale refused in one line; one copy of the
stacked weights; `problems_for(..., fold_shared=True)` adds moe(n, k, E+1, top_k+1) forms only
when asked. In Triton's interpreter (one subprocess): the folded block on moe_decode winners.
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

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.problem import Problem
from autotune.models import problems_for
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def disp(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["cpu"], record_misses=False, warn=False)


def _mlp(g, u, d, x):
    return d @ (torch.nn.functional.silu(g @ x) * (u @ x))


def _ref(x, routed, shared, ids_local, tw):
    """float64: Σ_j tw · expert(ids[j]) + the shared expert, each from its own quantized weights."""
    g, u, d = (w.dequantize(torch.float64) for w in routed)
    sg, su, sd = (w.dequantize(torch.float64) for w in shared)
    y = torch.zeros(x.shape[0], d.shape[1], dtype=torch.float64)
    for i in range(x.shape[0]):
        xi = x[i].double()
        y[i] = _mlp(sg, su, sd, xi)
        for j in range(ids_local.shape[1]):
            e = int(ids_local[i, j])
            if e >= 0:
                y[i] += float(tw[i, j]) * _mlp(g[e], u[e], d[e], xi)
    return y


def _weights(e=5, h=64, i=32, seed=0):
    torch.manual_seed(seed)
    routed = torch.randn(e, i, h), torch.randn(e, i, h) * 4, torch.randn(e, h, i)
    shared = torch.randn(i, h) * 0.5, torch.randn(i, h) * 3, torch.randn(h, i)
    return routed, shared


@pytest.mark.parametrize("fused", [True, False])
def test_folded_block_matches_routed_plus_shared_float64(disp, fused):
    (gate, up, down), (sg, su, sd) = _weights()
    top_k, emap = 2, torch.tensor([3, -1, 0, 1, -1, 2, 4])
    sh = FP4MoE.shared_from_float(sg, su, sd)
    assert not torch.equal(sh[0].global_scale, sh[2])                           # shared gate ≠ up scale
    blk = FP4MoE.from_float(gate, up, down, top_k, fused=fused, expert_map=emap, dispatcher=disp, shared=sh,
                            fold_shared=True)
    assert blk.problem13 == Problem.moe(64, 64, 6, 3, epilogue="swiglu" if fused else "none")
    assert blk.problem2 == Problem.moe(64, 32, 6, 3, epilogue="reduce" if fused else "none")
    assert blk.w13.shape == (6, 64, 64) and blk.w2.global_scale.shape == (6,) and "shared folded" in repr(blk)
    assert torch.equal(blk.w13_packed[5], sh[0].packed)                          # expert E is the shared one
    x = torch.randn(4, 64).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [4, 1], [6, 2], [5, -1]])                        # token 1: no routed expert here
    tw = torch.rand(4, top_k)
    y = blk(x, ids, tw)
    ref = _ref(x, [quantize(w) for w in (gate, up, down)], [quantize(w) for w in (sg, su, sd)],
               blk.local_ids(ids), tw)
    assert y.shape == (4, 64) and y[1].abs().sum() > 0                           # the shared expert still runs
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert float((y[1].double() - ref[1]).norm() / ref[1].norm()) < 1e-2
    assert torch.equal(blk.to(torch.bfloat16)(x, ids, tw), y)
    plain = FP4MoE.from_float(gate, up, down, top_k, fused=fused, expert_map=emap, dispatcher=disp)
    assert plain.problem13.top_k == 2 and plain.w13.shape == (5, 64, 64)          # default unchanged


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_shared_expert_apart_where_it_cannot_fold_matches_float64(disp, fmt):
    """Apart (the default where the shared expert does not fit the routed stack, I_s != I): the routed
    block as without a shared expert, plus an FP4MLP of the shared expert's own (its dense swiglu +
    down problems, any intermediate size); the same float64 block as folding gives, -1 rows included."""
    (gate, up, down), _ = _weights(h=64, i=64, seed=5)
    torch.manual_seed(6)
    sg, su, sd = torch.randn(96, 64) * 0.5, torch.randn(96, 64) * 3, torch.randn(64, 96)   # I_s != I
    top_k, emap = 2, torch.tensor([3, -1, 0, 1, -1, 2, 4])
    blk = FP4MoE.from_float(gate, up, down, top_k, fmt=fmt, expert_map=emap, dispatcher=disp,
                            shared=FP4MoE.shared_from_float(sg, su, sd, fmt))
    assert blk.has_shared and not blk.shared_folded and "folded" not in repr(blk)
    assert blk.problem13 == Problem.moe(128, 64, 5, 2, w_fmt=fmt, epilogue="swiglu") and blk.w13.shape == (5, 128, 64)
    assert blk.problems[2:] == (Problem.dense(192, 64, w_fmt=fmt, epilogue="swiglu"), Problem.dense(64, 96, w_fmt=fmt))
    x = torch.randn(4, 64).to(torch.bfloat16)
    ids, tw = torch.tensor([[0, 1], [4, 1], [6, 2], [-1, -1]]), torch.rand(4, top_k)
    y = blk(x, ids, tw)
    ref = _ref(x, [quantize(w, fmt) for w in (gate, up, down)], [quantize(w, fmt) for w in (sg, su, sd)],
               blk.local_ids(ids), tw)
    assert float((y.double() - ref).norm() / ref.norm()) < 2e-2
    assert float((y[3].double() - ref[3]).norm() / ref[3].norm()) < 2e-2        # shared expert only
    bad = blk(x, torch.tensor([[0, 1], [9, 1], [6, 2], [-1, -1]]), tw)            # id 9 outside [-1, 7)
    assert torch.isnan(bad[1]).all() and not torch.isnan(bad[[0, 2, 3]]).any()
    assert blk.routing_errors() == [blk.label]


def test_w4a4_without_input_scales_is_refused_apart_too(disp):
    """W4A4 activations need the routed experts' static input scales, whether the shared expert runs
    folded or apart (apart it is an FP4MLP of its own format: tests/test_checkpoint_formats.py)."""
    (gate, up, down), (sg, su, sd) = _weights(seed=7)
    g, u, d = (quantize(w) for w in (gate, up, down))
    with pytest.raises(ValueError, match=r"W4A4 needs w13 and w2 input_scale"):
        FP4MoE(FP4MoE.from_float(gate, up, down, 2, dispatcher=disp).w13, d, 2, a_fmt="nvfp4", dispatcher=disp,
               shared=FP4MoE.shared_from_float(sg, su, sd), fold_shared=False)


def test_folded_block_keeps_one_copy_and_checks_routing(disp):
    (gate, up, down), (sg, su, sd) = _weights(seed=1)
    blk = FP4MoE.from_float(gate, up, down, 2, dispatcher=disp, shared=FP4MoE.shared_from_float(sg, su, sd),
                            fold_shared=True)
    names = {n for n, _ in blk.named_buffers()}
    assert names == {f"{w}_{p}" for w in ("w13", "w2") for p in ("packed", "scales_u8", "gs_u8")}
    from autotune.core.operands import OperandError
    y = blk(torch.randn(2, 64), torch.tensor([[0, 5], [1, 2]]), torch.rand(2, 2))   # E is not a routable id
    assert torch.isnan(y[0]).all() and not torch.isnan(y[1]).any() and blk.routing_errors() == [blk.label]
    blk.check_ids = True                              # AUTOTUNE_CHECK_IDS=1: the per-call raise
    with pytest.raises(OperandError, match=r"topk_ids hold expert ids outside \[-1, 5\)"):
        blk(torch.randn(2, 64), torch.tensor([[0, 5], [1, 2]]), torch.rand(2, 2))
    y = blk(torch.randn(2, 64), torch.tensor([[-1, -1], [-1, -1]]), torch.rand(2, 2))
    assert y.abs().sum() > 0                                                     # shared only


def test_wrong_shared_inputs_are_refused(disp):
    (gate, up, down), (sg, su, sd) = _weights(seed=2)
    w13s, w2s, ups = FP4MoE.shared_from_float(sg, su, sd)
    bad = [((w2s, w13s), r"shared w13 must be a 2-D nvfp4 FP4Weight \[64, 64\]"),
           ((w13s, quantize(torch.randn(64, 64))), r"shared w2 must be a 2-D nvfp4 FP4Weight \[64, 32\]"),
           ((w13s, quantize(torch.randn(1, 64, 32))), r"shared w2 must be a 2-D"),
           ((w13s, quantize(sd, "mxfp4")), r"got \(64, 32\) \(mxfp4"),
           ((w13s,), "shared takes"),
           ((w13s, w2s, torch.ones(3)), "shared up_scale must be one global scale")]
    for shared, msg in bad:
        with pytest.raises(ValueError, match=msg):
            FP4MoE.from_float(gate, up, down, 2, dispatcher=disp, shared=shared, fold_shared=True)


def test_from_modelopt_folds_the_checkpoints_shared_experts(disp, tmp_path):
    """`{prefix}.shared_experts.*` of a ModelOpt checkpoint (GLM-5 / DeepSeek-V3 naming), read from
    a .safetensors file and from a dict, gives the float64 block of routed + shared experts."""
    from safetensors.torch import save_file
    from autotune.core.modelopt import to_modelopt
    (gate, up, down), (sg, su, sd) = _weights(e=3, seed=4)
    routed, shared = [quantize(w) for w in (gate, up, down)], [quantize(w) for w in (sg, su, sd)]
    t = {}
    for e in range(3):
        for name, w in zip(("gate_proj", "up_proj", "down_proj"), routed):
            t.update(to_modelopt(quantize(w.dequantize(torch.float32)[e]), f"model.layers.5.mlp.experts.{e}.{name}"))
    for name, w in zip(("gate_proj", "up_proj", "down_proj"), shared):
        t.update(to_modelopt(w, f"model.layers.5.mlp.shared_experts.{name}"))
    save_file(t, str(tmp_path / "m.safetensors"))
    x, ids, tw = torch.randn(3, 64).to(torch.bfloat16), torch.tensor([[0, 2], [-1, 1], [2, 1]]), torch.rand(3, 2)
    per = [[quantize(w.dequantize(torch.float32)[e]) for e in range(3)] for w in routed]
    ref_routed = [type(w)(torch.stack([p.packed for p in ps]), torch.stack([p.scales for p in ps]),
                          torch.stack([p.global_scale for p in ps]), w.fmt) for w, ps in zip(routed, per)]
    ref = _ref(x, ref_routed, shared, ids, tw)
    for source in (str(tmp_path / "m.safetensors"), t):
        blk = FP4MoE.from_modelopt(source, "model.layers.5.mlp", range(3), 2, dispatcher=disp, shared_experts=True,
                                   fold_shared=True)
        assert blk.shared_folded and blk.problem13.top_k == 3 and blk.w13.shape == (4, 64, 64)
        assert float((blk(x, ids, tw).double() - ref).norm() / ref.norm()) < 1e-2
        dflt = FP4MoE.from_modelopt(source, "model.layers.5.mlp", range(3), 2, dispatcher=disp, shared_experts=True)
        assert dflt.shared_folded                            # the default where it fits (I_s = I)
        apart = FP4MoE.from_modelopt(source, "model.layers.5.mlp", range(3), 2, dispatcher=disp, shared_experts=True,
                                     fold_shared=False)
        assert apart.has_shared and not apart.shared_folded and apart.w13.shape == (3, 64, 64)
        assert float((apart(x, ids, tw).double() - ref).norm() / ref.norm()) < 1e-2
    with pytest.raises(KeyError, match="model.layers.5.mlp.shared_expert.gate_proj"):
        FP4MoE.from_modelopt(t, "model.layers.5.mlp", range(3), 2, dispatcher=disp, shared_experts="shared_expert")
    with pytest.raises(ValueError, match="shared_experts= or shared=, not both"):
        FP4MoE.from_modelopt(t, "model.layers.5.mlp", range(3), 2, dispatcher=disp, shared_experts=True,
                             shared=FP4MoE.shared_from_float(sg, su, sd))


def test_mxfp4_folded_block(disp):
    (gate, up, down), (sg, su, sd) = _weights(h=64, i=64, seed=3)
    sh = FP4MoE.shared_from_float(sg, su, sd, "mxfp4")
    blk = FP4MoE.from_float(gate, up, down, 2, fmt="mxfp4", dispatcher=disp, shared=sh, fold_shared=True)
    x, ids, tw = torch.randn(3, 64).to(torch.bfloat16), torch.tensor([[0, 4], [2, -1], [1, 3]]), torch.rand(3, 2)
    ref = _ref(x, [quantize(w, "mxfp4") for w in (gate, up, down)], [quantize(w, "mxfp4") for w in (sg, su, sd)],
               ids, tw)
    assert float((blk(x, ids, tw).double() - ref).norm() / ref.norm()) < 2e-2


def test_folded_problems_listed_only_when_asked():
    base = problems_for("glm5", tp=8, fused_moe=True)
    assert problems_for("glm5", tp=8, fused_moe=True, fold_shared=False) == base
    folded = problems_for("glm5", tp=8, fused_moe=True, fold_shared=True)
    extra = {u.problem.key for u in folded} - {u.problem.key for u in base}
    assert extra == {Problem.moe(512, 6144, 257, 9, epilogue=epi).key for epi in ("none", "swiglu")} | \
        {Problem.moe(6144, 256, 257, 9, epilogue=epi).key for epi in ("none", "reduce")}
    assert {u.problem.key for u in base} <= {u.problem.key for u in folded}
    names = {layer for u in folded if u.problem.experts == 257 for layer in u.layers}
    assert names == {"mlp.experts.w13+shared[3-77]", "mlp.experts.w13+shared+swiglu[3-77]",
                     "mlp.experts.w2+shared[3-77]", "mlp.experts.w2+shared+reduce[3-77]"}
    plain = problems_for("glm5", tp=8, fold_shared=True)
    assert {u.problem.key for u in plain} - {u.problem.key for u in problems_for("glm5", tp=8)} == \
        {Problem.moe(512, 6144, 257, 9).key, Problem.moe(6144, 256, 257, 9).key}
    # EP8: the routed experts keep their whole I (2048) but the shared expert is TP-sharded (256): no fold
    assert problems_for("glm5", tp=8, ep=8, fold_shared=True) == problems_for("glm5", tp=8, ep=8)


def test_cli_search_lists_the_folded_problems_by_default_and_drops_them_with_no_fold_shared(tmp_path):
    """The search tunes what FP4MoE(shared=...) runs by default (the shared expert folded in where it
    fits): the e257:top9 problems are listed without a flag, --fold-shared changes nothing, and
    --no-fold-shared drops exactly those 4."""
    from helpers import run_cli
    args = ("search", "--model", "glm5", "--tp", "8", "--only", "grouped_moe", "--dry-run")
    keys = lambda r: sorted(ln.split()[0] for ln in r.stdout.splitlines() if ln.startswith("grouped_moe:"))  # noqa: E731
    dflt, on, off = (run_cli(*args, *flag, cache=tmp_path / "c.db")
                     for flag in ((), ("--fold-shared",), ("--no-fold-shared",)))
    assert dflt.returncode == 0 and on.returncode == 0 and off.returncode == 0, dflt.stderr + on.stderr + off.stderr
    assert keys(dflt) == keys(on)
    assert keys(off) and [k for k in keys(off) if ":e257:" in k] == []
    assert set(keys(off)) <= set(keys(dflt))
    assert sorted(set(keys(dflt)) - set(keys(off))) == sorted(
        [Problem.moe(512, 6144, 257, 9, epilogue=e).key for e in ("none", "swiglu")]
        + [Problem.moe(6144, 256, 257, 9, epilogue=e).key for e in ("none", "reduce")])


_INTERP = textwrap.dedent("""
    import json, os, tempfile, torch
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
    from autotune.tactics.triton_fp4.family import TritonFamily
    TritonFamily.available = lambda self, device: (True, "")     # the interpreter runs it on the CPU
    cfg = lambda route, bm: Tactic("triton", kernel="moe_decode", route=route, block_m=bm, block_n=32,
                                   block_k=128, split_k=1, num_warps=4, num_stages=2)
    torch.manual_seed(7)
    e, h, i, top_k, m = 4, 256, 128, 2, 3
    gate, up, down = torch.randn(e, i, h), torch.randn(e, i, h) * 3, torch.randn(e, h, i)
    sg, su, sd = torch.randn(i, h), torch.randn(i, h) * 2, torch.randn(h, i)
    env, db = cpu(), os.path.join(tempfile.mkdtemp(), "c.db")
    lib = env.lib_key(("triton",))
    with Store(db) as st:          # folded problems: E+1 experts, top_k+1 slots
        for p, t in [(Problem.moe(2 * i, h, e + 1, top_k + 1, epilogue="swiglu"), cfg("aligned", 16)),
                     (Problem.moe(h, i, e + 1, top_k + 1, epilogue="reduce"), cfg("direct", 16))]:
            st.put_winner(Winner(p.key, m, env.device_key, t.id, t.family, t.to_json(), lib, 1.0, t.id, 1.0, 1.0,
                                 registry.code_key(t, lib)))     # this code's key: else not served
    d = Dispatcher(db, env=env, arch=ARCHS["cpu"], record_misses=False, warn=False)
    emap = torch.tensor([3, -1, 2, 1, -1, 0])
    blk = FP4MoE.from_float(gate, up, down, top_k, expert_map=emap, dispatcher=d,
                            shared=FP4MoE.shared_from_float(sg, su, sd), fold_shared=True)
    x, ids, tw = torch.randn(m, h).to(torch.bfloat16), torch.tensor([[0, 2], [1, 4], [5, 3]]), torch.rand(m, 2)
    y = blk(x, ids, tw)
    g, u, dn = (quantize(w).dequantize(torch.float64) for w in (gate, up, down))
    g2, u2, d2 = (quantize(w).dequantize(torch.float64) for w in (sg, su, sd))
    mlp = lambda g, u, d, v: d @ (torch.nn.functional.silu(g @ v) * (u @ v))
    local, ref = blk.local_ids(ids), torch.zeros(m, h, dtype=torch.float64)
    for r in range(m):
        xr = x[r].double()
        ref[r] = mlp(g2, u2, d2, xr) + sum(float(tw[r, j]) * mlp(g[k], u[k], dn[k], xr)
                                           for j, k in enumerate(local[r].tolist()) if k >= 0)
    rungs = [d.rung_for(p, m)[1].params.get("kernel") for p in (blk.problem13, blk.problem2)]
    # both launchers are moe_decode, which flags bad ids itself; folded, a caller's id E (the
    # shared expert's local id) goes through the id table to BAD: a NaN row and the word, no host read
    nomap = FP4MoE.from_float(gate, up, down, top_k, dispatcher=d, shared=FP4MoE.shared_from_float(sg, su, sd),
                              fold_shared=True)
    ls = (nomap.bound13.launcher(m), nomap.bound2.launcher(m))
    yb = nomap(x, torch.tensor([[0, 2], [1, e], [3, 3]]), tw)
    print(json.dumps(dict(err=float((y.double() - ref).norm() / ref.norm()), rungs=rungs,
                          flags=[l.checks_ids for l in ls], nan_rows=torch.isnan(yb).any(1).tolist(),
                          errors=nomap.routing_errors() == [nomap.label], after=nomap.routing_errors())))
""")


def test_folded_block_on_moe_decode_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rungs"] == ["moe_decode", "moe_decode"] and out["err"] < 1e-2, out
    assert out["flags"] == [True, True] and out["nan_rows"] == [False, True, False], out
    assert out["errors"] is True and out["after"] == [], out


def test_mlp_step_bench_has_the_folded_and_uniform_columns(tmp_path):
    """bench/moe_mlp_step_h200.py's CPU smoke run (tiny shapes, torch defaults): the folded block
    is checked against float64 and timed beside the routed + shared calls, and the uniform-routing
    columns are filled, so the next H200 call spends its minutes measuring, not debugging."""
    env = {**os.environ, "MOE_STEP_SMOKE": "1"}
    r = subprocess.run([sys.executable, "bench/moe_mlp_step_h200.py", "--out", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "moe-mlp-step.json").read_text())
    folded = [b for b in res["block"] if b["folded"]]
    assert folded and all(b["err"] < 1e-2 and not b["nan"] for b in res["block"])
    for row in res["step"]:
        assert row["routed_fp4_folded"] > 0 and row["routed_fp4_uniform"] > 0 and row["routed_bf16_uniform"] > 0
        assert row["routed_tactics"]["w13_folded"]["rung"] == "default"
    assert "fused, unfused and shared folded" in r.stdout and "routed, shared folded in" in r.stdout
