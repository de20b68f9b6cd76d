"""No silent wrong results: every call path refuses operands that do not match the problem, and
every MoE member treats expert id -1 as "not on this rank" (a zero row, no work).

`test_moe_minus_one_is_a_zero_row` is the contract every MoE member must pass: add new members to
MOE_MEMBERS (the GPU-only ones are marked and run on the H200).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.operands import OperandError, check_operands
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.nn import FP4GroupedGEMM, FP4Linear
from autotune.tactics import registry

CPU = cpu()
T = Tactic("torch", dequant_dtype="fp32", chunk_n=0)


@pytest.fixture
def disp(tmp_path):
    return Dispatcher(tmp_path / "none.db", env=CPU, arch=ARCHS["cpu"], record_misses=False, warn=False)


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def test_dispatch_refuses_a_weight_of_another_shape(disp):
    w = quantize(torch.randn(64, 2048))
    with pytest.raises(OperandError, match=r"weight packed 64x1024 does not match the problem's 128x1024"):
        disp((4, 128, 2048))(bf16(4, 2048), w)


def test_dispatch_refuses_x_of_another_k_and_dtype(disp):
    w = quantize(torch.randn(128, 2048))
    with pytest.raises(OperandError, match=r"x is 4x1024, expected M x 2048"):
        disp((4, 128, 2048))(bf16(4, 1024), w)
    with pytest.raises(OperandError, match=r"x is torch.float32, expected torch.bfloat16"):
        disp((4, 128, 2048))(torch.randn(4, 2048), w)


def test_mxfp4_weight_on_an_nvfp4_problem_is_refused(disp):
    w = quantize(torch.randn(128, 2048), "mxfp4")
    with pytest.raises(OperandError, match="weight format is mxfp4, the problem's is nvfp4"):
        disp((4, 128, 2048))(bf16(4, 2048), w)


def test_meta_x_with_a_cpu_weight_is_refused(disp):
    w = quantize(torch.randn(128, 2048))
    x = torch.empty(4, 2048, dtype=torch.bfloat16, device="meta")
    with pytest.raises(OperandError, match="x is on meta, the weight on cpu"):
        disp((4, 128, 2048))(x, w)


def test_bound_table_checks_the_weight_once_at_bind(disp):
    p = Problem.dense(128, 2048)
    with pytest.raises(OperandError, match="does not match"):
        disp.bind(p, quantize(torch.randn(64, 2048)))
    bt = disp.bind(p, quantize(torch.randn(128, 2048)))
    with pytest.raises(OperandError, match="expected M x 2048"):
        bt(bf16(3, 1024))
    assert bt(bf16(3, 2048)).shape == (3, 128)


def test_fp4linear_refuses_x_of_another_k(disp):
    f = FP4Linear(quantize(torch.randn(128, 256)), dispatcher=disp)
    with pytest.raises(OperandError, match=r"x is 2x128, expected \.\.\. x 256"):
        f(bf16(2, 128))


def test_out_of_the_wrong_shape_is_refused(disp):
    w = quantize(torch.randn(128, 256))
    out = torch.empty(4, 64, dtype=torch.bfloat16)
    with pytest.raises(OperandError, match="out is 4x64, expected 4x128"):
        disp((4, 128, 256))(bf16(4, 256), w, out=out)


# ------------------------------------------------------------------------------- MoE contract

MOE = Problem.moe(64, 128, experts=4, top_k=2)
MOE_MEMBERS = [
    pytest.param(T, "cpu", id="torch"),
    pytest.param(Tactic("triton", kernel="moe_w4a16", block_m=16, block_n=32, block_k=128, num_warps=4,
                        num_stages=3), "cuda", id="triton-moe_w4a16", marks=pytest.mark.gpu),
    pytest.param(Tactic("triton", kernel="moe_decode", route="direct", block_m=16, block_n=32, block_k=128,
                        split_k=1, num_warps=4, num_stages=3), "cuda", id="triton-moe_decode-direct",
                 marks=pytest.mark.gpu),
    pytest.param(Tactic("triton", kernel="moe_decode", route="aligned", block_m=16, block_n=32, block_k=128,
                        split_k=1, num_warps=4, num_stages=3), "cuda", id="triton-moe_decode-aligned",
                 marks=pytest.mark.gpu),
]


def _moe_ref(x, w, ids):
    out = torch.zeros(x.shape[0], ids.shape[1], w.n, dtype=torch.float64)
    for i in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            if e >= 0:
                out[i, j] = x[i].double() @ w.expert(e).dequantize(torch.float64).T
    return out


@pytest.mark.parametrize("tactic,device", MOE_MEMBERS)
def test_moe_minus_one_is_a_zero_row(tactic, device):
    torch.manual_seed(0)
    w = quantize(torch.randn(4, 64, 128)).to(device)
    x = bf16(5, 128).to(device)
    ids = torch.tensor([[0, -1], [-1, -1], [3, 1], [2, -1], [-1, 0]], device=device)
    fam = registry.get(tactic.family)
    launch = fam.bind(MOE, tactic, fam.pack(fam.layout(tactic), w), device)
    y = launch(x, ids).double().cpu()
    ref = _moe_ref(x.cpu(), w.to("cpu"), ids.cpu())
    assert torch.equal(y[ids.cpu() < 0], torch.zeros_like(y[ids.cpu() < 0]))
    keep = ids.cpu() >= 0
    err = (y[keep] - ref[keep]).norm() / ref[keep].norm()
    assert err < 1e-2, err


@pytest.mark.parametrize("tactic,device", [p for p in MOE_MEMBERS if p.id == "torch"])
def test_moe_ids_past_the_expert_count_are_an_error(tactic, device):
    w = quantize(torch.randn(4, 64, 128))
    fam = registry.get(tactic.family)
    launch = fam.bind(MOE, tactic, fam.pack(fam.layout(tactic), w), device)
    with pytest.raises(OperandError, match=r"expert id 4 outside \[-1, 4\)"):
        launch(bf16(2, 128), torch.tensor([[0, 4], [1, 2]]))
    with pytest.raises(OperandError, match=r"expert id -2 outside"):
        launch(bf16(2, 128), torch.tensor([[0, -2], [1, 2]]))


def test_fp4moe_layer_minus_one_and_bad_routing(disp):
    torch.manual_seed(1)
    w = quantize(torch.randn(4, 64, 128))
    layer = FP4GroupedGEMM(w, top_k=2, dispatcher=disp)
    x, ids = bf16(3, 128), torch.tensor([[1, -1], [-1, -1], [0, 3]])
    y = layer(x, ids)
    assert y.shape == (3, 2, 64) and not y[0, 1].any() and not y[1].any() and y[2].abs().sum() > 0
    with pytest.raises(OperandError, match="topk_ids is 3x1, expected 3x2"):
        layer(x, ids[:, :1])
    with pytest.raises(OperandError, match="topk_ids must be an integer tensor"):
        layer(x, ids.float())


def test_check_operands_names_both_shapes():
    p = Problem.moe(64, 128, experts=4, top_k=2)
    with pytest.raises(OperandError, match=r"weight packed 3x64x64 does not match the problem's 4x64x64"):
        check_operands(p, bf16(1, 128), quantize(torch.randn(3, 64, 128)), torch.zeros(1, 2, dtype=torch.long))


_INTERP = textwrap.dedent("""
    import json, sys, torch
    from autotune.core.formats import quantize
    from autotune.core.problem import Problem
    from autotune.core.tactic import Tactic
    from autotune.tactics import registry
    torch.manual_seed(0)
    p = Problem.moe(64, 128, experts=4, top_k=2)
    t = Tactic.from_json(sys.argv[1])
    fam = registry.get(t.family)
    w = quantize(torch.randn(4, 64, 128))
    launch = fam.bind(p, t, fam.pack(fam.layout(t), w), "cpu")
    x = torch.randn(5, 128).to(torch.bfloat16)
    ids = torch.tensor([[0, -1], [-1, -1], [3, 1], [2, -1], [-1, 0]])
    y = launch(x, ids).double()
    ref = torch.zeros(5, 2, 64, dtype=torch.float64)
    for i in range(5):
        for j in range(2):
            if int(ids[i, j]) >= 0:
                ref[i, j] = x[i].double() @ w.expert(int(ids[i, j])).dequantize(torch.float64).T
    keep = ids >= 0
    print(json.dumps([bool((y[~keep] == 0).all()), float((y[keep] - ref[keep]).norm() / ref[keep].norm())]))
""")


@pytest.mark.parametrize("tactic", [p.values[0] for p in MOE_MEMBERS if p.values[1] == "cuda"],
                         ids=[p.id for p in MOE_MEMBERS if p.values[1] == "cuda"])
def test_moe_minus_one_in_the_triton_interpreter(tactic):
    """The same contract for the GPU members, run by Triton's interpreter on the CPU."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERP, tactic.to_json()], cwd=root, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    zero_rows, err = json.loads(r.stdout.strip().splitlines()[-1])
    assert zero_rows and err < 1e-2, (zero_rows, err)
