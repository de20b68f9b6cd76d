"""FP4MLP: a SwiGLU MLP in two kernels, the dense gate_up with the SwiGLU epilogue
then down, against float64: from dense weights with different gate and up global scales, from a
ModelOpt file, from a real producer's checkpoint (the shared expert apart from the routed FP4MoE,
whole and over two tensor-parallel ranks), on the cuda family's layout through its CPU grid port,
its input checks, torch.compile without a graph break, and the problems the presets list for it."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from helpers import keyed
from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.operands import OperandError
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.nn import FP4Linear, FP4MLP
from autotune.cache import Store
from autotune.tactics import registry

DATA = Path(__file__).parent / "data" / "ckpt"
H, I = 128, 64


@pytest.fixture
def disp(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["cpu"], record_misses=False, warn=False)


def rel(y, ref) -> float:
    return float((y.double() - ref.double()).norm() / ref.double().norm())


def _mlp_ref(x, g, u, d):
    """float64 down(silu(x·gateᵀ) ⊙ (x·upᵀ)) on the dequantized weights."""
    xd = x.to(torch.bfloat16).double()
    gd, ud, dd = (w.dequantize(torch.float64) for w in (g, u, d))
    return (torch.nn.functional.silu(xd @ gd.T) * (xd @ ud.T)) @ dd.T


def _weights(seed=0):
    torch.manual_seed(seed)
    # up 8x gate: separate global scales, as ModelOpt writes them; FP4MLP folds up/gate into down's
    return torch.randn(I, H) * 0.1, torch.randn(I, H) * 0.8, torch.randn(H, I) * 0.1


def test_from_float_matches_float64_with_different_gate_and_up_scales(disp):
    gate, up, down = _weights()
    m = FP4MLP.from_float(gate, up, down, dispatcher=disp)
    g, u, d = quantize(gate), quantize(up), quantize(down)
    assert not torch.equal(g.global_scale, u.global_scale)
    assert m.problems == (Problem.dense(2 * I, H, epilogue="swiglu"), Problem.dense(H, I))
    assert m.gate_up.out_features == I and m.down.in_features == I
    x = torch.randn(5, H)
    ref = _mlp_ref(x, g, u, d)
    y = m(x)
    assert y.dtype == torch.float32 and y.shape == (5, H) and rel(y, ref) < 1e-2
    xb = x.to(torch.bfloat16)
    fast = m(xb)                                            # the eager path: the two bound launchers
    assert fast.dtype == torch.bfloat16 and torch.equal(fast, m.down(m.gate_up(xb)))
    y3 = m(x.reshape(5, 1, H).expand(5, 3, H).to(torch.float16))
    assert y3.shape == (5, 3, H) and y3.dtype == torch.float16 and rel(y3[:, 1], ref) < 1e-2


def test_input_checks(disp):
    gate, up, down = _weights(1)
    g, u, d = quantize(gate), quantize(up), quantize(down)
    from autotune.runtime.nn import _cat_rows
    gu = _cat_rows(g, u)
    with pytest.raises(ValueError, match="does not fit gate_up"):
        FP4MLP(gu, quantize(torch.randn(H, I // 2)), dispatcher=disp)
    with pytest.raises(ValueError, match="2-D FP4 weights"):
        FP4MLP(quantize(torch.randn(2, 2 * I, H)), d, dispatcher=disp)
    with pytest.raises(ValueError, match="one format"):
        FP4MLP(gu, quantize(down, "mxfp4"), dispatcher=disp)
    with pytest.raises(ValueError, match="up_scale"):
        FP4MLP(gu, d, up_scale=torch.ones(2), dispatcher=disp)
    with pytest.raises(ValueError, match="must match"):
        _cat_rows(g, quantize(torch.randn(I, 2 * H)))
    m = FP4MLP(gu, d, up_scale=u.global_scale, dispatcher=disp)
    with pytest.raises(OperandError, match=f"expected ... x {H}"):
        m(torch.randn(3, H + 1))
    with pytest.raises(OperandError, match="never an integer or bool cast"):
        m(torch.ones(3, H, dtype=torch.int32))
    with pytest.raises(ValueError, match="no bias"):
        FP4Linear(gu, torch.zeros(2 * I), epilogue="swiglu", dispatcher=disp)
    with pytest.raises(ValueError, match="epilogue must be"):
        FP4Linear(gu, epilogue="reduce", dispatcher=disp)


def test_from_modelopt_file(disp, tmp_path):
    from safetensors.torch import save_file
    from autotune.core.modelopt import to_modelopt
    gate, up, down = _weights(2)
    ws = {n: quantize(t) for n, t in (("gate_proj", gate), ("up_proj", up), ("down_proj", down))}
    t = {}
    for n, w in ws.items():
        t.update(to_modelopt(w, f"model.layers.0.mlp.{n}"))
    save_file(t, str(tmp_path / "m.safetensors"))
    m = FP4MLP.from_modelopt(str(tmp_path / "m.safetensors"), "model.layers.0.mlp", dispatcher=disp)
    x = torch.randn(4, H)
    assert rel(m(x), _mlp_ref(x, ws["gate_proj"], ws["up_proj"], ws["down_proj"])) < 1e-2
    assert rel(FP4MLP.from_modelopt(t, "model.layers.0.mlp.", dispatcher=disp)(x), m(x)) == 0


def test_shared_expert_apart_from_the_routed_block_matches_the_producer(disp):
    """DeepSeek's ModelOpt checkpoint: FP4MoE(shared_experts=False) + FP4MLP(the shared expert) is
    the producer's whole block; the shared expert alone is the producer's MLP; over two TP ranks
    (gate/up column-, down row-parallel) the partial outputs add up to it."""
    from safetensors.torch import load_file
    from autotune.runtime.moe import FP4MoE
    r, blk = load_file(str(DATA / "modelopt_deepseek.ref.safetensors")), "model.layers.1.mlp"
    x, ids, tw = r[f"x.{blk}"], r[f"ids.{blk}"].to(torch.int32), r[f"tw.{blk}"]
    shared = FP4MLP.from_pretrained(DATA / "modelopt_deepseek", f"{blk}.shared_experts", dispatcher=disp)
    assert rel(shared(x), r[f"y.{blk}.shared_experts"]) < 1e-2
    routed = FP4MoE.from_pretrained(DATA / "modelopt_deepseek", blk, shared_experts=False, activations="w4a16",
                                    dispatcher=disp)
    assert rel(routed(x, ids, tw).double() + shared(x).double(), r[f"y.{blk}"]) < 1e-2
    ranks = [FP4MLP.from_pretrained(DATA / "modelopt_deepseek", f"{blk}.shared_experts", tp_rank=k, tp_size=2,
                                    dispatcher=disp) for k in range(2)]
    assert ranks[0].intermediate == shared.intermediate // 2
    assert rel(sum(mm(x).double() for mm in ranks), r[f"y.{blk}.shared_experts"]) < 1e-2


def test_compiles_without_a_graph_break(disp):
    gate, up, down = _weights(3)
    m = FP4MLP.from_float(gate, up, down, dispatcher=disp)
    x = torch.randn(3, H).to(torch.bfloat16)
    assert torch.equal(torch.compile(m, fullgraph=True)(x), m(x))        # fp4_autotune::linear twice


def test_on_the_cuda_layout_through_the_grid_port(tmp_path, register_family):
    """Winners of the cuda family's dense kernel (its CPU grid port: split-K partials and counters,
    SwiGLU's gate/up tile pairs) for both problems: FP4MLP binds them on the cuda layout and
    matches float64."""
    register_family("cudadensecpu", "tests.families.cuda_cpu:CudaDenseCpu")
    h, i = 256, 256                          # K = 256 in both: 2 k-pairs, so split 2 fits
    torch.manual_seed(4)
    gate, up, down = torch.randn(i, h) * 0.1, torch.randn(i, h) * 0.8, torch.randn(h, i) * 0.1
    env, arch = cpu(), ARCHS["sm90"]
    p13, p2 = Problem.dense(2 * i, h, epilogue="swiglu"), Problem.dense(h, i)
    picks = {p13: [(1, Tactic("cudadensecpu", warps_k=1, stages=2, tiles_n=2)),
                   (8, Tactic("cudadensecpu", warps_k=1, stages=2, tiles_n=2, split_k=2))],
             p2: [(1, Tactic("cudadensecpu", warps_k=1, stages=2, tiles_n=2)),
                  (8, Tactic("cudadensecpu", warps_k=1, stages=2, tiles_n=1, split_k=2))]}
    t64 = Tactic("torch", dequant_dtype="fp32", chunk_n=0)
    with Store(tmp_path / "c.db") as s:
        for p, rows in picks.items():
            for b, t in rows:
                lib = env.lib_key(registry.get(t.family).depends_on)
                s.put_winner(keyed(Winner(p.key, b, env.device_key, t.id, t.family, t.to_json(), lib, 1.0,
                                          t64.id, 1.0, 1.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(tmp_path / "c.db", env=env, arch=arch, record_misses=False, warn=False)
    assert d.skipped == {}
    m = FP4MLP.from_float(gate, up, down, dispatcher=d)
    assert all(list(lin.bound.packs) == ["cuda-mma-a-frag-v1"] for lin in (m.gate_up, m.down))
    g, u, dq = quantize(gate), quantize(up), quantize(down)
    for rows in (1, 8):
        x = torch.randn(rows, h)
        assert rel(m(x), _mlp_ref(x, g, u, dq)) < 1e-2


def test_the_presets_list_what_fp4mlp_serves():
    from autotune.models import problems_for
    base = problems_for("glm5", tp=8, fused_moe=True)
    uses = problems_for("glm5", tp=8, fused_moe=True, fused_mlp=True)
    new = {u.problem.key: u.layers for u in uses} .keys() - {u.problem.key for u in base}
    assert new == {"dense:bf16*nvfp4->bf16:n3072:k6144:swiglu", "dense:bf16*nvfp4->bf16:n512:k6144:swiglu"}
    by = {u.problem.key: u for u in uses}
    assert by["dense:bf16*nvfp4->bf16:n3072:k6144:swiglu"].layers == ("mlp.gate_up_proj+swiglu[0-2]",)
    assert by["dense:bf16*nvfp4->bf16:n512:k6144:swiglu"].per_forward == 75
    # FP4MLP's problems, built as the runtime builds them, are in the list
    mlp_dense = FP4MLP(quantize(torch.zeros(3072, 6144)), quantize(torch.zeros(6144, 1536)),
                       dispatcher=Dispatcher(None, record_misses=False, warn=False))
    assert {p.key for p in mlp_dense.problems} <= set(by)
    from autotune import api
    assert {u.problem.key for u in api.model_problems("glm5", tp=8, only="swiglu", fused_mlp=True)} >= new
