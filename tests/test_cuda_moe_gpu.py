"""The cuda family's grouped-MoE kernel (moe_mma) on a CUDA GPU with CuPy (skipped elsewhere), at
GLM-5 TP8 shapes (E = 256, top-8; w13 512x6144, w2 6144x256), NVFP4 and MXFP4: float64 checks
with -1 ids and NaN-poisoned outputs, bad ids (NaN rows, the bad-id word, the raise), SwiGLU,
per-pair x, int64 ids, token chunks, graph replay = eager bit for bit, split-K deterministic,
a token's rows the same bits at M = 1 and M = 64, the aligned route (large M) the direct route's
bits, and the loaded variants' resources; the token-major w2 kernel (moe_tok) likewise."""
import importlib.util

import pytest
import torch

from autotune.core import inputs
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="CuPy not installed"),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]

E, TOP_K = 256, 8
SHAPES = {"w13": (512, 6144), "w2": (6144, 256)}


def _fam():
    from autotune.tactics import registry
    return registry.get("cuda")


def _arch():
    from autotune.core.arch import detect
    return detect()


_W: dict = {}


def _weight(name, fmt):
    key = (name, fmt)
    if key not in _W:
        n, k = SHAPES[name]
        prob = Problem.moe(n, k, E, TOP_K, fmt)
        w = inputs.seeded_weight(prob, "cuda", 7 + len(_W))
        _W[key] = (w, _fam().pack("cuda-mma-a-frag-v1", w))
    return _W[key]


def _tactics(prob, extra=4):
    """The default and a spread of moe_mma's kept tactics (split-K, m_tiles 2, wider row tiles): kept
    by the member's exact verdict (through the family an unchecked text is `unknown`: these tests
    are its check)."""
    from autotune.tactics.cuda import moe as MOE
    fam, arch = _fam(), _arch()
    kept = [t for t in fam.enumerate(prob, arch) if not MOE.is_tok(t) and MOE.verdict(prob, t, arch).ok]
    pick = [fam.default(prob, arch)]
    for want in (dict(split_k=2), dict(split_k=8), dict(m_tiles=2), dict(tiles_n=4), dict(tiles_n=2, stages=2)):
        t = next((t for t in kept if all(t.params.get(k) == v for k, v in want.items()) and t not in pick), None)
        if t is not None:
            pick.append(t)
    # and on the reduce problems a walk (n_walk: N tiles per CTA after its route), beside the rest
    # on the reduce problems two walks (n_walk: out of the search space, moe_search.WALKS, but the kernel
    # keeps it): one warp and two (with two the cross-warp sum's buffer is the ring the next trip refills)
    walks = [Tactic("cuda", kernel="moe_mma", warps_k=wk, stages=2, tiles_n=tn, m_tiles=1, split_k=1, n_walk=4)
             for wk, tn in ((1, 4), (2, 2))]
    return pick[:1 + extra] + [t for t in walks if MOE.verdict(prob, t, arch).ok]


def _ids(m, seed, off=True):
    # skewed (hot experts hold more pairs than a group: several lead CTAs per expert, the rank scan's case)
    ids, tw = inputs.routing(m, E, TOP_K, torch.Generator().manual_seed(seed), skew=1.2)
    if off and m > 1:
        ids[m // 2, 3] = -1                                   # an expert not on this rank
    return ids.cuda(), tw.cuda()


def _err(out, ref):
    return float((out.double() - ref).norm() / ref.norm())


def _replays_bits(call, want) -> bool:
    """call(y) captured in a CUDA graph, replayed into a NaN-filled y: the bits of `want`?"""
    g = torch.cuda.CUDAGraph()
    y = torch.empty_like(want)
    with torch.cuda.graph(g):
        call(y)
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    return torch.equal(y, want)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("name", ["w13", "w2"])
def test_matches_float64(name, fmt):
    n, k = SHAPES[name]
    prob = Problem.moe(n, k, E, TOP_K, fmt)
    w, packed = _weight(name, fmt)
    fam = _fam()
    fails = []
    for m in (1, 4, 16, 64):
        ids, tw = _ids(m, 100 + m)
        tw = tw if name == "w2" else None                    # GLM applies the routing weight on w2
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = inputs.moe_reference(prob, x.double(), w, ids, tw)
        for t in _tactics(prob):
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            fam.build(prob, t, "cuda")(x, packed, ids, tw, out=out)
            torch.cuda.synchronize()
            nan = int(torch.isnan(out).sum())
            err = _err(out, ref) if not nan else float("nan")
            if nan or not err < 1e-2:
                fails.append(f"M={m} {t}: {nan} NaN, rel err {err:.3g}")
            if m > 1 and not torch.equal(out[m // 2, 3], torch.zeros_like(out[m // 2, 3])):
                fails.append(f"M={m} {t}: the -1 slot is not a zero row")
    assert not fails, "\n".join(fails)


def test_swiglu_matches_float64():
    n, k = SHAPES["w13"]
    prob = Problem.moe(n, k, E, TOP_K, epilogue="swiglu")
    w, packed = _weight("w13", "nvfp4")
    fam = _fam()
    for m in (1, 16):
        ids, tw = _ids(m, 5 + m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = inputs.moe_reference(prob, x.double(), w, ids, None)
        for t in _tactics(prob, 2):
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            fam.build(prob, t, "cuda")(x, packed, ids, None, out=out)
            assert _err(out, ref) < 1e-2, (m, t)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_reduce_matches_float64(fmt):
    """w2's fused form: the routing-weighted sum over each token's slots, [M, N]."""
    n, k = SHAPES["w2"]
    prob = Problem.moe(n, k, E, TOP_K, fmt, epilogue="reduce")
    w, packed = _weight("w2", fmt)
    fam = _fam()
    for m in (1, 16, 100):                                   # 100: two token chunks
        ids, tw = _ids(m, 40 + m)
        x3 = torch.randn(m, TOP_K, k, device="cuda").to(torch.bfloat16)
        ref = inputs.moe_reference(prob, x3.double(), w, ids, tw)
        for t in _tactics(prob, 3):
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            kern = fam.build(prob, t, "cuda")
            kern(x3, packed, ids, tw, out=out)
            assert _err(out, ref) < 1e-2, (m, t)
            again = kern(x3, packed, ids, tw)
            assert torch.equal(again, out), (m, t)              # slot order, not arrival order
    ids, tw = _ids(4, 2)
    ids[2, 5] = E + 3
    x3 = torch.randn(4, TOP_K, k, device="cuda").to(torch.bfloat16)
    out = torch.zeros(4, n, dtype=torch.bfloat16, device="cuda")
    kern = fam.build(prob, fam.default(prob, _arch()), "cuda")
    kern(x3, packed, ids, tw, out=out)                         # default: no host read, the word stays set
    assert int(kern.run.bad.item()) == 1
    assert torch.isnan(out[2]).all() and not torch.isnan(out[[0, 1, 3]]).any()
    kern.run.bad.zero_()
    kern.run.check_ids = True                             # AUTOTUNE_CHECK_IDS=1: the per-call raise
    with pytest.raises(ValueError, match="outside"):
        kern(x3, packed, ids, tw, out=out)


def test_per_pair_x_int64_ids_and_token_chunks():
    n, k = SHAPES["w2"]
    prob = Problem.moe(n, k, E, TOP_K)
    w, packed = _weight("w2", "nvfp4")
    kern = _fam().build(prob, _fam().default(prob, _arch()), "cuda")
    ids, tw = _ids(100, 3)                                   # 800 pairs: the aligned route
    x3 = torch.randn(100, TOP_K, k, device="cuda").to(torch.bfloat16)
    ref = inputs.moe_reference(prob, x3.double(), w, ids, tw)
    out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    kern(x3, packed, ids.long(), tw, out=out)
    assert _err(out, ref) < 1e-2


def test_bad_ids_nan_rows_and_raise():
    n, k = SHAPES["w13"]
    prob = Problem.moe(n, k, E, TOP_K)
    w, packed = _weight("w13", "nvfp4")
    kern = _fam().build(prob, _fam().default(prob, _arch()), "cuda")
    ids, _ = _ids(4, 9, off=False)
    ids[1, 2], ids[3, 0] = E, -2
    x = torch.randn(4, k, device="cuda").to(torch.bfloat16)
    out = torch.zeros(4, TOP_K, n, dtype=torch.bfloat16, device="cuda")
    kern(x, packed, ids, None, out=out)                        # default: no host read, the word stays set
    assert int(kern.run.bad.item()) == 1 and torch.isnan(out[1, 2]).all()
    kern.run.bad.zero_()
    kern.run.check_ids = True                             # AUTOTUNE_CHECK_IDS=1: the per-call raise
    with pytest.raises(ValueError, match=r"outside \[-1, E\)"):
        kern(x, packed, ids, None, out=out)
    assert torch.isnan(out[1, 2]).all() and torch.isnan(out[3, 0]).all()
    good = ids.clone()
    good[1, 2] = good[3, 0] = 0
    ref = inputs.moe_reference(prob, x.double(), w, good, None)
    mask = torch.ones(4, TOP_K, dtype=torch.bool)
    mask[1, 2] = mask[3, 0] = False
    assert _err(out[mask], ref[mask]) < 1e-2
    assert int(kern.run.bad.item()) == 0                 # cleared by the raise
    kern(x, packed, good, None, out=out)                      # the next good call passes


def test_graph_replay_bitwise_and_split_k_deterministic():
    n, k = SHAPES["w13"]
    prob = Problem.moe(n, k, E, TOP_K)
    fam = _fam()
    w, packed = _weight("w13", "nvfp4")
    t = next(t for t in _tactics(prob) if t["split_k"] > 1)
    launch = fam.bind(prob, t, packed, "cuda")
    assert launch.caps.capture_safe and callable(launch.release)
    ids, _ = _ids(16, 4)
    x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    y = torch.empty(16, TOP_K, n, dtype=torch.bfloat16, device="cuda")
    launch(x, ids, out=y)
    first = y.clone()
    launch(x, ids, out=y)
    assert torch.equal(first, y)                              # split order, not arrival order
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch(x, ids, out=y, routing_checked=True)
    y.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(first, y)
    launch.release()
    assert torch.equal(launch(x, ids), first)                 # scratch made again after release


def test_a_tokens_rows_do_not_depend_on_the_batch():
    n, k = SHAPES["w13"]
    prob = Problem.moe(n, k, E, TOP_K)
    fam = _fam()
    assert all(fam.batch_invariant(prob, t) for t in _tactics(prob))
    w, packed = _weight("w13", "nvfp4")
    ids, _ = _ids(64, 8, off=False)
    x = torch.randn(64, k, device="cuda").to(torch.bfloat16)
    for t in _tactics(prob):
        kern = fam.build(prob, t, "cuda")
        big = kern(x, packed, ids, None)
        one = kern(x[:1], packed, ids[:1], None)
        assert torch.equal(big[:1], one), t


def test_loaded_variants_match_the_verdict():
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import moe as MOE
    arch = _arch()
    for name in SHAPES:
        n, k = SHAPES[name]
        for fmt in ("nvfp4", "mxfp4"):
            prob = Problem.moe(n, k, E, TOP_K, fmt)
            for t in _tactics(prob):
                c = MOE.config(prob, t)
                r = B.runtime_resources(B.load(c, f"sm_{arch.cc_int}", 0))   # load raises on a difference
                assert r["shared_size_bytes"] == B.smem_bytes(c) and r["local_size_bytes"] == 0


def test_dense_tactic_on_grouped_problem_refused():
    prob = Problem.moe(*SHAPES["w2"], E, TOP_K)
    with pytest.raises(ValueError, match="dense cuda tactic"):
        _fam().build(prob, Tactic("cuda", warps_k=1, stages=2, tiles_n=1), "cuda")


@pytest.mark.parametrize("epi", ["swiglu", "reduce"])
def test_a_shared_slot_gives_the_bits_of_the_concatenated_one(epi):
    """GLM-5's shared expert folded in as expert 256 (e257:top9): with shared_slot=True the kernel
    adds it as each token's last slot (ids and weights [M, 8]); the same bits as the slot
    concatenated, float64-close, and the shared expert's own id in topk_ids is out of range."""
    name = "w13" if epi == "swiglu" else "w2"
    n, k = SHAPES[name]
    prob = Problem.moe(n, k, E + 1, TOP_K + 1, epilogue=epi)
    fam = _fam()
    w = inputs.seeded_weight(prob, "cuda", 41)
    packed = fam.pack("cuda-mma-a-frag-v1", w)
    for m in (1, 5, 64):
        ids, tw = _ids(m, 300 + m)
        tw = tw if epi == "reduce" else None
        x = (torch.randn(m, TOP_K + 1, k, device="cuda") if epi == "reduce" else
             torch.randn(m, k, device="cuda")).to(torch.bfloat16)
        full = torch.cat([ids, ids.new_full((m, 1), E)], 1)
        tfull = None if tw is None else torch.cat([tw, tw.new_ones((m, 1))], 1)
        ref = inputs.moe_reference(prob, x.double(), w, full, tfull)
        for t in _tactics(prob, 2):
            kern = fam.build(prob, t, "cuda")
            assert kern.caps.shared_slot
            a = kern(x, packed, ids, tw, shared_slot=True)
            b = kern(x, packed, full, tfull)
            assert torch.equal(a, b), (m, t)
            assert _err(a, ref) < 1e-2, (m, t)
        bad = ids.clone()
        bad[0, 1] = E                                        # the shared expert is not a routable id
        out = kern(x, packed, bad, tw, shared_slot=True)
        row = out[0] if epi == "reduce" else out[0, 1]
        assert torch.isnan(row).all() and not torch.isnan(out[1:]).any()


@pytest.mark.parametrize("epi", ["none", "swiglu", "reduce"])
def test_the_aligned_route_gives_the_direct_routes_bits(epi, monkeypatch):
    """Above ALIGN_PAIRS pairs moe_align's blocks replace the rank scan: the same groups, so the same
    bits as the direct route (forced here by raising ALIGN_PAIRS), also with an alignment a caller
    shares at a larger BLOCK_M (aligned=) and under graph replay; -1 ids (half the slots, as expert
    parallelism routes) zero rows, bad ids NaN rows and the word set, both written by the CTAs
    after the groups."""
    from autotune.tactics.cuda import moe as MOE
    from autotune.tactics.triton_fp4.moe_align import Aligner
    name = "w2" if epi == "reduce" else "w13"
    n, k = SHAPES[name]
    prob = Problem.moe(n, k, E, TOP_K, epilogue=epi)
    fam = _fam()
    w = inputs.seeded_weight(prob, "cuda", 51)
    packed = fam.pack("cuda-mma-a-frag-v1", w)
    m = 48                                                   # 384 pairs
    ids, tw = _ids(m, 500)
    ids[::2, ::2] = -1
    x = (torch.randn(m, TOP_K, k, device="cuda") if epi == "reduce" else torch.randn(m, k, device="cuda")
         ).to(torch.bfloat16)
    ref = inputs.moe_reference(prob, x.double(), w, ids, tw)
    for t in _tactics(prob, 3):
        kern = fam.build(prob, t, "cuda")
        assert MOE.route(prob, kern.run.cfg, m)[0] == "aligned" and kern.aligned_block_m(m) == 16
        a = kern(x, packed, ids, tw)
        assert _err(a, ref) < 1e-2, t
        al = Aligner(E, 64)(ids)                              # a layer's shared alignment at BLOCK_M 64
        assert torch.equal(kern(x, packed, ids, tw, aligned=al), a), t
        assert _replays_bits(lambda y: kern(x, packed, ids, tw, out=y), a), t
        with monkeypatch.context() as mp:
            mp.setattr(MOE, "ALIGN_PAIRS", 1 << 20)
            assert MOE.route(prob, kern.run.cfg, m)[0] == "direct"
            assert torch.equal(kern(x, packed, ids, tw), a), t
        bad = ids.clone()
        bad[1, 1], bad[5, 0] = E, -3
        kern.run.bad.zero_()
        out = kern(x, packed, bad, tw)
        assert int(kern.run.bad.item()) == 1
        kern.run.bad.zero_()
        rows = [out[1], out[5]] if epi == "reduce" else [out[1, 1], out[5, 0]]
        assert all(torch.isnan(r).all() for r in rows), t
        keep = [i for i in range(m) if i not in (1, 5)]
        assert torch.equal(out[keep], a[keep]), t


# ---- moe_tok: the token-major w2 with the top_k sum ---------------------------------------------------
def _tok_tactics(prob):
    from autotune.tactics.cuda import moe as MOE
    fam, arch = _fam(), _arch()
    kept = [t for t in fam.enumerate(prob, arch) if MOE.is_tok(t) and MOE.verdict(prob, t, arch).ok]
    pick = []
    for want in (dict(warps_k=1, stages=2, tiles_n=1), dict(warps_k=2, stages=4, tiles_n=2),
                 dict(warps_k=1, stages=4, tiles_n=4), dict(warps_k=2, stages=2, tiles_n=4),
                 dict(warps_k=1, stages=8, tiles_n=2)):
        pick += [t for t in kept if all(t[k] == v for k, v in want.items())][:1]
    assert len(pick) == 5, kept
    return pick


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_tok_matches_float64_and_is_deterministic(fmt):
    """moe_tok against float64 at M = 1, 4, 16, 100 (a -1 slot, NaN-poisoned output), the same bits
    again, under graph replay, and a token's row the same bits alone and in a batch."""
    n, k = SHAPES["w2"]
    prob = Problem.moe(n, k, E, TOP_K, fmt, epilogue="reduce")
    w, packed = _weight("w2", fmt)
    fam = _fam()
    for t in _tok_tactics(prob):
        kern = fam.build(prob, t, "cuda")
        for m in (1, 4, 16, 100):
            ids, tw = _ids(m, 70 + m)
            x3 = torch.randn(m, TOP_K, k, device="cuda").to(torch.bfloat16)
            ref = inputs.moe_reference(prob, x3.double(), w, ids, tw)
            out = torch.full(ref.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
            kern(x3, packed, ids, tw, out=out)
            torch.cuda.synchronize()
            assert not torch.isnan(out).any() and _err(out, ref) < 1e-2, (m, t)
            assert torch.equal(kern(x3, packed, ids, tw), out), (m, t)
            assert torch.equal(kern(x3[:1], packed, ids[:1], tw[:1]), out[:1]), (m, t)
        assert _replays_bits(lambda y: kern(x3, packed, ids, tw, out=y), out), t


def test_tok_bad_ids_and_the_shared_slot():
    n, k = SHAPES["w2"]
    prob = Problem.moe(n, k, E, TOP_K, epilogue="reduce")
    w, packed = _weight("w2", "nvfp4")
    fam = _fam()
    t = _tok_tactics(prob)[1]
    kern = fam.build(prob, t, "cuda")
    ids, tw = _ids(4, 12)
    ids[2, 5], ids[3, 0] = E + 3, -2
    x3 = torch.randn(4, TOP_K, k, device="cuda").to(torch.bfloat16)
    out = kern(x3, packed, ids, tw)
    assert int(kern.run.bad.item()) == 1                              # no host read by default
    assert torch.isnan(out[2]).all() and torch.isnan(out[3]).all() and not torch.isnan(out[:2]).any()
    kern.run.bad.zero_()
    kern.run.check_ids = True
    with pytest.raises(ValueError, match="outside"):
        kern(x3, packed, ids, tw)
    # the shared expert folded in as expert 256 (e257:top9): the kernel adds it, the same bits as concatenated
    sprob = Problem.moe(n, k, E + 1, TOP_K + 1, epilogue="reduce")
    sw = inputs.seeded_weight(sprob, "cuda", 43)
    spacked = fam.pack("cuda-mma-a-frag-v1", sw)
    skern = fam.build(sprob, next(tt for tt in _tok_tactics(sprob)), "cuda")
    assert skern.caps.shared_slot
    for m in (1, 5, 64):
        ids, tw = _ids(m, 310 + m)
        x3 = torch.randn(m, TOP_K + 1, k, device="cuda").to(torch.bfloat16)
        full = torch.cat([ids, ids.new_full((m, 1), E)], 1)
        tfull = torch.cat([tw, tw.new_ones((m, 1))], 1)
        a = skern(x3, spacked, ids, tw, shared_slot=True)
        assert torch.equal(a, skern(x3, spacked, full, tfull)), m
        assert _err(a, inputs.moe_reference(sprob, x3.double(), sw, full, tfull)) < 1e-2, m


def test_tok_loaded_variants_match_the_verdict():
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import moe as MOE
    arch = _arch()
    for fmt in ("nvfp4", "mxfp4"):
        prob = Problem.moe(*SHAPES["w2"], E, TOP_K, fmt, epilogue="reduce")
        for t in _tok_tactics(prob):
            c = MOE.config(prob, t)
            r = B.runtime_resources(B.load(c, f"sm_{arch.cc_int}", 0))
            assert r["shared_size_bytes"] == B.smem_bytes(c) and r["local_size_bytes"] == 0


def _planned_vs_whole(kern, packed, prob, k, m, seed):
    """A launcher's repeat path (moe_plan.py) against its whole way on fresh inputs: the same bits,
    eager, on a side stream (whole way: another stream) and under graph replay; the plan was used
    (no whole-way check) for tensors other than those it was made on."""
    launcher = kern.run
    calls = []
    real = launcher.check
    launcher.check = lambda *a, **kw: calls.append(1) or real(*a, **kw)
    try:
        for s in (seed, seed + 1):
            ids, tw = _ids(m, s)
            shape = (m, TOP_K, k) if prob.epilogue == "reduce" else (m, k)
            x = torch.randn(*shape, device="cuda").to(torch.bfloat16)
            kern(x.clone(), packed, ids.clone(), tw.clone())        # leaves this stream's plan (the side-stream
            before = len(calls)                                     # call below replaces it: one per form)
            planned = kern(x, packed, ids, tw)
            assert len(calls) == before, "the second call was not planned"
            launcher._forget()
            whole = kern(x, packed, ids, tw)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                other = kern(x, packed, ids, tw)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            assert torch.equal(planned, whole) and torch.equal(other, whole), (m, s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):                                   # its own stream: the whole way, captured
            y = kern(x, packed, ids, tw)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, whole)
    finally:
        launcher.check = real


def test_a_planned_launch_gives_the_whole_ways_bits():
    fam = _fam()
    for name, epi in (("w13", "swiglu"), ("w2", "reduce")):
        n, k = SHAPES[name]
        prob = Problem.moe(n, k, E, TOP_K, "nvfp4", epilogue=epi)
        _, packed = _weight(name, "nvfp4")
        for t in _tactics(prob, 1):
            kern = fam.build(prob, t, "cuda")
            for m in (1, 4):
                _planned_vs_whole(kern, packed, prob, k, m, 500 + m)


def test_tok_a_planned_launch_gives_the_whole_ways_bits():
    n, k = SHAPES["w2"]
    prob = Problem.moe(n, k, E, TOP_K, "nvfp4", epilogue="reduce")
    _, packed = _weight("w2", "nvfp4")
    kern = _fam().build(prob, _tok_tactics(prob)[1], "cuda")
    for m in (1, 4):
        _planned_vs_whole(kern, packed, prob, k, m, 600 + m)


@pytest.mark.parametrize("epi", ["swiglu", "none"])
def test_a_prefetch_of_the_next_kernels_weights_changes_no_bit(epi):
    """w13 with `prefetch=` (w2's stacked pack, sliced into L2 by each expert's first group): the bits
    of the call without it, eagerly and replayed from a graph, with -1 and bad ids, a shared slot and
    on the aligned route (where it prefetches nothing); nothing faults. `scratch_out=True` (the output
    in the pool's one view, reused): the same bits."""
    n, k = SHAPES["w13"]
    fam = _fam()
    for experts, slot in ((E, False), (E + 1, True)):
        prob = Problem.moe(n, k, experts, TOP_K + slot, epilogue=epi)
        w = inputs.seeded_weight(prob, "cuda", 51)
        packed = fam.pack("cuda-mma-a-frag-v1", w)
        p2 = Problem.moe(SHAPES["w2"][0], SHAPES["w2"][1], experts, TOP_K + slot, epilogue="reduce")
        w2 = fam.pack("cuda-mma-a-frag-v1", inputs.seeded_weight(p2, "cuda", 52))
        pf = (w2.packed, w2.scales)
        kw = {"shared_slot": True} if slot else {}
        for m in (1, 3, 40):                                  # 40 x 8 pairs: the aligned route (no slot)
            if slot and m == 40:
                continue
            ids, _ = _ids(m, 500 + m)
            bad = ids.clone()
            bad[0, 0] = experts + 3                           # a bad id: a NaN row, nothing prefetched for it
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            for t in _tactics(prob, 2):
                kern = fam.build(prob, t, "cuda")
                assert kern.caps.prefetches
                want = kern(x, packed, ids, None, **kw)
                assert torch.equal(kern(x, packed, ids, None, prefetch=pf, **kw), want), (m, t, slot)
                h = kern(x, packed, ids, None, prefetch=pf, scratch_out=True, **kw)    # into the pool's view
                assert torch.equal(h, want) and h.data_ptr() == kern(x, packed, ids, None, scratch_out=True, **kw).data_ptr()
                assert _replays_bits(lambda y: kern(x, packed, ids, None, out=y, prefetch=pf, **kw), want), (m, t)
                wb = kern(x, packed, bad, None, **kw).nan_to_num(7.0)
                assert torch.equal(kern(x, packed, bad, None, prefetch=pf, **kw).nan_to_num(7.0), wb), (m, t, slot)
            torch.cuda.synchronize()


def test_one_copy_moe_packs_experts_in_place_and_gives_the_copys_bits(tmp_path):
    """A one-copy FP4MoE on the cuda grouped kernel holds the experts in their own bytes (tactics/cuda/
    inplace.py; on 2026-12-05 a second copy of GLM-5 TP8's experts ran an H100 out of memory) and gives
    the bits of the same block bound with a packed copy."""
    import warnings

    from autotune.core.formats import held_layout
    from autotune.runtime.dispatch import Dispatcher
    from autotune.runtime.moe import FP4MoE
    from autotune.tactics.cuda import layout as L
    from autotune.tactics.cuda import moe as MOE
    hidden, inter, e, top_k = 1024, 256, 16, 4
    g = torch.Generator().manual_seed(3)
    routed = [torch.randn(e, inter, hidden, generator=g), torch.randn(e, inter, hidden, generator=g),
              torch.randn(e, hidden, inter, generator=g)]
    ids, tw = inputs.routing(5, e, top_k, torch.Generator().manual_seed(4))
    x = torch.randn(5, hidden, generator=g).to(torch.bfloat16).cuda()
    outs = []
    for one_copy in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            d = Dispatcher(tmp_path / "none.db", record_misses=False, warn=False, one_copy=one_copy)
            blk = FP4MoE.from_float(*[w.cuda() for w in routed], top_k, dispatcher=d)
            for p in (blk.problem13, blk.problem2):
                d.pin(p, next(t for t in _fam().enumerate(p, d.arch) if t.params.get("kernel") == "moe_mma"
                              and MOE.verdict(p, t, d.arch).ok))
            y = blk(x, ids.cuda(), tw.cuda())
        torch.cuda.synchronize()
        if one_copy:
            for bt in (blk.bound13, blk.bound2):
                assert bt.held == L.LAYOUT and bt.extra_bytes == 0 and held_layout(bt.packs[L.LAYOUT].packed)
        outs.append(y)
    assert not torch.isnan(outs[0]).any() and torch.equal(outs[0], outs[1])
