"""Host cost of the eager call path on a CUDA GPU, all columns in one run.

    python3 bench/eager_h200.py --out DIR          # on the H200; DIR/eager_h200.json + tables on stdout

Four GLM-5 dense shapes (TP1/TP8 gate_up and down) at M=1, bf16 x NVFP4 -> bf16, one Triton
w4a16 tactic per shape written into a temporary cache as the bucket-1 winner (split-K chosen by
rule, not tuned: this bench measures the call path, not the tactic). Per shape:

  wall µs/call   1,000 eager calls, synchronised only at the ends (median of 3):
                 `dispatch((M, N, K))(x, w)` (module level, unbound), the bound launcher
                 `bt.launcher(M)(x)`, `FP4Linear(x)`, `torch.matmul(x, W_bf16.T)`
  GPU µs/call    CUDA-graph replay of one call per weight copy (copies rotated past 2x the L2):
                 the bound launcher and cuBLAS bf16
  issue µs/call  host issue time: 1,000 calls enqueued while the stream is held behind a
                 `torch.cuda._sleep` spin, so the figure is host work alone (`held` says the spin
                 was still running when the last call returned)
  routes         the direct route (tactics/triton_fp4/direct.py) against the bound launcher on
                 Triton's own launch ($AUTOTUNE_LAUNCH=triton), the plan's raw launch, the custom op
                 `fp4_autotune::linear`, an empty Triton kernel, and host-only pieces of a call
  checks         bit for bit: direct route == Triton's launch at M = 1, 5, 64, 300 and dequant_cublas;
                 FP4Linear under torch.compile (fullgraph) for TP8 down; a cuLaunchKernel
                 (cuda-bindings) experiment on Triton's cubin, last (it may break the context)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = [("TP1 gate_up", 24576, 6144), ("TP1 down", 6144, 12288), ("TP8 gate_up", 3072, 6144),
          ("TP8 down", 6144, 1536)]
CALLS = 1000
SPIN_CYCLES = 250_000_000          # ~0.13 s at 1.98 GHz: longer than 1,000 host calls of 80 µs
L2_BYTES = 60 << 20


def _tactic(n: int, k: int):
    """A split-K W4A16 tactic by rule: 64-wide tiles, enough programs for 132 SMs twice."""
    from autotune.tactics.triton_fp4.w4a16 import tactic
    bk = 256 if k % 256 == 0 else 128
    tiles, sk = n // 64, 1
    while tiles * sk < 264 and sk < 16:
        sk *= 2
    while sk > 1 and k // bk < 2 * sk:
        sk //= 2
    return tactic(16, 64, bk, 1, 4, 3, sk)


def _med(f, reps: int = 3) -> float:
    return statistics.median(f() for _ in range(reps))


def wall_us(fn, n: int = CALLS) -> float:
    import torch
    fn()
    torch.cuda.synchronize()

    def once():
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6
    return _med(once)


def issue_us(fn, n: int = CALLS) -> tuple[float, bool, int]:
    """Host µs per call with the stream held behind a spin kernel: (µs, held, calls). held=False:
    the GPU caught up (the launch queue filled and blocked the host); then again with 256 calls."""
    import torch
    fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(2):
        torch.cuda._sleep(SPIN_CYCLES)
        ev = torch.cuda.Event()
        ev.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        res.append((dt / n * 1e6, not ev.query()))
        torch.cuda.synchronize()
    held = all(r[1] for r in res)
    if not held and n > 256:
        return issue_us(fn, 256)
    return statistics.median(r[0] for r in res), held, n


def graph_us(fns) -> float:
    """GPU µs per call: one graph holding one call of each fn (weight copies), replayed 20 times."""
    import torch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / len(fns))
    return statistics.median(times)


def host_us(fn, n: int = 100_000) -> float:
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def setup(tmp: Path):
    """Dispatcher over a cache holding one Triton winner (bucket 1) per shape; the module-level
    dispatch() serves from it."""
    import torch
    from autotune.core.env import current
    from autotune.core.problem import Problem
    from autotune.core.records import Winner
    from autotune.runtime import dispatch as D
    from autotune.cache import Store
    from autotune.tactics import registry
    env, tri = current(), registry.get("triton")
    with Store(tmp / "c.db") as s:
        s.put_environment(env, tri.depends_on)
        for _, n, k in SHAPES:
            p, t = Problem.dense(n, k), _tactic(n, k)
            lib = env.lib_key(tri.depends_on)
            s.put_winner(Winner(p.key, 1, env.device_key, t.id, t.family, t.to_json(), lib,
                                10.0, t.id, 10.0, 1.0, registry.code_key(t, lib)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = D.Dispatcher(tmp / "c.db", env=env, record_misses=False, warn=False)
    assert not d.skipped, d.skipped
    D.reset(d)
    torch.manual_seed(0)
    return d


def _slow_twin(bt):
    """The same table and weight bound with $AUTOTUNE_LAUNCH=triton (Triton's own launch)."""
    from autotune.runtime.bound import BoundTable
    os.environ["AUTOTUNE_LAUNCH"] = "triton"
    try:
        return BoundTable(bt.table, bt.weight, bt.device)
    finally:
        del os.environ["AUTOTUNE_LAUNCH"]


def shape_rows(d, name: str, n: int, k: int) -> dict:
    import torch
    from autotune.core.formats import quantize
    from autotune.core.problem import Problem
    from autotune.runtime.dispatch import dispatch
    from autotune.runtime.nn import FP4Linear
    p = Problem.dense(n, k)
    w = quantize(torch.randn(n, k, device="cuda"))
    wbf = w.dequantize(torch.bfloat16)
    x = torch.randn(1, k, device="cuda").bfloat16()
    bt = d.bind(p, w)
    slow = _slow_twin(bt)
    f = FP4Linear(w, dispatcher=d)
    launch, slow_launch = bt.launcher(1), slow.launcher(1)
    out = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
    r: dict = {"shape": name, "n": n, "k": k, "tactic": str(bt.table.rung_for(1)[1]),
               "direct": bool(getattr(launch, "direct", False)), "why_not_direct": getattr(launch, "why", None)}
    # bit for bit: direct route == Triton's launch
    same = {}
    for m in (1, 5, 64, 300):
        xm = torch.randn(m, k, device="cuda").bfloat16()
        a, b = bt.launcher(m)(xm), slow.launcher(m)(xm)
        same[m] = bool(torch.equal(a, b))
    r["bit_identical"] = same
    r["why_not_direct_after"] = getattr(launch, "why", None)
    r["launches_direct_vs_triton"] = [list(launch.launches), list(slow_launch.launches)]
    cols = {
        "dispatch((M,N,K))(x,w)": lambda: dispatch((1, n, k))(x, w),
        "bound launcher(M)(x)": lambda: bt.launcher(1)(x),
        "bound, out=": lambda: launch(x, out=out),
        "bound via Triton launch": lambda: slow.launcher(1)(x),
        "FP4Linear(x)": lambda: f(x),
        "custom op fp4_autotune::linear": lambda: torch.ops.fp4_autotune.linear(x, f.layer_id),
        "torch.matmul bf16": lambda: torch.matmul(x, wbf.T),
        "torch.matmul bf16, out=": lambda: torch.matmul(x, wbf.T, out=out),
    }
    plan = launch.plans.get(1) if hasattr(launch, "plans") else None
    if plan is not None:
        xp, op = x.data_ptr(), out.data_ptr()
        gs = launch._stream
        cols["raw plan launch (precomputed args)"] = \
            lambda: plan[2](plan[3], plan[4], 1, gs(0), plan[5], plan[6], None, None, None, xp, *plan[7], op,
                            *plan[8], 1, *plan[9])
    r["wall"] = {c: wall_us(fn) for c, fn in cols.items()}
    r["issue"] = {c: issue_us(fn) for c, fn in cols.items()}
    copies = max(1, min(32, -(-2 * L2_BYTES // (n * k // 2 + n * k // 16))))
    ws = [w] + [quantize(torch.randn(n, k, device="cuda")) for _ in range(copies - 1)]
    bts = [bt] + [d.bind(p, wi) for wi in ws[1:]]
    bfs = [wbf] + [wi.dequantize(torch.bfloat16) for wi in ws[1:]]
    r["gpu_copies"] = copies
    r["gpu_fp4"] = graph_us([lambda b=b: b.launcher(1)(x) for b in bts])
    r["gpu_cublas"] = graph_us([lambda b=b: torch.matmul(x, b.T) for b in bfs])
    del bfs, ws, bts
    r["_objs"] = (bt, f, x, w, launch)
    return r


def pieces(bt, x) -> dict:
    """Host-only parts of a bound call (nothing launched)."""
    import torch
    launch = bt.launcher(1)
    idx = x.device.index
    return {"table.index(m)": host_us(lambda: bt.table.index(1)),
            "bt.launcher(m) (pick)": host_us(lambda: bt.launcher(1)),
            "x check (x_checker)": host_us(lambda: launch.check(x)),
            "output x.new_empty((1, N))": host_us(lambda: x.new_empty((1, 6144))),
            "current stream (raw)": host_us(lambda: torch._C._cuda_getCurrentRawStream(idx)),
            "x.data_ptr()": host_us(lambda: x.data_ptr()),
            "plans dict lookup": host_us(lambda: launch.plans.get(1))}


def empty_triton_issue() -> float:
    import torch
    import triton

    @triton.jit
    def _empty(p):
        pass
    t = torch.empty(16, device="cuda")
    return issue_us(lambda: _empty[(1,)](t))[0]


def compiled_rows(d, n: int, k: int) -> dict:
    import torch
    from autotune.core.formats import quantize
    from autotune.runtime.nn import FP4Linear
    f = FP4Linear(quantize(torch.randn(n, k, device="cuda")), dispatcher=d)
    x = torch.randn(1, k, device="cuda").bfloat16()
    cf = torch.compile(f, fullgraph=True)
    t0 = time.perf_counter()
    y = cf(x)
    torch.cuda.synchronize()
    return {"compile_s": time.perf_counter() - t0, "equal_eager": bool(torch.equal(y, f(x))),
            "wall compiled FP4Linear": wall_us(lambda: cf(x)), "issue compiled FP4Linear": issue_us(lambda: cf(x)),
            "wall eager FP4Linear": wall_us(lambda: f(x)), "issue eager FP4Linear": issue_us(lambda: f(x))}


def culaunch_experiment(launch, slow_launch, x) -> dict:
    """cuLaunchKernel through cuda-bindings on the cubin Triton loaded: same args as the plan plus
    Triton's two trailing scratch pointers (null; these kernels use no scratch)."""
    import ctypes

    import torch
    from cuda.bindings import driver as cu
    m = x.shape[0]
    ref = slow_launch(x)
    out = torch.empty_like(ref)
    launch(x, out=out)
    plan, ck = launch.plans[m], launch.inner.compiled
    fn, nw, shared = cu.CUfunction(init_value=plan[5]), ck.metadata.num_warps, ck.metadata.shared
    vals = (x.data_ptr(), *plan[7], out.data_ptr(), *plan[8], m, *plan[9][:2], 0, 0)
    P, I = ctypes.c_void_p, ctypes.c_int32
    types = (P, P, P, P, P, P, P, I, I, I, P, P)
    out.fill_(float("nan"))
    stream = cu.CUstream(init_value=torch.cuda.current_stream().cuda_stream)

    def go():
        return cu.cuLaunchKernel(fn, plan[3], plan[4], 1, 32 * nw, 1, 1, shared, stream, (vals, types), 0)[0]
    err = go()
    torch.cuda.synchronize()
    res = {"err": str(err), "bit_identical": bool(torch.equal(out, ref))}
    res["issue_us"] = issue_us(go)[0]
    res["wall_us"] = wall_us(go)
    return res


def table_md(rows: list[dict], key: str) -> str:
    cols = list(rows[0][key])
    head = "| shape | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols) + "\n"
    fmt = (lambda v: f"{v[0]:.1f}{'' if v[1] else ' (not held)'}{'' if v[2] == CALLS else f' [{v[2]}]'}") \
        if key == "issue" else (lambda v: f"{v:.1f}")
    return head + "".join(f"| {r['shape']} | " + " | ".join(fmt(r[key][c]) for c in cols) + " |\n" for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".")
    a = ap.parse_args()
    import torch
    import triton
    out = Path(a.out)
    doc = {"torch": torch.__version__, "triton": triton.__version__, "gpu": torch.cuda.get_device_name(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.version.split()[0]}
    save = lambda: (out / "eager_h200.json").write_text(json.dumps(doc, indent=1, default=str))  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        d = setup(Path(tmp))
        rows = []
        for name, n, k in SHAPES:
            rows.append(shape_rows(d, name, n, k))
            doc["rows"] = [{k_: v for k_, v in r.items() if k_ != "_objs"} for r in rows]
            save()
            print(name, json.dumps(doc["rows"][-1], default=str), flush=True)
        bt, f, x, w, launch = rows[-1]["_objs"]
        doc["pieces_tp8_down"] = pieces(bt, x)
        doc["empty_triton_issue_us"] = empty_triton_issue()
        save()
        from autotune.core.problem import Problem
        from autotune.core.tactic import Tactic
        from autotune.tactics import registry
        tri = registry.get("triton")
        dq = Tactic("triton", kernel="dequant_cublas", block_n=32, block_k=256, num_warps=4)
        pk = tri.pack(tri.layout(dq), w)
        fast_dq = tri.bind(Problem.dense(6144, 1536), dq, pk, "cuda")
        os.environ["AUTOTUNE_LAUNCH"] = "triton"
        slow_dq = tri.bind(Problem.dense(6144, 1536), dq, pk, "cuda")
        del os.environ["AUTOTUNE_LAUNCH"]
        x300 = torch.randn(300, 1536, device="cuda").bfloat16()
        doc["dequant_cublas_bit_identical"] = bool(torch.equal(fast_dq(x300), slow_dq(x300)))
        save()
        doc["compiled"] = {}
        for name, n, k in SHAPES[3:]:
            try:
                doc["compiled"][name] = compiled_rows(d, n, k)
            except Exception as e:  # noqa: BLE001 - reported
                doc["compiled"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            save()
        print("## wall µs/call\n" + table_md(doc["rows"], "wall"))
        print("## host issue µs/call\n" + table_md(doc["rows"], "issue"))
        for r in doc["rows"]:
            print(r["shape"], "GPU fp4/cublas", round(r["gpu_fp4"], 1), round(r["gpu_cublas"], 1), "copies",
                  r["gpu_copies"], "bit", r["bit_identical"], r["tactic"], "direct", r["direct"])
        print("pieces", json.dumps(doc["pieces_tp8_down"]), "empty triton issue", doc["empty_triton_issue_us"])
        print("dequant_cublas bit identical", doc["dequant_cublas_bit_identical"])
        print("compiled", json.dumps(doc["compiled"], default=str))
        try:
            slow = _slow_twin(bt).launcher(1)
            doc["culaunch"] = culaunch_experiment(launch, slow, x)
        except Exception as e:  # noqa: BLE001 - reported
            doc["culaunch"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
        save()
        print("culaunch", json.dumps(doc["culaunch"], default=str))


if __name__ == "__main__":
    main()
