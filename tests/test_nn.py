"""FP4Linear / FP4MoE: numerics, prepacked layouts, ModelOpt loading, torch.compile (CPU) and
CUDA-graph capture (H200, gpu-marked)."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from helpers import keyed
from autotune.runtime.bound import extra_bytes
from autotune.runtime.table import PIN_SLOT
from autotune.runtime.dispatch import Dispatcher
from autotune.core.env import cpu, current
from autotune.core.formats import FP4Weight, quantize
from autotune.core.modelopt import to_modelopt
from autotune.runtime.nn import FP4GroupedGEMM, FP4Linear
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.cache import Store
from autotune.core.tactic import Tactic
from autotune.tactics import registry
from autotune.tactics.torch_ref import TorchFamily
from autotune.runtime.table import DEFAULT, EXACT, NEAREST

CPU = cpu()
LIB = CPU.lib_key(("torch",))
T_A = Tactic("torch", dequant_dtype="fp32", chunk_n=0)
T_B = Tactic("torch", dequant_dtype="bf16", chunk_n=0)


def disp(tmp_path, winners=(), env=CPU) -> Dispatcher:
    with Store(tmp_path / "c.db") as s:
        for p, b, t in winners:
            s.put_winner(keyed(Winner(p.key, b, env.device_key, t.id, t.family, t.to_json(), env.lib_key(("torch",)),
                                      1.0, T_A.id, 1.0, 1.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(tmp_path / "c.db", env=env, record_misses=False, warn=False)


def ref_linear(x: torch.Tensor, w: FP4Weight, bias=None) -> torch.Tensor:
    y = x.double() @ w.dequantize(torch.float64).T
    return y if bias is None else y + bias.double()


def close(y, ref, tol=1e-2) -> bool:
    return float((y.double() - ref).norm() / ref.norm()) < tol


def test_linear_matches_reference_any_leading_dims_and_dtype(tmp_path):
    torch.manual_seed(0)
    lin = nn.Linear(256, 128)
    d = disp(tmp_path, [(Problem.dense(128, 256), 4, T_A)])
    f = FP4Linear.from_linear(lin, dispatcher=d)
    assert f.problem == Problem.dense(128, 256) and f.table is d.table(f.problem)
    x = torch.randn(2, 3, 256)
    y = f(x)
    assert y.shape == (2, 3, 128) and y.dtype == torch.float32
    assert close(y, ref_linear(x.bfloat16().float(), f.weight, f.bias.float()))
    yb = f(x.bfloat16())
    assert yb.dtype == torch.bfloat16
    assert [f.table.counts[EXACT], f.table.counts[NEAREST]] == [0, 2]        # M=6 twice: nearest to bucket 4 (clamped)
    with pytest.raises(ValueError, match="2-D weight"):
        FP4Linear(quantize(torch.randn(2, 16, 32)), dispatcher=d)


def test_linear_from_modelopt_safetensors(tmp_path):
    from safetensors.torch import save_file
    torch.manual_seed(1)
    w = quantize(torch.randn(64, 128))
    save_file({**to_modelopt(w, "model.layers.0.mlp.down_proj"), "other.weight": torch.zeros(3)},
              str(tmp_path / "m.safetensors"))
    f = FP4Linear.from_modelopt(str(tmp_path / "m.safetensors"), "model.layers.0.mlp.down_proj",
                                dispatcher=disp(tmp_path))
    assert torch.equal(f.packed, w.packed) and torch.equal(f.scales.view(torch.uint8), w.scales.view(torch.uint8))
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    assert close(f(x), ref_linear(x, w))
    assert f.table.counts[DEFAULT] == 1               # no winners: default rung, counted
    with pytest.raises(KeyError, match="missing"):
        FP4Linear.from_modelopt(str(tmp_path / "m.safetensors"), "nope", dispatcher=disp(tmp_path))


def test_compile_fullgraph_no_graph_break_dynamic_m(tmp_path):
    torch.manual_seed(2)
    p = Problem.dense(128, 256)
    d = disp(tmp_path, [(p, 1, T_A), (p, 8, T_B)])
    f = FP4Linear.from_linear(nn.Linear(256, 128, bias=False), dispatcher=d)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True, dynamic=True)      # fullgraph: a graph break would raise
    for m in (1, 5, 8, 33):
        x = torch.randn(m, 256, dtype=torch.bfloat16)
        assert torch.equal(cf(x), f(x))
    # every compiled call went through the table at run time (not frozen at trace time)
    assert f.table.counts[EXACT] == 2 * 2 and f.table.counts[NEAREST] == 2 * 2
    exp = torch._dynamo.explain(f)(torch.randn(4, 256, dtype=torch.bfloat16))
    assert exp.graph_break_count == 0 and exp.graph_count == 1


def test_eager_calls_skip_the_custom_op_and_compiled_calls_use_it(tmp_path, monkeypatch):
    import autotune.runtime.layers as nnmod   # the ops look layers up there
    op_calls = []
    real = nnmod._layer
    monkeypatch.setattr(nnmod, "_layer", lambda i: (op_calls.append(i), real(i))[1])   # only the ops look layers up
    p = Problem.dense(128, 256)
    f = FP4Linear.from_linear(nn.Linear(256, 128, bias=False), dispatcher=disp(tmp_path, [(p, 1, T_A)]))
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    y = f(x)
    assert op_calls == [] and f.table.counts[NEAREST] == 1          # eager: straight to the bound launcher
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True)(x), y)
    assert f.layer_id in op_calls                             # compiled: through fp4_autotune::linear
    y1, y2 = f(x), f(x)
    assert y1.data_ptr() != y2.data_ptr()                     # two calls never return aliased outputs


def test_moe_matches_reference_and_compiles(tmp_path):
    torch.manual_seed(3)
    e, n, k, top_k, m = 4, 64, 128, 2, 6
    experts = [nn.Linear(k, n, bias=False) for _ in range(e)]
    d = disp(tmp_path, [(Problem.moe(n, k, e, top_k), 8, T_A)])
    f = FP4GroupedGEMM.from_linears(experts, top_k, dispatcher=d)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    ids = torch.randint(0, e, (m, top_k))
    wts = torch.rand(m, top_k)
    y = f(x, ids, wts)
    assert y.shape == (m, top_k, n) and y.dtype == torch.bfloat16
    deq = f.weight.dequantize(torch.float64)
    ref = torch.stack([torch.stack([x[i].double() @ deq[ids[i, j]].T * wts[i, j] for j in range(top_k)])
                       for i in range(m)])
    assert close(y, ref)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True)
    assert torch.equal(cf(x, ids, wts), y)
    assert f.table.counts[NEAREST] == 2


def test_moe_from_modelopt(tmp_path):
    from safetensors.torch import save_file
    torch.manual_seed(4)
    ws = [quantize(torch.randn(32, 64)) for _ in range(3)]
    t = {}
    for i, w in enumerate(ws):
        t.update(to_modelopt(w, f"mlp.experts.{i}.down_proj"))
    save_file(t, str(tmp_path / "e.safetensors"))
    f = FP4GroupedGEMM.from_modelopt(str(tmp_path / "e.safetensors"), [f"mlp.experts.{i}.down_proj" for i in range(3)],
                             top_k=1, dispatcher=disp(tmp_path))
    assert f.problem == Problem.moe(32, 64, 3, 1) and f.global_scale.shape == (3,)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    ids = torch.tensor([[0], [2], [1], [2]])
    y = f(x, ids)
    for i in range(4):
        assert close(y[i, 0], x[i].double() @ ws[int(ids[i, 0])].dequantize(torch.float64).T)


def copy_layout(monkeypatch, calls: list) -> None:
    """The torch family reads a second layout, "copy" (a separate contiguous copy), for bf16 tactics."""
    def layout(self, t):
        return "copy" if t["dequant_dtype"] == "bf16" else "fp4-linear"

    def pack(self, lay, w):
        if lay != "copy":
            return w.contiguous()
        calls.append(w)
        return FP4Weight(w.packed.clone(), w.scales.clone(), w.global_scale.clone(), w.fmt)
    monkeypatch.setattr(TorchFamily, "layout", layout)
    monkeypatch.setattr(TorchFamily, "pack", pack)


def test_prepacked_once_per_layout_and_each_bucket_gets_its_own(tmp_path, monkeypatch):
    """Buckets whose winners want different layouts keep one packed copy each; packing happens at
    load (and after .to()), never per call."""
    calls = []
    copy_layout(monkeypatch, calls)
    p = Problem.dense(128, 256)
    d = disp(tmp_path, [(p, 1, T_A), (p, 16, T_B)])
    f = FP4Linear.from_linear(nn.Linear(256, 128, bias=False), dispatcher=d)
    packs = f.bound.packs
    assert list(packs) == ["fp4-linear", "copy"]
    assert len(calls) == 1 and f.prepacked_extra_bytes == f.weight.nbytes    # one extra copy, counted
    launchers = f.bound.launchers                    # record which weight each bucket's launcher reads
    assert launchers[0].weight is packs["fp4-linear"] and launchers[1].weight is packs["copy"]
    seen = []
    f.bound.launchers = tuple((lambda x, out=None, k=k: (seen.append(k.weight), k(x, out=out))[1]) for k in launchers)
    x1, x9 = torch.randn(1, 256, dtype=torch.bfloat16), torch.randn(9, 256, dtype=torch.bfloat16)
    for _ in range(3):
        f(x1)
        f(x9)
    assert len(calls) == 1                           # no packing per call
    assert len(seen) == 6
    assert all(w is f.packs[0] for w in seen[0::2]) and all(w is f.packs[1] for w in seen[1::2])
    f.bound.launchers = launchers
    assert isinstance(f.packs[0], FP4Weight) and f.packs[0].packed is f.packed   # linear layout: a view
    w0 = f.weight
    f.to(torch.bfloat16)                              # a module cast re-packs and leaves FP4 bytes alone
    assert len(calls) == 2
    w1 = f.weight
    assert w1.scales.dtype == torch.float8_e4m3fn and w1.global_scale.dtype == torch.float32
    assert torch.equal(w1.global_scale, w0.global_scale) and torch.equal(w1.scales.view(torch.uint8),
                                                                          w0.scales.view(torch.uint8))


def test_layout_memory_costs():
    w = quantize(torch.randn(200, 96))
    triton_t = Tactic("triton", kernel="dequant_cublas", block_n=32, block_k=256, num_warps=4)
    tri, tor = registry.get("triton"), registry.get("torch")
    assert tri.layout(triton_t) == "fp4-linear-u8" and tor.layout(T_A) == "fp4-linear"
    packs = [tor.pack(tor.layout(T_A), w), tri.pack(tri.layout(triton_t), w)]
    assert extra_bytes(w, packs) == 0                       # both layouts are views
    assert packs[1].scales.dtype == torch.uint8 and packs[1].packed.data_ptr() == w.packed.data_ptr()
    copy = FP4Weight(w.packed.clone(), w.scales.clone(), w.global_scale.clone(), w.fmt)
    assert extra_bytes(w, [copy]) == w.nbytes
    with pytest.raises(ValueError, match="has no weight layout 'nope'"):
        tor.pack("nope", w)


# ------------------------------------------------------------------------------------- H200

@pytest.mark.gpu
def test_cuda_graph_capture_replays_the_bucket_kernel(tmp_path):
    """The kernel is picked on the host at capture; replays run it for new inputs. Winners at
    buckets 1 and 16 with different Triton tactics; M=16 exact, M=3 nearest, M=40 clamped."""
    env = current()
    from autotune.tactics import registry
    tri = registry.get("triton")
    p = Problem.dense(256, 512)
    from autotune.core.arch import detect
    arch = detect()
    kept = [t for t in tri.enumerate(p, arch) if tri.verdict(p, t, arch).ok]
    small = next(t for t in kept if t.get("block_m") == 16 and t.get("split_k", 1) > 1)    # split-K: owns a workspace
    big = next(t for t in kept if t.get("block_m") == 64 and t.get("split_k", 1) == 1)
    with Store(tmp_path / "c.db") as s:
        for b, t in ((1, small), (16, big)):
            s.put_winner(keyed(Winner(p.key, b, env.device_key, t.id, t.family, t.to_json(),
                                      env.lib_key(tri.depends_on), 1.0, t.id, 1.0, 1.0)))
    d = Dispatcher(tmp_path / "c.db", env=env, record_misses=False, warn=False)
    assert d.skipped == {} and d.table(p).tactics == (small, big)
    torch.manual_seed(5)
    f = FP4Linear.from_linear(nn.Linear(512, 256, bias=False), dispatcher=d).cuda()
    assert list(f.bound.packs) == ["fp4-linear-u8"] and f.packs[0].packed.is_cuda
    ms = (1, 3, 16, 40)
    f.warmup(ms)                                         # compile outside the captured region
    graphs = {}
    for m in ms:
        x = torch.zeros(m, 512, dtype=torch.bfloat16, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = f(x)
        graphs[m] = (g, x, y)
    counts = list(f.table.counts)
    for m, (g, x, y) in graphs.items():
        for _ in range(3):
            x.copy_(torch.randn(m, 512, dtype=torch.bfloat16, device="cuda"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, f(x)), m                 # replay == eager with the same kernel
            assert close(y, ref_linear(x, f.weight))
    assert f.table.counts[EXACT] - counts[EXACT] == 2 * 3 and f.table.counts[NEAREST] - counts[NEAREST] == 2 * 3


@pytest.mark.gpu
def test_compile_reduce_overhead_on_cuda(tmp_path):
    """torch.compile with CUDA graphs (mode="reduce-overhead"): no graph break, replays equal eager."""
    env = current()
    Store(tmp_path / "c.db").close()
    d = Dispatcher(tmp_path / "c.db", env=env, record_misses=False, warn=False)    # empty cache: default rung
    torch.manual_seed(6)
    f = FP4Linear.from_linear(nn.Linear(512, 256, bias=True), dispatcher=d).cuda()
    f.warmup((8, 2))
    torch._dynamo.reset()
    cf = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    for m in (2, 8):
        for _ in range(4):                              # warm-up runs, then recorded, then replayed
            x = torch.randn(m, 512, dtype=torch.bfloat16, device="cuda")
            y = cf(x).clone()
            assert torch.equal(y, f(x)), m


def test_pin_with_a_new_layout_repacks_the_layer(tmp_path, monkeypatch):
    copy_layout(monkeypatch, [])
    p = Problem.dense(128, 256)
    d = disp(tmp_path, [(p, 4, T_A)])
    f = FP4Linear.from_linear(nn.Linear(256, 128, bias=False), dispatcher=d)
    assert list(f.bound.packs) == ["fp4-linear"] and len(f.packs) == 1
    x = torch.randn(3, 256, dtype=torch.bfloat16)
    y = f(x)
    d.pin(p, T_B)
    assert f.table.rung_for(3) == ("pinned", T_B)
    yp = f(x)                                          # the layer notices the pin and binds again
    # a pin answers every M: only its layout is packed (no launcher for rungs it never reaches)
    assert list(f.bound.packs) == ["copy"] and f.packs[0].packed is not f.packed and f.bound.launchers == ()
    assert f.bound.launcher(3).weight is f.bound.packs["copy"] and f.table.index(3) == PIN_SLOT
    assert close(yp, ref_linear(x, f.weight)) and close(y, ref_linear(x, f.weight))
    d.unpin(p)
    assert f.table.rung_for(3)[0] == "nearest" and f.bound.launcher(3).weight is f.bound.packs["fp4-linear"]
