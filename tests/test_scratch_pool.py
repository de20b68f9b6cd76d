"""Issue #26 item 6: split-K and reduce workspaces come from one pool per dispatcher, one set per
(device, stream), sized by the largest live M — not one set per layer — and the pool's growth
rule keeps captured graphs' pointers valid (tactics/scratch.py). 75 MoE layers on the cuda
family's launcher scratch code with its kernel's grid ported to the CPU (tests/families/cuda_moe_cpu.py)."""
from __future__ import annotations


import pytest
import torch

from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.tactic import Tactic
from autotune.runtime.moe import FP4MoE
from autotune.tactics import registry, scratch as S
from autotune.tactics.cuda import layout as L
from autotune.tactics.scratch import ScratchPool
from tests.helpers import quiet_dispatcher

E, H, I, TOP_K = 4, 256, 128, 2
CUDA13 = Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=2, m_tiles=1, split_k=2)
CUDA2 = Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1)
DEV13, DEV2 = Tactic("devicemoe", split_k=2), Tactic("devicemoe", split_k=1)
NAMES = ("splitk.ws", "splitk.locks", "reduce.rows", "reduce.cnt")


@pytest.fixture
def fams(register_family):
    register_family("cudamoecpu", "tests.families.cuda_moe_cpu:CudaMoeCpu")
    register_family("devicemoe", "tests.families.devicemoe:DeviceMoEFamily")


def _disp(tmp_path, name="none.db"):
    # sm90's verdicts (the cuda family's tactics are kept there); the kernels run on the CPU
    return quiet_dispatcher(tmp_path / name, env=cpu(), arch=ARCHS["sm90"])


def _layers(d, n, t13, t2):
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        blk = FP4MoE.from_float(torch.randn(E, I, H, generator=g), torch.randn(E, I, H, generator=g),
                                torch.randn(E, H, I, generator=g), TOP_K, dispatcher=d)
        if i == 0:
            d.pin(blk.problem13, t13)
            d.pin(blk.problem2, t2)
        out.append(blk)
    return out


def _need(blk, m, cuda: bool) -> int:
    """One layer's largest workspace at M tokens, from the kernels' own sizes: w13's split-K
    partials [2, P, N] fp32 and counters, w2's reduce rows [P, N] fp32 and counters [M, N tiles]."""
    p13, p2, pairs = blk.problem13, blk.problem2, m * TOP_K
    locks = pairs * (p13.n // (L.ROWS * 2)) if cuda else 4      # devicemoe keeps no counters
    cnt = m * (p2.n // L.ROWS) if cuda else 0
    return 2 * pairs * p13.n * 4 + locks * 4 * cuda + pairs * p2.n * 4 + cnt * 4


def _norm(y):
    """The next layer's input: each row scaled to norm 16 (75 random layers would overflow)."""
    y = y.float()
    return (y / y.norm(dim=-1, keepdim=True).clamp_min(1e-6) * 16).to(torch.bfloat16)


def _named(pool) -> int:
    return sum(b.numel() * b.element_size() for k, b in pool.bufs.items() if k[2] in NAMES)


@pytest.mark.parametrize("family,layers", [("devicemoe", 75), ("cudamoecpu", 3)])
def test_layers_hold_one_layers_workspace(fams, tmp_path, family, layers):
    cuda = family == "cudamoecpu"
    t13, t2 = (CUDA13, CUDA2) if cuda else (DEV13, DEV2)
    g = torch.Generator().manual_seed(99)
    ms = (6, 2)                                           # largest first, as warmup(ms) runs them
    xs = {m: torch.randn(m, H, generator=g).to(torch.bfloat16) for m in ms}
    routes = {m: (torch.randint(0, E, (m, TOP_K), generator=g), torch.rand(m, TOP_K, generator=g)) for m in ms}
    for m in ms:
        routes[m][0][0, 1] = -1
    d = _disp(tmp_path)
    blocks = _layers(d, layers, t13, t2)
    ys = {}
    for m in ms:
        h = xs[m]
        for blk in blocks:                                # a whole step: layer after layer, one stream
            h = _norm(blk(h, *routes[m]))
        ys[m] = h
        assert torch.isfinite(h).all()
    need = _need(blocks[0], 6, cuda)
    assert _named(d.scratch) == need and d.scratch.bytes_retired() == 0      # one layer's need, not 75x
    assert {k[2] for k in d.scratch.bufs} & set(NAMES) == set(NAMES) - ({"splitk.locks", "reduce.cnt"} - (
        {"splitk.locks", "reduce.cnt"} if cuda else set()))
    assert all(int(b.abs().sum()) == 0 for k, b in d.scratch.bufs.items() if k[2] in ("splitk.locks", "reduce.cnt"))

    # the same step with per-layer buffers (each launcher's own pool, as before the pool): the same
    # bits, and `layers` times the memory
    fam = registry.get(family)
    own = [(fam.build(b.problem13, t13, "cpu"), fam.build(b.problem2, t2, "cpu")) for b in blocks]
    packs = [(fam.pack(fam.layout(t13), b.w13), fam.pack(fam.layout(t2), b.w2)) for b in blocks]
    for m in ms:
        h = xs[m]
        ids, tw = routes[m]
        for (k13, k2), (w13, w2) in zip(own, packs):
            h = _norm(k2(k13(h, w13, ids), w2, ids, tw))
        assert torch.equal(h, ys[m])
    run = (lambda k: k.launcher) if cuda else (lambda k: k)
    assert sum(_named(run(k)._own) for pair in own for k in pair) == layers * need
    # release() (the worker's, per tactic) frees a private pool, never the dispatcher's
    own[0][0].release()
    assert run(own[0][0])._own.bytes_held() == 0
    blocks[0].bound13.launcher(6).release()
    assert _named(d.scratch) == need


def test_growth_retires_and_trim_frees(monkeypatch):
    pool = ScratchPool()
    dev = torch.device("cpu")
    for n in range(10, 1010, 10):
        b = pool.get(0, "splitk.ws", n, torch.float32, dev)
        assert b.numel() >= n
    assert len(pool.retired) < 10 and pool.bytes_retired() < pool.bytes_held()   # doubling: retired < live
    kept = pool.retired[0].data_ptr()
    assert any(r.data_ptr() == kept for r in pool.retired)                        # a captured pointer stays valid
    e = pool.epoch
    assert pool.trim() > 0 and pool.retired == [] and pool.epoch == e + 1
    other = pool.get(7, "splitk.ws", 10, torch.float32, dev)                      # another stream: its own buffer
    assert other.data_ptr() != pool.get(0, "splitk.ws", 10, torch.float32, dev).data_ptr()


def test_a_zeroed_buffer_grown_under_capture_is_zeroed_again_outside(monkeypatch):
    """Under capture the memset of a new counter buffer only runs when the graph replays; the first
    eager `get` zeroes it (tactics/scratch.py), and a plan must not keep its pointer meanwhile."""
    pool = ScratchPool()
    dev = torch.device("cpu")
    monkeypatch.setattr(S, "capturing", lambda device: True)
    c = pool.get(0, "splitk.locks", 8, torch.int32, dev, zero=True)
    assert pool.dirty
    c.fill_(5)                                         # what the memory holds when the memset never ran
    assert int(pool.get(0, "splitk.locks", 8, torch.int32, dev, zero=True).sum()) == 40   # still capturing
    monkeypatch.setattr(S, "capturing", lambda device: False)
    assert int(pool.get(0, "splitk.locks", 8, torch.int32, dev, zero=True).sum()) == 0 and not pool.dirty


def test_words_one_read_for_every_layer():
    pool = ScratchPool()
    words = [pool.word("cpu", f"layer{i}") for i in range(300)]     # two pages
    assert all(w.data_ptr() % 16 == 0 for w in words)
    words[3].fill_(1)
    words[290].fill_(1)
    assert pool.errors(clear=False) == ["layer3", "layer290"]
    assert pool.errors() == ["layer3", "layer290"] and pool.errors() == []


def test_dense_split_k_layers_share_one_workspace(register_family, tmp_path):
    """The dense kernel's split-K workspace and counters (its CPU grid port behind the launcher's
    DenseScratch) come from the dispatcher's pool too: 6 FP4MLP layers with split-K tactics on
    both problems hold one layer's largest need, give the bits their own pools give, leave the
    counters zero, and a layer's release() does not free the shared pool."""
    from autotune.core.problem import Problem
    from autotune.runtime.layers import FP4MLP
    from autotune.tactics.cuda import dense as D
    register_family("cudadensecpu", "tests.families.cuda_cpu:CudaDenseCpu")
    h, i, layers, m = 256, 256, 6, 5
    t13 = Tactic("cudadensecpu", warps_k=1, stages=2, tiles_n=2, split_k=2)
    t2 = Tactic("cudadensecpu", warps_k=1, stages=2, tiles_n=1, split_k=2)
    p13, p2 = Problem.dense(2 * i, h, epilogue="swiglu"), Problem.dense(h, i)
    d = _disp(tmp_path)
    d.pin(p13, t13)
    d.pin(p2, t2)
    g = torch.Generator().manual_seed(5)
    mlps = [FP4MLP.from_float(torch.randn(i, h, generator=g) * 0.1, torch.randn(i, h, generator=g),
                              torch.randn(h, i, generator=g) * 0.1, dispatcher=d) for _ in range(layers)]
    x = torch.randn(m, h, generator=g).to(torch.bfloat16)
    hs = x
    for f in mlps:
        hs = _norm(f(hs))
    assert torch.isfinite(hs).all()
    need_ws = max(D.workspace_elems(p13, t13, m), D.workspace_elems(p2, t2, m)) * 4
    held = {k[2]: b.numel() * b.element_size() for k, b in d.scratch.bufs.items()}
    assert held["splitk.ws"] == need_ws and d.scratch.bytes_retired() == 0          # one layer's, not 6x
    assert int(d.scratch.bufs[next(k for k in d.scratch.bufs if k[2] == "splitk.locks")].abs().sum()) == 0
    # the same layers, each kernel on a pool of its own (as before the pool): the same bits
    fam = registry.get("cudadensecpu")
    own = [(fam.build(p13, t13, "cpu"), fam.build(p2, t2, "cpu")) for _ in mlps]
    ref = x
    for (k13, k2), f in zip(own, mlps):
        ref = _norm(k2(k13(ref, *f.gate_up.bound.packs.values()), *f.down.bound.packs.values()))
    assert torch.equal(ref, hs)
    assert sum(k.run._own.bytes_held() > 0 for pair in own for k in pair) == 2 * layers
    mlps[0].gate_up.bound.launcher(m).release()
    assert d.scratch.bytes_held() >= need_ws


def test_launchers_keep_pointers_only_while_the_pool_keeps_them(monkeypatch):
    """A launcher keeps its scratch pointers per (size, device, stream) and asks the pool again
    after anything that may have freed or replaced them: trim/clear (the epoch), an attach (another
    pool), a buffer zeroed under capture still to zero (dirty); beyond that no pool lookup."""
    import sys
    import types
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())      # the constructor's import only
    from autotune.core.problem import Problem
    from autotune.tactics.cuda.family import config
    from autotune.tactics.cuda.launch import Launch
    run = Launch(Problem.dense(6144, 1536), Tactic("cuda", warps_k=2, stages=2, tiles_n=1, split_k=4), "cpu", config)
    cpu = torch.device("cpu")
    made = []

    def make():
        made.append(1)
        return (run.workspace(4096, cpu, 0).data_ptr(),)
    first = run._pointers((1, cpu, 0), 0, make)
    assert run._pointers((1, cpu, 0), 0, make) == first and len(made) == 1        # kept
    run.scratch.trim()
    run._pointers((1, cpu, 0), 0, make)
    assert len(made) == 2                                                      # epoch changed
    shared = ScratchPool()
    run.attach(shared)
    p2 = run._pointers((1, cpu, 0), 0, make)
    assert len(made) == 3 and p2 == (shared.bufs[("cpu", 0, "splitk.ws")].data_ptr(),)
    shared.dirty.add(("cpu", 5, "splitk.locks"))
    assert run._pointers((1, cpu, 0), 0, make) == p2 and len(made) == 3       # another stream's: no matter
    shared.dirty.add(("cpu", 0, "splitk.locks"))
    run._pointers((1, cpu, 0), 0, make)
    run._pointers((1, cpu, 0), 0, make)
    assert len(made) == 5                                                      # dirty: asked every time
    shared.dirty.clear()
    assert run._pointers((1, cpu, 0), 0, make) == p2 and len(made) == 5          # kept again (still valid)
    run._pointers((2, cpu, 0), 0, make)
    assert len(made) == 6                                                      # another key: its own
