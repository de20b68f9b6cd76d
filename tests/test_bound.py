"""Bound launchers (issue #17): bind-time checks, re-binding after `.to()`, outputs that never
alias, no per-call allocation with `out=` (counted, never timed), and, on a GPU, the direct launch
route bit for bit against Triton's own launch, under CUDA graphs and on two streams."""
from __future__ import annotations


import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.core.formats import quantize
from autotune.core.operands import OperandError
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.nn import FP4Linear
from autotune.tactics import registry, torch_ref
from autotune.tactics.triton_fp4 import kernel as tkernel
from autotune.tactics.triton_fp4.w4a16 import tactic as w4a16_tactic
from tests.helpers import quiet_dispatcher

P = Problem.dense(128, 256)
T_TORCH = Tactic("torch", dequant_dtype="bf16", chunk_n=0)
T_CHUNK = Tactic("torch", dequant_dtype="fp32", chunk_n=512)
T_SPLIT = w4a16_tactic(16, 32, 128, 1, 4, 3, 2)
T_DQ = Tactic("triton", kernel="dequant_cublas", block_n=32, block_k=256, num_warps=4)


def _disp(tmp_path) -> Dispatcher:
    return quiet_dispatcher(tmp_path / "none.db")


def _bind(family: str, tactic: Tactic, w, problem: Problem = P):
    fam = registry.get(family)
    return fam.bind(problem, tactic, fam.pack(fam.layout(tactic), w), "cpu")


class _Ops(TorchDispatchMode):
    """The aten ops a call runs whose output is new memory (views of an input do not count)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = func(*args, **(kwargs or {}))
        ins = {a.untyped_storage().data_ptr() for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)}
        outs = res if isinstance(res, (tuple, list)) else (res,)
        if any(isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in ins for o in outs):
            self.ops.append(str(func.overloadpacket.__name__))
        return res


class _NoKernel:
    """Stands in for a Triton JIT function: `fn[grid](...)` launches nothing (counts launches)."""

    def __init__(self):
        self.calls = 0

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls += 1
        return launch


# ---------------------------------------------------------------------------------- binding

@pytest.mark.parametrize("family, tactic", [("torch", T_TORCH), ("triton", T_SPLIT), ("triton", T_DQ),
                                            ("cutlass", None), ("cublaslt", None)])
def test_bind_rejects_a_weight_of_another_problem(family, tactic):
    fam = registry.get(family)
    tactic = tactic or fam.default(P, __import__("autotune.core.arch", fromlist=["ARCHS"]).ARCHS["sm120"])
    other = fam.pack(fam.layout(tactic), quantize(torch.randn(64, 256)))       # N = 64, not 128
    with pytest.raises(OperandError, match="weight packed 64x128 does not match the problem's 128x128"):
        fam.bind(P, tactic, other, "cpu")
    mx = fam.pack(fam.layout(tactic), quantize(torch.randn(128, 256), "mxfp4"))
    with pytest.raises(OperandError, match="weight format is mxfp4"):
        fam.bind(P, tactic, mx, "cpu")


@pytest.mark.parametrize("family, tactic", [("torch", T_TORCH), ("triton", T_SPLIT)])
def test_bound_launcher_takes_only_its_own_weight(family, tactic, monkeypatch):
    """The launcher has no weight argument: a weight passed where `out` goes is refused, and so is
    x of another K, dtype or device."""
    monkeypatch.setattr(tkernel, "w4a16_dequant_kernel", _NoKernel())
    w = quantize(torch.randn(128, 256))
    launch = _bind(family, tactic, w)
    x = torch.randn(3, 256).bfloat16()
    with pytest.raises(OperandError, match="out is 128x128, expected 3x128"):
        launch(x, quantize(torch.randn(128, 256)).packed)
    for bad, why in ((torch.randn(3, 512).bfloat16(), "x is 3x512, expected M x 256"),
                     (torch.randn(3, 256), "x is torch.float32, expected torch.bfloat16"),
                     (torch.randn(3, 256, device="meta").bfloat16(), "x is on meta, the weight on cpu")):
        with pytest.raises(OperandError, match=why):
            launch(bad)


def test_rebind_refuses_another_weight_and_keeps_the_old_binding(tmp_path):
    d = _disp(tmp_path)
    bt = d.bind(P, quantize(torch.randn(128, 256)))
    before = bt.launcher(3)
    with pytest.raises(OperandError, match="does not match the problem's 128x128"):
        bt.rebind(quantize(torch.randn(64, 256)))
    assert bt.launcher(3) is before and bt.weight.packed.shape == (128, 128)


def test_to_rebinds_onto_the_moved_buffers(tmp_path):
    torch.manual_seed(1)
    f = FP4Linear.from_linear(torch.nn.Linear(256, 128, bias=False), dispatcher=_disp(tmp_path))
    x = torch.randn(5, 256).bfloat16()
    y = f(x)
    old = f.bound.launcher(5)
    f.to("cpu")                                           # _apply: bound again even when nothing moved
    assert f.bound.launcher(5) is not old and f.bound.launcher(5).weight.packed.data_ptr() == f.packed.data_ptr()
    f._apply(torch.clone)                                 # what .to(device) does: new storage for every buffer
    new = f.bound.launcher(5)
    assert new.weight.packed.data_ptr() == f.packed.data_ptr() != old.weight.packed.data_ptr()
    assert torch.equal(f(x), y)


# --------------------------------------------------------------------------- outputs, allocations

@pytest.mark.parametrize("tactic", [T_TORCH, T_CHUNK])
def test_outputs_never_alias(tmp_path, tactic):
    w = quantize(torch.randn(128, 256))
    launch = _bind("torch", tactic, w)
    x1, x2 = torch.randn(4, 256).bfloat16(), torch.randn(4, 256).bfloat16()
    y1 = launch(x1)
    keep = y1.clone()
    y2 = launch(x2)
    assert y1.data_ptr() != y2.data_ptr() and torch.equal(y1, keep)
    f = FP4Linear(w, dispatcher=_disp(tmp_path))
    a, b = f(x1), f(x1)
    assert a.data_ptr() != b.data_ptr() and torch.equal(a, b)


def test_triton_bound_outputs_never_alias(monkeypatch):
    monkeypatch.setattr(tkernel, "w4a16_dequant_kernel", _NoKernel())
    launch = _bind("triton", T_SPLIT, quantize(torch.randn(128, 256)))
    x = torch.randn(4, 256).bfloat16()
    assert launch(x).data_ptr() != launch(x).data_ptr()


@pytest.mark.parametrize("family, tactic, cast", [("torch", T_TORCH, []), ("torch", T_CHUNK, ["_to_copy"]),
                                                  ("triton", T_SPLIT, [])])
def test_out_path_allocates_nothing(family, tactic, cast, monkeypatch):
    """With the kernel itself replaced by a no-op (the GPU work), a bound call with `out=` allocates
    nothing (the fp32 tactic's cast of x is its kernel's work); without `out=` exactly the output."""
    fake = _NoKernel()
    monkeypatch.setattr(tkernel, "w4a16_dequant_kernel", fake)
    monkeypatch.setattr(torch_ref, "_slab", lambda *a: None)
    p = Problem.dense(1024, 256)                          # N = 2 chunks of 512 for T_CHUNK
    launch = _bind(family, tactic, quantize(torch.randn(1024, 256)), p)
    x = torch.randn(4, 256).bfloat16()
    out = torch.empty(4, 1024, dtype=torch.bfloat16)
    launch(x, out=out)                                    # first call: the split-K scratch is made once
    with _Ops() as seen:
        for _ in range(3):
            assert launch(x, out=out) is out
    assert seen.ops == cast * 3, seen.ops
    with _Ops() as seen:
        launch(x)
    assert seen.ops in (["new_empty"] + cast, ["empty"] + cast), seen.ops
    assert fake.calls == (5 if family == "triton" else 0)


def test_torch_bound_matches_the_unbound_kernel():
    w = quantize(torch.randn(1024, 256))
    for t in (T_TORCH, T_CHUNK):
        fam = registry.get("torch")
        x = torch.randn(7, 256).bfloat16()
        unbound = fam.build(Problem.dense(1024, 256), t, "cpu")(x, w)
        assert torch.equal(_bind("torch", t, w, Problem.dense(1024, 256))(x), unbound)


# ------------------------------------------------------------------------------ direct route

def test_direct_route_guard(monkeypatch):
    """Checked at bind: Triton version, $AUTOTUNE_LAUNCH, the interpreter, launch hooks."""
    from triton import knobs

    from autotune.tactics.triton_fp4 import direct
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("AUTOTUNE_LAUNCH", raising=False)
    monkeypatch.setattr(direct, "_version_ok", lambda: True)
    assert direct.why_not() is None                       # Triton's own empty hook chain is no hook
    monkeypatch.setenv("AUTOTUNE_LAUNCH", "triton")
    assert direct.why_not() == "AUTOTUNE_LAUNCH=triton"
    monkeypatch.delenv("AUTOTUNE_LAUNCH")
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", lambda *a: None)
    assert direct.why_not() == "a Triton launch hook is installed"
    monkeypatch.undo()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)      # undo restored the caller's environment
    monkeypatch.delenv("AUTOTUNE_LAUNCH", raising=False)
    monkeypatch.setattr(direct, "_version_ok", lambda: False)
    assert "is not one of" in direct.why_not()
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert direct.why_not() == "TRITON_INTERPRET=1"
    assert not _bind("triton", T_SPLIT, quantize(torch.randn(128, 256))).direct      # a CPU weight: never


def test_constexpr_tail_in_declaration_order():
    from autotune.tactics.triton_fp4 import direct
    from autotune.tactics.triton_fp4.w4a16 import kernel_consts
    consts = kernel_consts("nvfp4", T_SPLIT.params)
    assert direct.constexprs(tkernel.w4a16_dequant_kernel, 10, consts) == \
        [consts[c] for c in tkernel.CONSTEXPRS]
    with pytest.raises(ValueError, match="no value for DOT_F32"):
        direct.constexprs(tkernel.w4a16_dequant_kernel, 10, {k: v for k, v in consts.items() if k != "DOT_F32"})


# ------------------------------------------------------------------------------------- H200

def _direct_pair(problem: Problem, tactic: Tactic, m: int, seed: int = 0):
    """(direct-route launcher, Triton-route launcher, x) on the GPU for one weight."""
    import os
    torch.manual_seed(seed)
    fam = registry.get("triton")
    w = quantize(torch.randn(problem.n, problem.k)).to("cuda")
    packed = fam.pack(fam.layout(tactic), w)
    fast = fam.bind(problem, tactic, packed, "cuda")
    os.environ["AUTOTUNE_LAUNCH"] = "triton"
    try:
        slow = fam.bind(problem, tactic, packed, "cuda")
    finally:
        del os.environ["AUTOTUNE_LAUNCH"]
    assert fast.direct and not slow.direct
    return fast, slow, torch.randn(m, problem.k, device="cuda").bfloat16()


@pytest.mark.gpu
@pytest.mark.parametrize("tactic", [T_SPLIT, w4a16_tactic(64, 64, 128, 8, 4, 3), T_DQ])
@pytest.mark.parametrize("m", [1, 3, 40])
def test_direct_route_is_bit_identical_to_triton_launch(tactic, m):
    fast, slow, x = _direct_pair(Problem.dense(256, 512), tactic, m)
    for _ in range(2):                                     # first call plans, second uses the plan
        y = fast(x)
        assert torch.equal(y, slow(x))
    out = torch.full_like(y, float("nan"))
    assert fast(x, out=out) is out and torch.equal(out, y)
    assert fast.launches[0] == 3 and slow.launches[0] == 0


@pytest.mark.gpu
def test_direct_route_under_graphs_and_two_streams():
    fast, slow, x = _direct_pair(Problem.dense(256, 512), T_SPLIT, 2)
    ref = slow(x)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    for s in (s1, s2):
        s.wait_stream(torch.cuda.current_stream())
    ys = []
    for i in range(20):                                    # interleaved: split-K scratch is per stream
        with torch.cuda.stream(s1 if i % 2 else s2):
            ys.append(fast(x))
    torch.cuda.synchronize()
    assert all(torch.equal(y, ref) for y in ys)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fast(x)
    for seed in range(3):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x, dtype=torch.float32).bfloat16())
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, slow(x))


@pytest.mark.gpu
def test_unbound_launcher_binds_a_weight_seen_twice():
    """dispatch((M, N, K))(x, w): the second call with the same weight object binds it; the bound
    route gives Triton's bits."""
    p, fam = Problem.dense(256, 512), registry.get("triton")
    x = torch.randn(3, 512, device="cuda").bfloat16()
    w = quantize(torch.randn(256, 512)).to("cuda")
    kernel = fam.build(p, T_SPLIT, "cuda")
    ys = [kernel(x, w) for _ in range(3)]
    assert kernel._bound is not None and kernel._bound.source is w and kernel._bound.launches[0] == 2
    ref = fam.bind(p, T_SPLIT, fam.pack(fam.layout(T_SPLIT), w), "cuda")
    ref.direct = False                                     # Triton's own launch
    assert all(torch.equal(y, ref(x)) for y in ys)


def test_scratch_retires_less_than_it_keeps():
    """Buffers a larger M outgrows are kept (a captured graph may point at them), so growth at least
    doubles: over 100 ascending sizes the retired ones add up to less than the live buffer, and a
    launcher without split-K keeps 4-element scratch whatever M is."""
    from autotune.tactics.scratch import ScratchPool
    s = ScratchPool()
    for n in range(10, 1010, 10):
        b = s.get(0, "ws", n, torch.float32, torch.device("cpu"))
        assert b.numel() >= n
    assert len(s.retired) < 10 and sum(r.numel() for r in s.retired) < b.numel()
    launcher = registry.get("triton").build(Problem.dense(256, 1024), T_SPLIT, "cpu")
    for tiles in (2, 40, 400):
        ws, locks = launcher._scratch(1, tiles, torch.device("cpu"))
        assert ws.numel() == 4 and locks.numel() == 4
