"""Issue #26 items 5 and 6 on a CUDA GPU: eager FP4MoE (Triton moe_decode, and cuda moe_mma where
CuPy is installed; fused, unfused, with an expert_map, with the shared expert folded in, M = 1, 4
and 64 — 512 pairs: the aligned route) and FP4Linear (a split-K W4A16 tactic) run under
torch.cuda.set_sync_debug_mode("error"): any host sync raises. Then: bad ids give NaN rows and
routing_errors() reports them; a forward captured in a CUDA graph on torch's own capture stream
(its own scratch, grown under capture) replays bit for bit equal to eager, and eager calls after
it are still right (the counters zeroed outside the graph); the layers share one workspace per
stream. GLM-5 TP8 per-expert shapes (w13 512x6144, w2 6144x256), 64 experts, top-8."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from autotune.core.tactic import Tactic
from tests.helpers import quiet_dispatcher

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

E, H, I, TOP_K = 64, 6144, 256, 8
TRITON13 = Tactic("triton", kernel="moe_decode", route="direct", block_m=16, block_n=64, block_k=256, split_k=4,
                  num_warps=4, num_stages=3)
TRITON2 = Tactic("triton", kernel="moe_decode", route="direct", block_m=16, block_n=128, block_k=128, split_k=1,
                 num_warps=4, num_stages=3)
CUDA13 = Tactic("cuda", kernel="moe_mma", warps_k=4, stages=4, tiles_n=2, m_tiles=1, split_k=4)
CUDA2 = Tactic("cuda", kernel="moe_mma", warps_k=2, stages=4, tiles_n=1, m_tiles=1, split_k=1)
FAMS = [pytest.param((TRITON13, TRITON2), id="moe_decode"),
        pytest.param((CUDA13, CUDA2), id="moe_mma", marks=pytest.mark.skipif(
            importlib.util.find_spec("cupy") is None, reason="CuPy not installed"))]


def _disp(tmp_path):
    return quiet_dispatcher(tmp_path / "none.db")


def _block(d, tactics, **kw):
    from autotune.runtime.moe import FP4MoE
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g)        # noqa: E731
    if kw.pop("shared", False):
        kw["shared"] = FP4MoE.shared_from_float(r(I, H), r(I, H), r(H, I))
    blk = FP4MoE.from_float(r(E, I, H), r(E, I, H), r(E, H, I), TOP_K, dispatcher=d, **kw)
    d.pin(blk.problem13, tactics[0])      # fused or plain problems alike: both members run every epilogue
    d.pin(blk.problem2, tactics[1])
    return blk


def _routing(m, e_global, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e_global, generator=g)[:TOP_K] for _ in range(m)])
    ids[0, 1] = -1
    return ids.cuda(), torch.rand(m, TOP_K, generator=g).cuda()


def _no_sync(fn):
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")


CASES = [dict(fused=True), dict(fused=False), dict(expert_map=True), dict(shared=True),
         dict(expert_map=True, shared=True)]


@pytest.mark.parametrize("tactics", FAMS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(k for k, v in c.items() if v) or "unfused")
def test_eager_fp4moe_syncs_nothing(tmp_path, tactics, case):
    d = _disp(tmp_path)
    kw = dict(case)
    if kw.pop("expert_map", False):
        perm = torch.randperm(E + 16, generator=torch.Generator().manual_seed(5))
        emap = torch.full((E + 16,), -1, dtype=torch.int32)
        emap[perm[:E]] = torch.arange(E, dtype=torch.int32)
        kw["expert_map"] = emap.cuda()
    blk = _block(d, tactics, **kw)
    eg = blk.global_experts
    for m in (64, 4, 1):                  # largest first (warmup): the scratch is sized once
        x = torch.randn(m, H, device="cuda").to(torch.bfloat16)
        ids, tw = _routing(m, eg)
        want = blk(x, ids, tw)            # binds and compiles outside the checked region
        got = _no_sync(lambda: blk(x, ids, tw))
        assert torch.equal(got, want) and torch.isfinite(got).all()
        bad = ids.clone()
        bad[-1, 0] = eg + 5
        yb = _no_sync(lambda: blk(x, bad, tw))
        assert torch.isnan(yb[-1]).all() and torch.equal(yb[:-1], want[:-1])
        assert blk.routing_errors() == [blk.label] and d.routing_errors() == []


@pytest.mark.parametrize("tactics", FAMS)
def test_graph_replay_and_eager_after_it(tmp_path, tactics):
    d = _disp(tmp_path)
    blk = _block(d, tactics)
    x = torch.randn(4, H, device="cuda").to(torch.bfloat16)
    ids, tw = _routing(4, E)
    want = blk(x, ids, tw)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):             # torch's capture stream: its own buffers, grown under capture
        y = blk(x, ids, tw)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)
    assert torch.equal(blk(x, ids, tw), want)                  # eager after the capture: counters zeroed
    streams = {k[1] for k in d.scratch.bufs}
    assert len(streams) == 2                                   # eager + capture stream, not one per layer
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, want)


def test_layers_share_the_workspace(tmp_path):
    d = _disp(tmp_path)
    blocks = [_block(d, (TRITON13, TRITON2)) for _ in range(3)]
    x = torch.randn(16, H, device="cuda").to(torch.bfloat16)
    ids, tw = _routing(16, E)
    blocks[0](x, ids, tw)
    one = d.scratch.bytes_held()
    for b in blocks:
        b(x, ids, tw)
    assert d.scratch.bytes_held() == one


def test_eager_fp4linear_syncs_nothing(tmp_path):
    from autotune.core.formats import quantize
    from autotune.runtime.nn import FP4Linear
    from autotune.tactics.triton_fp4.w4a16 import tactic
    d = _disp(tmp_path)
    lin = FP4Linear(quantize(torch.randn(512, H, device="cuda")), dispatcher=d)
    d.pin(lin.problem, tactic(16, 64, 128, 8, 4, 3, split_k=4))
    for m in (64, 1):
        x = torch.randn(m, H, device="cuda").to(torch.bfloat16)
        want = lin(x)
        assert torch.equal(_no_sync(lambda: lin(x)), want)
    assert any(k[2] == "splitk.ws" for k in d.scratch.bufs)      # the split-K workspace came from the pool
