"""The one input contract (docs/serving.md "Accepted inputs"): this test reads that table and runs
every entry against it with every candidate dtype — accepted ones compute the right product,
refused ones raise one OperandError line before any cast (f11bb21: FP4Linear and FP4GroupedGEMM
cast an int8 activation to bf16 and back and returned garbage)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.operands import KERNEL_X, LAYER_X, OperandError, check_operands
from autotune.core.problem import Problem
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.nn import FP4GroupedGEMM, FP4Linear, FP4MLP, FP4MoE

DOC = Path(__file__).resolve().parent.parent / "docs" / "serving.md"
CANDIDATES = ("bfloat16", "float16", "float32", "float64", "float8_e4m3fn", "int8", "uint8", "int32", "int64",
              "bool")
N, K, E, TOP_K = 32, 64, 4, 2


def contract() -> dict[str, set[str]]:
    text = DOC.read_text()
    block = text.split("<!-- input-contract:", 1)[1].split("<!-- end input-contract -->", 1)[0]
    rows = {}
    for line in block.splitlines():
        m = re.match(r"\|\s*`([^`]+)`\s*\|\s*([^|]+)\|", line)
        if m:
            rows[m.group(1)] = {d.strip() for d in m.group(2).split(",")}
    return rows


@pytest.fixture(scope="module")
def disp(tmp_path_factory):
    return Dispatcher(tmp_path_factory.mktemp("c") / "none.db", env=cpu(), arch=ARCHS["cpu"], record_misses=False,
                      warn=False)


def _x(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(*shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        return torch.randint(0, 100, shape, generator=g).to(dtype)     # in range for uint8 too
    return torch.randn(*shape, generator=g).to(dtype)


def _ids(m: int) -> torch.Tensor:
    return (torch.arange(m * TOP_K).reshape(m, TOP_K) % E).to(torch.int32)


def _entries(disp):
    """entry name -> (call(x), reference(x) or None for a check-only row)."""
    torch.manual_seed(1)
    w = quantize(torch.randn(N, K))
    we = quantize(torch.randn(E, N, K))
    lin, gg = FP4Linear(w, dispatcher=disp), FP4GroupedGEMM(we, TOP_K, dispatcher=disp)
    moe = FP4MoE.from_float(torch.randn(E, 16, K), torch.randn(E, 16, K), torch.randn(E, K, 16), TOP_K,
                            dispatcher=disp)
    bound = disp.bind(Problem.dense(N, K), w)
    mlp = FP4MLP.from_float(torch.randn(16, K), torch.randn(16, K), torch.randn(K, 16), dispatcher=disp)
    tw = torch.full((3, TOP_K), 0.5)

    def bf(x):
        return x.to(torch.bfloat16)

    def w4a4(x):
        check_operands(Problem.dense(N, K, a_fmt="nvfp4"), x, w)

    def fp8(x):
        check_operands(Problem.dense(N, K, w_fmt="mxfp4", a_fmt="fp8"), x, quantize(torch.randn(N, K), "mxfp4"))

    return {
        "dispatch": (lambda x: disp((3, N, K))(x, w), None),
        "bound": (lambda x: bound(x), None),
        "kernel-w4a4": (w4a4, None),
        "kernel-fp8": (fp8, None),
        "FP4Linear": (lin, lambda x: lin(bf(x)).to(x.dtype)),
        "FP4GroupedGEMM": (lambda x: gg(x, _ids(3)), lambda x: gg(bf(x), _ids(3)).to(x.dtype)),
        "FP4MoE": (lambda x: moe(x, _ids(3), tw), lambda x: moe(bf(x), _ids(3), tw).to(x.dtype)),
        "FP4MLP": (mlp, lambda x: mlp(bf(x)).to(x.dtype)),
    }


def test_every_entry_follows_the_documented_table(disp):
    table = contract()
    entries = _entries(disp)
    assert set(table) == set(entries), "docs/serving.md's table and this test name the same entries"
    # the table says what the code's one place says
    assert table["FP4Linear"] == {str(d).removeprefix("torch.") for d in LAYER_X}
    assert table["kernel-fp8"] == {str(d).removeprefix("torch.") for d in KERNEL_X["fp8"]}
    accepted = refused = 0
    for name, (call, ref) in entries.items():
        for dt in CANDIDATES:
            x = _x(getattr(torch, dt), 3, K)
            if dt in table[name]:
                y = call(x)
                if ref is not None:
                    assert y.dtype == x.dtype and torch.equal(y, ref(x)), (name, dt)
                accepted += 1
            else:
                with pytest.raises(OperandError) as e:
                    call(x)
                assert "\n" not in str(e.value) and dt in str(e.value), (name, dt, str(e.value))
                refused += 1
    assert accepted == 1 + 1 + 1 + 2 + 4 * 3 and refused == len(entries) * len(CANDIDATES) - accepted   # 4 layers


def test_the_issue_case_int8_into_fp4linear_is_refused(disp):
    lin = FP4Linear(quantize(torch.randn(N, 256)), dispatcher=disp)
    with pytest.raises(OperandError, match=r"x is torch.int8; the FP4 layers take"):
        lin(torch.full((1, 256), 100, dtype=torch.int8))


@pytest.mark.parametrize("bad", [1.5, True, 0, -3, 2.0])
def test_dispatch_refuses_an_m_that_is_not_a_positive_int(disp, bad):
    w = quantize(torch.randn(N, K))
    disp((4, N, K))(_x(torch.bfloat16, 4, K), w)          # the (N, K) table is cached: the fast path
    with pytest.raises(ValueError, match="M must be a positive integer"):
        disp((bad, N, K))
    p = Problem.dense(N, K)
    disp(p, 4)
    with pytest.raises(ValueError, match="M must be a positive integer"):
        disp(p, bad)
    from autotune.runtime import dispatch as mod          # the module-level form has its own fast path
    mod.reset(disp)
    try:
        mod.dispatch((4, N, K))
        with pytest.raises(ValueError, match="M must be a positive integer"):
            mod.dispatch((bad, N, K))
    finally:
        mod.reset(None)


def test_routing_dtypes_are_part_of_the_contract(disp):
    gg = FP4GroupedGEMM(quantize(torch.randn(E, N, K)), TOP_K, dispatcher=disp)
    x = _x(torch.bfloat16, 3, K)
    for ids in (_ids(3).float(), _ids(3).bool()):
        with pytest.raises(OperandError, match="topk_ids must be an integer tensor"):
            gg(x, ids)
    with pytest.raises(OperandError, match="expert id 4 outside"):
        gg(x, torch.full((3, TOP_K), E, dtype=torch.int64))
