"""The grouped launchers' repeat path (tactics/cuda/moe_plan.py) and the layer-side fast checks
(operands.routing_checker, x_checker's shape past M, FP4MoE's per-M forms), on CPU tensors with the
launch captured: a planned call passes the whole way's arguments, anything off the plan takes the
whole way (its one-line errors), and the checks accept and refuse what the full checks do."""
from __future__ import annotations

import pytest
import torch

from autotune.core import inputs
from autotune.core.operands import OperandError, check_routing, routing_checker, x_checker
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda import moe_plan as MP
from autotune.tactics.cuda.moe_tok import TokLaunch
from autotune.tactics.scratch import ScratchPool

W13 = Problem.moe(64, 512, 6, 3, epilogue="swiglu")
W2R = Problem.moe(64, 512, 6, 3, epilogue="reduce")
MMA = Tactic("cuda", kernel="moe_mma", m_tiles=1, warps_k=2, stages=2, tiles_n=2, split_k=2)
MMA1 = Tactic("cuda", kernel="moe_mma", m_tiles=1, warps_k=1, stages=2, tiles_n=1, split_k=1)
TOK = Tactic("cuda", kernel="moe_tok", warps_k=2, stages=2, tiles_n=2)


def _captured(base):
    class Captured(base):
        """The real launcher on CPU tensors: the CUDA device check off, the launch recorded."""
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.calls, self.checks = [], 0

        def check(self, x, w, topk_ids, topk_weights, out, **shared):
            self.checks += 1
            return MOE.check_call(self.problem, x, w, topk_ids, topk_weights, out, cuda=False, **shared)

        def _run(self, dev):
            return lambda grid, block, args, stream: self.calls.append((grid, block, args, stream))
    return Captured


MoeRec, TokRec = _captured(MOE.MoeLaunch), _captured(TokLaunch)


def _operands(prob, m, seed, ids_dtype=torch.int64, shared_slot=False, routed=True):
    g = torch.Generator().manual_seed(seed)
    cols = prob.top_k - 1 if shared_slot else prob.top_k
    shape = (m, prob.top_k, prob.k) if prob.epilogue == "reduce" else (m, prob.k)
    x = torch.randn(*shape, generator=g).to(torch.bfloat16)
    ids = torch.randint(-1, prob.experts - (1 if shared_slot else 0), (m, cols), generator=g).to(ids_dtype)
    tw = torch.rand(m, cols, generator=g) if routed else None
    return x, ids, tw


def _weight(prob, seed=1):
    return L.pack_experts(inputs.seeded_weight(prob, "cpu", seed).contiguous())


CASES = [(MoeRec, W13, MMA, {}), (MoeRec, W13, MMA1, {"routed": False}), (MoeRec, W2R, MMA, {}),
         (MoeRec, W2R, MMA1, {"shared_slot": True}), (MoeRec, W13, MMA, {"ids_dtype": torch.int32}),
         (TokRec, W2R, TOK, {}), (TokRec, W2R, TOK, {"shared_slot": True, "ids_dtype": torch.int32}),
         (TokRec, W2R, TOK, {"routed": False})]


@pytest.mark.parametrize("cls,prob,tactic,kw", CASES)
@pytest.mark.parametrize("m", [1, 3])
def test_a_planned_call_passes_the_whole_ways_arguments(cls, prob, tactic, kw, m):
    run, w = cls(prob, tactic, "cpu"), _weight(prob)
    slot = {"shared_slot": True} if kw.get("shared_slot") else {}
    x, ids, tw = _operands(prob, m, 0, **kw)
    run(x, w, ids, tw, **slot)                                  # the first call: the whole way, a plan left
    assert run.checks == 1 and len(run._plans) == 1
    for seed in (1, 2):
        x, ids, tw = _operands(prob, m, seed, **kw)
        checks = run.checks
        y = run(x, w, ids, tw, **slot)
        assert run.checks == checks                             # planned: no whole-way check
        planned = run.calls[-1]
        run._forget()                                           # the same call the whole way
        y2 = run(x, w, ids, tw, **slot)
        whole = run.calls[-1]
        assert run.checks == checks + 1 and len(run._plans) == 1
        assert planned[0] == whole[0] and planned[1] == whole[1] and planned[3] == whole[3]
        a, b = list(planned[2]), list(whole[2])
        assert a[MP.OUT] == y.data_ptr() and b[MP.OUT] == y2.data_ptr()
        a[MP.OUT] = b[MP.OUT] = 0
        assert a == b and [type(v) for v in a] == [type(v) for v in b]
        assert a[MP.X] == x.data_ptr() and a[MP.IDS] == ids.data_ptr()
        assert a[MP.TW] == (tw.data_ptr() if tw is not None else run.bad.data_ptr())
        assert y.shape == y2.shape and y.dtype == torch.bfloat16


def _off_plan(prob, m):
    """Calls a plan made at (m, int64 ids, fp32 weights) must not take, each with what it changes."""
    x, ids, tw = _operands(prob, m, 5)
    wide = torch.zeros(x.numel() + 8, dtype=torch.bfloat16)[1:1 + x.numel()].view(x.shape)    # 2-byte offset
    return [("x bf16 -> fp16 is refused", (x.half(), ids, tw), {}, True),
            ("x not contiguous", (x.transpose(-1, -2).contiguous().transpose(-1, -2), ids, tw), {}, False),
            ("x not 16-byte aligned", (wide.copy_(x), ids, tw), {}, False),
            ("ids int32 (another form)", (x, ids.int(), tw), {}, False),
            ("ids not contiguous", (x, ids.t().contiguous().t(), tw), {}, False),
            ("ids shape", (x, ids[:, :2].contiguous(), tw), {}, True),
            ("ids float", (x, ids.float(), tw), {}, True),
            ("ids on meta (the index -1 the CPU's too)", (x, ids.to("meta"), tw), {}, True),
            ("weights on meta", (x, ids, tw.to("meta")), {}, True),
            ("weights bf16 (cast)", (x, ids, tw.bfloat16()), {}, False),
            ("weights shape", (x, ids, tw[:, :1].contiguous()), {}, True),
            ("weights int", (x, ids, ids.clone()), {}, True),
            ("out given", (x, ids, tw), {"out": "given"}, False)]


@pytest.mark.parametrize("cls,prob,tactic", [(MoeRec, W2R, MMA), (TokRec, W2R, TOK), (MoeRec, W13, MMA1)])
def test_a_call_off_the_plan_takes_the_whole_way(cls, prob, tactic):
    run, w = cls(prob, tactic, "cpu"), _weight(prob)
    x, ids, tw = _operands(prob, 2, 0)
    run(x, w, ids, tw)
    for why, (x, ids, tw), kw, raises in _off_plan(prob, 2):
        checks = run.checks
        if kw.get("out"):
            kw = {"out": torch.empty(MOE.check_call(prob, x, w, ids, tw, None, cuda=False)[1].shape,
                                     dtype=torch.bfloat16)}
        if raises:
            with pytest.raises(ValueError) as e:
                run(x, w, ids, tw, **kw)
            assert "\n" not in str(e.value), why
        else:
            run(x, w, ids, tw, **kw)
        assert run.checks == checks + 1, why
    x, ids, tw = _operands(prob, 2, 6)
    run(x, w, ids, tw)                                          # "ids int32" left its plan for this key
    checks = run.checks
    run(x, w, ids, tw)
    assert run.checks == checks                                 # planned again
    w2 = _weight(prob, seed=3)                                  # another weight object: the whole way
    run(x, w2, ids, tw)
    assert run.checks == checks + 1 and run._plan_w() is w2
    run.check_ids = True                                        # the opt-in raise: never planned
    run(x, w2, ids, tw)
    assert run.checks == checks + 2
    run.check_ids = False
    if cls is MoeRec:
        with pytest.raises(ValueError):                         # aligned= is the whole way's to check
            run(x, w2, ids, tw, aligned=object())


def test_the_pool_attach_and_release_retire_plans():
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    x, ids, tw = _operands(W13, 2, 0)
    run(x, w, ids, tw)
    pool = run.scratch
    pool.epoch += 1                                             # a trim freed buffers: pointers stale
    run(x, w, ids, tw)
    assert run.checks == 2
    run(x, w, ids, tw)
    assert run.checks == 2
    pool.dirty.add(("cuda:0", 12345, "splitk.locks"))           # another stream's (a capture's): still planned
    run(x, w, ids, tw)
    assert run.checks == 2
    pool.dirty.add(("cpu", 0, "splitk.locks"))                  # this stream's, zeroed under capture, still to zero
    run(x, w, ids, tw)
    assert run.checks == 3
    pool.dirty.clear()
    shared = ScratchPool()
    run.attach(shared)                                          # the dispatcher's pool: plans forgotten
    assert run._plans == {} and run.scratch is shared
    run(x, w, ids, tw)
    assert run.checks == 4 and run.calls[-1][2][7] == shared.bufs[("cpu", 0, "splitk.ws")].data_ptr()
    run.release()
    assert run._plans == {}


def test_the_routing_checker_accepts_and_refuses_what_check_routing_does():
    p = Problem.moe(64, 128, 6, 3)
    check = routing_checker(p)
    x = torch.randn(2, 128).to(torch.bfloat16)
    ids, tw = torch.zeros(2, 3, dtype=torch.int64), torch.rand(2, 3)
    good = [(ids, tw), (ids.int(), None), (ids.to(torch.int16), tw.half()), (ids[:, :3], tw.double())]
    bad = [(ids.float(), tw), (ids.bool(), tw), (ids[:, :2], tw), (ids.reshape(3, 2), tw), ([[0, 1, 2]] * 2, tw),
           (ids, tw[:, :2]), (ids, ids), (ids, [[0.5] * 3] * 2), (ids.to("meta"), tw), (ids, tw.to("meta")),
           (torch.zeros(1, 3, dtype=torch.int64), tw)]
    for i, t in good:
        check(x, i, t)
        check_routing(p, x, i, t, values=False)
    for i, t in bad:
        with pytest.raises(OperandError) as e:
            check_routing(p, x, i, t, values=False)
        with pytest.raises(OperandError) as e2:
            check(x, i, t)
        assert str(e.value) == str(e2.value) and "\n" not in str(e2.value)
    with pytest.raises(OperandError):                           # x on meta, ids on the CPU: both read -1
        check(x.to("meta"), ids, tw)


def test_x_checker_takes_the_reduce_variants_rows_per_pair():
    w = _weight(W2R)
    check, check13 = x_checker(W2R, w), x_checker(W13, _weight(W13))
    check(torch.zeros(2, 3, 512, dtype=torch.bfloat16))
    check13(torch.zeros(2, 512, dtype=torch.bfloat16))
    for bad in (torch.zeros(2, 128, dtype=torch.bfloat16), torch.zeros(2, 2, 128, dtype=torch.bfloat16),
                torch.zeros(2, 3, 64, dtype=torch.bfloat16), torch.zeros(2, 3, 512, dtype=torch.int32),
                torch.zeros(2, 3, 512, dtype=torch.bfloat16, device="meta"), "x"):
        with pytest.raises(OperandError):
            check(bad)
    for bad in (torch.zeros(2, 64, dtype=torch.bfloat16), torch.zeros(128, dtype=torch.bfloat16)):
        with pytest.raises(OperandError):
            check13(bad)


def test_a_plan_pins_no_weight():
    """Plans and the pack cache's alignment memo hold the weight weakly: a launcher or kernel kept past
    its job (a worker's compiled kernels) frees the packs it ran on."""
    import gc
    import weakref

    from autotune.tactics.cuda.family import _PackCache
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    cache = _PackCache()
    x, ids, tw = _operands(W13, 1, 0)
    run(x, cache(w), ids, tw)
    assert cache(w) is w and run._plans
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None
    w2 = _weight(W13, seed=4)
    checks = run.checks
    run(x, cache(w2), ids, tw)
    assert run.checks == checks + 1 and run._plan_w() is w2


def test_a_pack_whose_storage_was_swapped_takes_the_whole_way():
    """`.data =` on a pack's tensor keeps the object and moves its storage: the plan's weight pointers
    are re-read against it, and the whole way launches on the new storage."""
    run, w = MoeRec(W13, MMA, "cpu"), _weight(W13)
    x, ids, tw = _operands(W13, 1, 0)
    run(x, w, ids, tw)
    run(x, w, ids, tw)
    assert run.checks == 1
    for t in (w.packed, w.scales, w.global_scale):
        t.data = t.data.clone()
        checks = run.checks
        run(x, w, ids, tw)
        assert run.checks == checks + 1 and run.calls[-1][2][:2] == (w.packed.data_ptr(), w.scales.data_ptr())
        assert run.calls[-1][2][4] == w.global_scale.data_ptr()


def test_the_host_benchs_empty_kernel_takes_moe_mmas_arguments():
    """bench/moe_host.py times one launch of an empty kernel as the launch part of a forward: it must
    take what moe_mma takes (pdl.signature: the buffer the launch packs)."""
    import importlib.util

    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import pdl
    from tests.helpers import ROOT
    spec = importlib.util.spec_from_file_location("moe_host", ROOT / "bench" / "moe_host.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert pdl.signature(bench.EMPTY, "empty_moe") == pdl.signature(B.text(MOE.config(W13, MMA)), "moe_mma")
