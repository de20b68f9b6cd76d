"""FP4MoE's whole-layer route (autotune/runtime/layer_route.py) on the CPU: where the cache holds a
measured one-launch winner for the block's layer problem at M's bucket, the block runs it on the packs
its two bindings hold (one call, the folded shared expert as its slot, ids checked by the kernel);
elsewhere the pair. The layer kernel is its CPU port (tests/families/cuda_layer_cpu.py), the pair the
grouped kernels' ports (tests/families/cuda_moe_cpu.py), both against float64."""
from __future__ import annotations

import warnings

import pytest
import torch

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.formats import quantize
from autotune.core.layer import LayerProblem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.moe import FP4MoE
from autotune.tactics import registry
from tests.helpers import keyed, make_cache

E, H, I, TOP_K = 4, 256, 128, 2
CPU = cpu()
SM90 = ARCHS["sm90"]          # the grouped kernels' and the layer kernel's verdicts (their ports run here)
LAYER_T = Tactic("cudalayercpu", kernel="moe_layer", warps_k=1, stages=2, tiles_n=2)
W13_T = Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=2, m_tiles=1, split_k=1)
W2_T = Tactic("cudamoecpu", kernel="moe_tok", warps_k=1, stages=2, tiles_n=2)


def _weights(seed: int):
    g = torch.Generator().manual_seed(seed)
    routed = [torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g), torch.randn(E, H, I, generator=g)]
    shared = [torch.randn(I, H, generator=g), torch.randn(I, H, generator=g), torch.randn(H, I, generator=g)]
    return routed, shared


def _reference(routed, shared, x, ids, tw):
    q = lambda w: quantize(w).dequantize(torch.float64)                    # noqa: E731
    gq, uq, dq = (q(w) for w in routed)
    ref = torch.zeros(x.shape[0], H, dtype=torch.float64)
    for i in range(x.shape[0]):
        v = x[i].double()
        if shared is not None:
            sg, su, sd = (q(w) for w in shared)
            ref[i] = sd @ (torch.nn.functional.silu(sg @ v) * (su @ v))
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            if e >= 0:
                ref[i] += float(tw[i, j]) * (dq[e] @ (torch.nn.functional.silu(gq[e] @ v) * (uq[e] @ v)))
    return ref


def _block(tmp_path, register_family, fold: bool, bucket: int, **dispatcher_kw):
    """A block whose pairs are pinned to the grouped ports and whose layer problem has the layer
    port as its measured winner at `bucket` (a cache row, as a `--moe-layers` search stores it)."""
    register_family("cudamoecpu", "tests.families.cuda_moe_cpu:CudaMoeCpu")
    register_family("cudalayercpu", "tests.families.cuda_layer_cpu:CudaLayerCpu")
    routed, shared = _weights(3)
    probe = FP4MoE.from_float(*routed, TOP_K, shared=FP4MoE.shared_from_float(*shared) if fold else None,
                              fold_shared=fold or None,
                              dispatcher=Dispatcher(tmp_path / "none.db", env=CPU, arch=SM90, record_misses=False,
                                                               warn=False))
    layer = LayerProblem.from_pair(probe.problem13, probe.problem2)
    lib, default = CPU.lib_key(("torch",)), registry.designated_default(layer, SM90, "cpu")
    db = make_cache(tmp_path / "c.db", [keyed(Winner(layer.key, bucket, CPU.device_key, LAYER_T.id, LAYER_T.family,
                                                     LAYER_T.to_json(), lib, 5.0, default.id, 9.0, 1.8))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(db, env=CPU, arch=SM90, record_misses=False, warn=False,
                       pins={probe.problem13.key: W13_T, probe.problem2.key: W2_T}, **dispatcher_kw)
    blk = FP4MoE.from_float(*routed, TOP_K, shared=FP4MoE.shared_from_float(*shared) if fold else None,
                            fold_shared=fold or None, dispatcher=d)
    return blk, routed, shared if fold else None, d, layer


@pytest.mark.parametrize("fold", [False, True])
def test_the_block_runs_a_measured_layer_winner_in_one_call(tmp_path, register_family, fold):
    from tests.families import cuda_layer_cpu
    blk, routed, shared, d, layer = _block(tmp_path, register_family, fold, bucket=3)
    assert d.rung_for(layer, 3) == ("exact", LAYER_T)
    g = torch.Generator().manual_seed(7)
    cuda_layer_cpu.CALLS.clear()
    for m, served in ((3, True), (2, False)):          # bucket 3 measured; M = 2: no exact layer winner
        x = torch.randn(m, H, generator=g).to(torch.bfloat16)
        ids = torch.randint(-1, E, (m, TOP_K), generator=g, dtype=torch.int32)
        tw = torch.rand(m, TOP_K, generator=g)
        before = len(cuda_layer_cpu.CALLS)
        y = blk(x, ids, tw)
        assert (len(cuda_layer_cpu.CALLS) == before + 1) == served, m
        ref = _reference(routed, shared, x, ids, tw)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert blk.layer_route.skipped == {}


def test_a_bad_id_through_the_layer_is_a_nan_row_and_a_routing_error(tmp_path, register_family):
    blk, *_ = _block(tmp_path, register_family, True, bucket=3)
    x = torch.randn(3, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 9], [3, -1]], dtype=torch.int32)
    y = blk(x, ids, torch.rand(3, TOP_K))
    assert torch.isnan(y[1]).all() and not torch.isnan(y[0]).any() and not torch.isnan(y[2]).any()
    assert blk.routing_errors() == [blk.label]
    assert blk.routing_errors() == []


def test_the_pair_serves_where_the_bindings_hold_another_layout(tmp_path, register_family):
    """The layer kernel reads the cuda pack; pairs pinned to the torch family hold the plain layout
    only, so the block keeps its pair at that M and says why (no copy of a weight is made)."""
    from tests.families import cuda_layer_cpu
    blk, routed, shared, d, _ = _block(tmp_path, register_family, True, bucket=3)
    d.pin(blk.problem13, Tactic("torch", dequant_dtype="fp32", chunk_n=0))
    d.pin(blk.problem2, Tactic("torch", dequant_dtype="fp32", chunk_n=0))
    cuda_layer_cpu.CALLS.clear()
    x, ids, tw = torch.randn(3, H).to(torch.bfloat16), torch.tensor([[0, 1], [2, 3], [3, -1]]), torch.rand(3, TOP_K)
    y = blk(x, ids, tw)
    assert cuda_layer_cpu.CALLS == [] and "reads the" in blk.layer_route.skipped[3]
    ref = _reference(routed, shared, x, ids, tw)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


def test_a_batch_invariant_dispatcher_serves_the_pair_at_every_m(tmp_path, register_family):
    """One tactic per problem for every M: the route never swaps the pair for the layer kernel at
    one bucket (a row's bits would then depend on the batch)."""
    from tests.families import cuda_layer_cpu
    blk, routed, shared, d, layer = _block(tmp_path, register_family, True, bucket=3, batch_invariant=True)
    assert blk.layer_route.problem is None
    cuda_layer_cpu.CALLS.clear()
    x, ids, tw = torch.randn(3, H).to(torch.bfloat16), torch.tensor([[0, 1], [2, 3], [3, -1]]), torch.rand(3, TOP_K)
    y = blk(x, ids, tw)
    assert cuda_layer_cpu.CALLS == []
    ref = _reference(routed, shared, x, ids, tw)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
