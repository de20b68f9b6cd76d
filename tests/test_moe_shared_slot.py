"""A shared expert folded in without concatenation (docs/fp4moe.md#the-shared-expert-folded-or-apart): cuda `moe_mma` takes
`shared_slot=True`, then topk_ids / topk_weights are [M, top_k - 1] and the kernel adds expert E - 1
as every token's last slot with weight 1 (moe_mma.cu pair_id / pair_weight; moe_emulate.emulate is its CPU
port). FP4MoE(fold_shared=True) uses it where both of its launchers take it, and concatenates the
slot otherwise. Checked on the CPU through the cuda family's CPU port against float64 and against
the concatenated form; the kernel itself against the concatenated form in tests/test_cuda_moe_gpu.py."""
import dataclasses
import warnings

import pytest
import torch

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE
from autotune.tactics.cuda import layout as L
from autotune.tactics.cuda import moe as MOE

E, H, I, TOP_K = 4, 256, 128, 2
T13 = Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=2, m_tiles=1, split_k=2)
T2 = Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1)


@pytest.fixture
def fam(register_family):
    register_family("cudamoecpu", "tests.families.cuda_moe_cpu:CudaMoeCpu")
    from tests.families import cuda_moe_cpu
    return cuda_moe_cpu


def _block(tmp_path, expert_map=None, seed=0, one_copy=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(tmp_path / "none.db", env=cpu(), arch=ARCHS["sm90"], record_misses=False, warn=False,
                       one_copy=one_copy)
    g = torch.Generator().manual_seed(seed)
    routed = [torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g) * 2, torch.randn(E, H, I, generator=g)]
    shared = [torch.randn(I, H, generator=g) * 0.5, torch.randn(I, H, generator=g), torch.randn(H, I, generator=g)]
    blk = FP4MoE.from_float(*routed, TOP_K, dispatcher=d, expert_map=expert_map,
                            shared=FP4MoE.shared_from_float(*shared), fold_shared=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d.pin(blk.problem13, T13)
        d.pin(blk.problem2, T2)
    return blk, [quantize(w) for w in routed], [quantize(w) for w in shared]


def _ref(x, routed, shared, ids_local, tw):
    """float64: Σ_j tw · expert(ids[j]) + the shared expert, from the quantized weights."""
    mlp = lambda g, u, d, v: d @ (torch.nn.functional.silu(g @ v) * (u @ v))  # noqa: E731
    g, u, d = (w.dequantize(torch.float64) for w in routed)
    sg, su, sd = (w.dequantize(torch.float64) for w in shared)
    y = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for i in range(x.shape[0]):
        xi = x[i].double()
        y[i] = mlp(sg, su, sd, xi)
        for j in range(ids_local.shape[1]):
            e = int(ids_local[i, j])
            if e >= 0:
                y[i] += float(tw[i, j]) * mlp(g[e], u[e], d[e], xi)
    return y


def test_the_slot_is_added_by_the_kernel_and_matches_float64(tmp_path, fam, monkeypatch):
    blk, routed, shared = _block(tmp_path)
    assert blk.problem13 == Problem.moe(2 * I, H, E + 1, TOP_K + 1, epilogue="swiglu")
    seen = []
    real = fam._CpuMoeRun.__call__

    def spy(self, x, w, ids, tw=None, out=None, shared_slot=False, **extra):
        seen.append((tuple(ids.shape), shared_slot))
        return real(self, x, w, ids, tw, out, shared_slot=shared_slot, **extra)
    monkeypatch.setattr(fam._CpuMoeRun, "__call__", spy)
    x = torch.randn(5, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [3, -1], [2, 0], [-1, -1], [1, 3]], dtype=torch.int32)
    tw = torch.rand(5, TOP_K)
    y = blk(x, ids, tw)
    assert seen == [((5, TOP_K), True)] * 2           # both kernels, the ids as given: nothing concatenated
    ref = _ref(x, routed, shared, ids, tw)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert float((y[3].double() - ref[3]).norm() / ref[3].norm()) < 1e-2     # the shared expert alone
    # the concatenated form (a launcher without the slot) gives the same bits: the same pairs, the same order
    seen.clear()
    monkeypatch.setattr(fam._CpuMoeRun, "caps", dataclasses.replace(fam._CpuMoeRun.caps, shared_slot=False))
    blk2, _, _ = _block(tmp_path / "b")
    assert not blk2.bound13.launcher(5).caps.shared_slot
    assert torch.equal(blk2(x, ids, tw), y) and seen == [((5, TOP_K + 1), False)] * 2


def test_the_shared_experts_own_id_is_refused_in_topk_ids(tmp_path, fam):
    blk, _, _ = _block(tmp_path, seed=1)
    x = torch.randn(3, H).to(torch.bfloat16)
    y = blk(x, torch.tensor([[0, 1], [E, 1], [-2, 0]]), torch.rand(3, TOP_K))   # E: the shared expert's slot
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).all() and not torch.isnan(y[0]).any()
    assert blk.routing_errors() == [blk.label]


def test_an_expert_map_still_goes_through_the_id_table(tmp_path, fam):
    emap = torch.tensor([3, -1, 0, 1, -1, 2])       # global ids 0..5 → local, -1: not on this rank
    blk, routed, shared = _block(tmp_path, expert_map=emap, seed=2)
    x = torch.randn(4, H).to(torch.bfloat16)
    ids, tw = torch.tensor([[0, 1], [4, 2], [5, 3], [6, 0]]), torch.rand(4, TOP_K)    # 6: outside [-1, 6)
    y = blk(x, ids, tw)
    ok = [0, 1, 2]
    ref = _ref(x[ok], routed, shared, blk.local_ids(ids)[ok], tw[ok])
    assert float((y[ok].double() - ref).norm() / ref.norm()) < 1e-2
    assert torch.isnan(y[3]).all() and blk.routing_errors() == [blk.label]


def test_the_launch_check_takes_top_k_minus_one_columns_only_with_the_slot():
    p = Problem.moe(64, 256, 5, 3, epilogue="swiglu")
    w = L.pack_experts(quantize(torch.randn(5, 64, 256)))
    x = torch.randn(2, 256).to(torch.bfloat16)
    short, full = torch.zeros(2, 2, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32)
    assert MOE.check_call(p, x, w, short, None, None, cuda=False, shared_slot=True)[0] == 2
    with pytest.raises(ValueError, match=r"topk_ids must be int32/int64 \[2, 2\]"):
        MOE.check_call(p, x, w, full, None, None, cuda=False, shared_slot=True)
    with pytest.raises(ValueError, match=r"topk_ids must be int32/int64 \[2, 3\]"):
        MOE.check_call(p, x, w, short, None, None, cuda=False)
    with pytest.raises(ValueError, match=r"topk_weights must be a float \[2, 2\]"):
        MOE.check_call(p, x, w, short, torch.rand(2, 3), None, cuda=False, shared_slot=True)
    one = Problem.moe(64, 256, 5, 1)
    with pytest.raises(ValueError, match="a shared slot needs top_k >= 2"):
        MOE.check_call(one, x, w, torch.zeros(2, 0, dtype=torch.int32), None, None, cuda=False, shared_slot=True)


def test_large_m_concatenates_the_slot_and_shares_one_alignment(tmp_path, fam, monkeypatch):
    """Above ALIGN_PAIRS pairs the launchers take moe_align's alignment, which a shared slot cannot
    use (its ids are not in topk_ids): FP4MoE then concatenates the slot and gives both launchers
    one alignment, the form the search timed; below, the kernel adds the slot. Both match float64."""
    blk, routed, shared = _block(tmp_path, seed=3)
    seen = []
    real = fam._CpuMoeRun.__call__

    def spy(self, x, w, ids, tw=None, out=None, shared_slot=False, aligned=None, **extra):
        seen.append((tuple(ids.shape), shared_slot, None if aligned is None else aligned.block_m))
        return real(self, x, w, ids, tw, out, shared_slot=shared_slot, aligned=aligned, **extra)
    monkeypatch.setattr(fam._CpuMoeRun, "__call__", spy)
    g = torch.Generator().manual_seed(4)
    for m, want in ((4, [((4, TOP_K), True, None)] * 2),
                    (90, [((90, TOP_K + 1), False, MOE.ALIGN_BLOCK_M)] * 2)):     # 270 pairs > 256
        seen.clear()
        x = torch.randn(m, H, generator=g).to(torch.bfloat16)
        ids = torch.stack([torch.randperm(E, generator=g)[:TOP_K] for _ in range(m)]).int()
        ids[::7, 0] = -1
        tw = torch.rand(m, TOP_K, generator=g)
        y = blk(x, ids, tw)
        assert seen == want, m
        ref = _ref(x, routed, shared, ids, tw)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2, m


def test_one_copy_packs_the_stacked_experts_in_place_and_matches_float64(tmp_path, fam):
    """A one-copy FP4MoE on the cuda grouped kernels holds the experts in their own bytes (GLM-5
    TP8's 75 layers with a second copy ran an H100 out of memory) and still matches float64."""
    from autotune.core.formats import held_layout
    from autotune.tactics.cuda import layout as L
    blk, routed, shared = _block(tmp_path, one_copy=True)
    x = torch.randn(5, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [3, -1], [2, 0], [-1, -1], [1, 3]], dtype=torch.int32)
    tw = torch.rand(5, TOP_K)
    y = blk(x, ids, tw)                   # the first call binds again under the pins
    for bt in (blk.bound13, blk.bound2):
        assert bt.layout == bt.held == L.LAYOUT and bt.extra_bytes == 0 and list(bt.packs) == [L.LAYOUT]
        assert held_layout(bt.packs[L.LAYOUT].packed) == L.LAYOUT
    ref = _ref(x, routed, shared, ids, tw)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    for refused in (blk.state_dict, lambda: blk.load_state_dict({})):   # the bytes are no checkpoint
        with pytest.raises(RuntimeError, match="one_copy packed them in place"):
            refused()
    moved = blk.to(torch.float32)         # moved (here: to itself) bytes are wrapped, never packed twice
    assert torch.equal(moved(x, ids, tw), y)
