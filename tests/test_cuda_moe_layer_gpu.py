"""The cuda MoE layer kernel (moe_layer.cu) on a CUDA GPU with CuPy (skipped elsewhere), at GLM-5 TP8's
folded layer (256 routed experts + the shared one as expert 256, top-8 + the shared slot; w13 512x6144
SwiGLU, w2 6144x256), NVFP4: the layer against float64 at M = 1, 2, 4, 8, 16 with -1 slots, an expert
map (experts of another rank as -1), bad ids (NaN rows, the bad-id word, the raise); then 75 layer
kernels back to back in one CUDA graph, PDL on and off, replayed 1,000 times with the routes changed
between replays: every replay the eager bits, one kernel node per layer and no memset node, the
protocol's words left as the model says (ticket and done 0, the epoch advanced on the device, across
its wrap), no error word. Written to run unattended in about two minutes."""
import importlib.util

import pytest
import torch

from autotune.core import inputs
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy not installed"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

E, TOP_K, H, I = 257, 9, 6144, 256          # the shared expert folded in as expert 256, every token's last slot
W13 = Problem.moe(2 * I, H, E, TOP_K, epilogue="swiglu")
_W: dict = {}


def _ml():
    from autotune.tactics.cuda import moe_layer as ML
    return ML


def _weights(seed=0):
    if seed not in _W:
        from autotune.tactics import registry
        fam = registry.get("cuda")
        w13 = inputs.seeded_weight(W13, "cuda", 11 + 2 * seed)
        w2 = inputs.seeded_weight(_ml().w2_problem(W13), "cuda", 12 + 2 * seed)
        _W[seed] = (w13, w2, fam.pack("cuda-mma-a-frag-v1", w13), fam.pack("cuda-mma-a-frag-v1", w2))
    return _W[seed]


def _tactics():
    from autotune.core.arch import detect
    kept = _ml().layer_space(W13, detect())
    pick = [t for t in kept if (t["warps_k"], t["stages"], t["tiles_n"]) in ((2, 2, 2), (1, 4, 2), (2, 4, 4))]
    assert pick, kept
    return pick


def _routes(m, seed, emap=None):
    ids, tw = inputs.routing(m, E - 1, TOP_K - 1, torch.Generator().manual_seed(seed), skew=1.2)
    ids = ids.to(torch.int32)
    if m > 1:
        ids[1, 0] = -1                                                 # a slot that adds nothing
    if emap is not None:
        ids = torch.where(ids >= 0, emap[ids.clamp(min=0).long()], ids)
    return ids.cuda(), tw.cuda()


def _reference(x, w13, w2, ids, tw):
    ML = _ml()
    full = torch.cat([ids, ids.new_full((ids.shape[0], 1), E - 1)], 1)
    twf = torch.cat([tw, tw.new_ones(tw.shape[0], 1)], 1)
    h = inputs.moe_reference(W13, x.double(), w13, full, None)
    return inputs.moe_reference(ML.w2_problem(W13), h, w2, full, twf)


@pytest.mark.parametrize("m", [1, 2, 4, 8, 16])
def test_the_layer_matches_float64(m):
    w13, w2, p13, p2 = _weights()
    x = (torch.randn(m, H, device="cuda") * 0.5).to(torch.bfloat16)
    emap = torch.arange(E - 1, dtype=torch.int32)
    emap[::3] = -1                                                     # an expert map: every third on another rank
    cases = [(ids, tw, _reference(x, w13, w2, ids, tw)) for ids, tw in (_routes(m, m), _routes(m, 100 + m, emap))]
    for tactic in _tactics():
        run = _ml().LayerLaunch(W13, tactic, "cuda")
        for ids, tw, ref in cases:
            out = torch.full((m, H), float("nan"), dtype=torch.bfloat16, device="cuda")
            y = run(x, p13, p2, ids, tw, out=out, shared_slot=True)
            torch.cuda.synchronize()
            assert y is out and torch.isfinite(y.float()).all(), tactic
            err = float((y.double() - ref).norm() / ref.norm())
            assert err < 2e-2, (tactic, m, err)
        assert run.protocol_error() is None and int(run.words()[3]) == 0
        state = run.words()[0].tolist()
        assert state[0] == 0 and state[1] == 0 and state[2] == 2       # two launches: epoch 0 -> 2


def test_bad_ids_give_nan_rows_the_word_and_the_raise():
    w13, w2, p13, p2 = _weights()
    m = 4
    x = (torch.randn(m, H, device="cuda") * 0.5).to(torch.bfloat16)
    ids, tw = _routes(m, 5)
    ids[2, 3] = E - 1                                                   # the shared expert is no routable id
    ids[3, 0] = 10 ** 6
    run = _ml().LayerLaunch(W13, _tactics()[0], "cuda")
    y = run(x, p13, p2, ids, tw, shared_slot=True)
    torch.cuda.synchronize()
    assert torch.isnan(y[2].float()).all() and torch.isnan(y[3].float()).all()
    assert torch.isfinite(y[:2].float()).all() and int(run.words()[3]) == 1
    ref = _reference(x[:2], w13, w2, ids[:2], tw[:2])
    assert float((y[:2].double() - ref).norm() / ref.norm()) < 2e-2
    assert run.protocol_error() is None
    checked = _ml().LayerLaunch(W13, _tactics()[0], "cuda", check_ids=True)
    with pytest.raises(ValueError, match="outside"):
        checked(x, p13, p2, ids, tw, shared_slot=True)


def _graph_nodes(g):
    """(kernel nodes, other node types) of a captured torch CUDAGraph kept with keep_graph=True."""
    from cuda.bindings import runtime as rt
    graph = rt.cudaGraph_t(init_value=g.raw_cuda_graph())
    err, _, n = rt.cudaGraphGetNodes(graph, 0)
    assert err == rt.cudaError_t.cudaSuccess, err
    err, nodes, n = rt.cudaGraphGetNodes(graph, n)
    assert err == rt.cudaError_t.cudaSuccess, err
    types = [rt.cudaGraphNodeGetType(nd)[1] for nd in nodes[:n]]
    kernel = rt.cudaGraphNodeType.cudaGraphNodeTypeKernel
    return sum(t == kernel for t in types), [t for t in types if t != kernel]


@pytest.mark.parametrize("pdl_on", ["0", "1"])
def test_75_layers_in_one_graph_replayed_1000_times(monkeypatch, pdl_on):
    from autotune.tactics.cuda import pdl
    ML = _ml()
    monkeypatch.setenv("AUTOTUNE_PDL", pdl_on)
    layers, m, routes_n = 75, 4, 8
    weights = [_weights(s)[2:] for s in range(3)]                       # three weight sets, cycled
    runs = [ML.LayerLaunch(W13, _tactics()[i % len(_tactics())], "cuda") for i in range(layers)]
    x = (torch.randn(m, H, device="cuda") * 0.5).to(torch.bfloat16)
    ids_buf, tw_buf = _routes(m, 0)
    outs = torch.empty(layers, m, H, dtype=torch.bfloat16, device="cuda")

    def step():
        for i, run in enumerate(runs):
            p13, p2 = weights[i % 3]
            run(x, p13, p2, ids_buf, tw_buf, out=outs[i], shared_slot=True)

    expect = []
    for r in range(routes_n):                                           # eager: the bits every replay must give
        ids, tw = _routes(m, 1000 + r)
        ids_buf.copy_(ids)
        tw_buf.copy_(tw)
        step()
        expect.append(outs.clone())
    torch.cuda.synchronize()
    kinds = {type(r) for run in runs for r in run._run_by_dev.values()}
    assert kinds == ({pdl.PdlRun} if pdl_on == "1" and pdl.available(0) else {pdl.CupyRun})
    runs[0].words()[0][2] = ML.PR.EPOCH_MAX - 400                      # layer 0 crosses the epoch's wrap below
    epoch0 = [int(run.words()[0][2]) for run in runs]
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(g, stream=s):
        step()
    kernels, others = _graph_nodes(g)
    assert kernels == layers and not others, (kernels, others)        # one kernel node per layer, no memset
    g.instantiate()
    replays = 1000
    for r in range(replays):                                            # routes changed between replays
        ids, tw = _routes(m, 1000 + r % routes_n)
        ids_buf.copy_(ids)
        tw_buf.copy_(tw)
        outs.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(outs, expect[r % routes_n]), f"replay {r}"
    torch.cuda.synchronize()
    for i, run in enumerate(runs):
        state = run.words()[0].tolist()
        ep = epoch0[i]
        for _ in range(replays):
            ep = ML.PR.next_epoch(ep)[0]
        assert state == [0, 0, ep, 0], (i, state, ep)
        assert run.protocol_error() is None
    assert int(runs[0].words()[0][2]) < epoch0[0]                      # wrapped (the counters cleared on the device)
