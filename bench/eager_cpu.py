"""The Python part of the eager call path, on the CPU: the torch family's GPU work
(dequantize + matmul) replaced by a no-op, so what is timed is what a call costs the host beyond
its kernel: the lookup, the checks, the output allocation and the calls in between.

    python3 bench/eager_cpu.py [--reps 200] [--batch 1000] [--json out.json]

Four GLM-5 TP8 dense shapes, bf16 x NVFP4 -> bf16, M=1, a warm table (one torch-family winner per
FlashInfer hybrid bucket up to 8192) in a temporary SQLite cache. Figures are µs per call, p50 /
p90 over batches (per-call mean of each batch), the Python loop included.

  dispatch((M,N,K))               the module-level lookup of the README, `[dispatch(s) for s in
                                  shapes]` (the form a serving engine calls)
  table(m) / bt.launcher(m)       the lookup bound to one problem / with one weight bound
  bound launcher(m)(x)[, out=]    lookup + x check + output allocation + (no-op) kernel
  FP4Linear(x)                    nn.Module call + forward's checks + the above
  dispatch((M,N,K))(x, w)         the unbound form: every operand checked per call
"""
from __future__ import annotations

import platform
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402

SHAPES = [(512, 6144), (3072, 6144), (6144, 256), (6144, 1536)]      # GLM-5 TP8 dense (N, K)


def per_call(fn, reps: int, batch: int, calls_per: int = 1) -> dict:
    """µs per call of fn (which makes calls_per calls), p50 / p90 over reps batches of `batch` (harness timing)."""
    fn()
    t = harness.time_host_ns(lambda r: [fn() for _ in range(batch)], batch * calls_per, reps)
    return {"p50": t["p50_ns"] / 1000, "p90": t["p90_ns"] / 1000}


def triton_bound(p, w):
    """The Triton family's bound W4A16 launcher with its direct route forced on and the launch
    itself (Triton's compiled C launcher) replaced by a no-op: its Python part on this CPU."""
    from autotune.tactics import registry
    from autotune.tactics.triton_fp4.bound_dense import _Plan
    from autotune.tactics.triton_fp4.w4a16 import tactic
    fam = registry.get("triton")
    t = tactic(16, 64, 256, 1, 4, 3, 2)
    b = fam.bind(p, t, fam.pack(fam.layout(t), w), "cpu")
    b.direct, b._stream = True, lambda idx: 0

    def plan(x, out, stream, _noop=lambda *args: None):
        pl = _Plan(stream=-1, epoch=b.scratch.epoch, run=_noop, tiles=96, split=2, function=0, metadata=None,
                   w_ptrs=b.w_ptrs, scratch_ptrs=(0, 0), tail=(p.n, p.k) + (0,) * 9)
        b.plans[x.shape[0]] = pl
        return pl
    b._plan = plan
    return b


def main() -> None:
    ap = harness.parser(__doc__)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import torch
    from autotune.core.tactic import Tactic
    from autotune.core.buckets import hybrid
    from autotune.core.env import cpu
    from autotune.core.formats import quantize
    from autotune.core.problem import Problem
    from autotune.core.records import Winner
    from autotune.runtime import dispatch as D
    from autotune.runtime.nn import FP4Linear
    from autotune.cache import Store
    from autotune.tactics import registry, torch_ref

    env, fam = cpu(), registry.get("torch")
    t = Tactic("torch", dequant_dtype="bf16", chunk_n=0)      # bf16: no cast of x, only the no-op kernel
    rows: dict = {}
    with tempfile.TemporaryDirectory() as d:
        with Store(Path(d) / "c.db") as s:
            s.put_environment(env, fam.depends_on)
            for n, k in SHAPES:
                p = Problem.dense(n, k)
                for b in hybrid(8192):
                    lib = env.lib_key(fam.depends_on)
                    s.put_winner(Winner(p.key, b, env.device_key, t.id, t.family, t.to_json(), lib, 10.0, t.id,
                                        10.0, 1.0, registry.code_key(t, lib)))
        disp = D.Dispatcher(Path(d) / "c.db", env=env, record_misses=False, warn=False)
    D.reset(disp)
    dispatch = D.dispatch
    shapes = [(1, n, k) for n, k in SHAPES]
    rows["dispatch((M,N,K)) module-level, 4 shapes"] = per_call(lambda: [dispatch(s) for s in shapes],
                                                               a.reps, a.batch // 4, 4)
    rows["dispatcher((M,N,K)) object, 4 shapes"] = per_call(lambda: [disp(s) for s in shapes], a.reps, a.batch // 4, 4)
    torch_ref._slab = lambda *args: None           # the GPU work: a no-op from here on
    torch_ref._dense = lambda x, w, dtype, chunk, out: out
    n, k = SHAPES[3]
    p = Problem.dense(n, k)
    w = quantize(torch.randn(n, k))
    x = torch.randn(1, k).bfloat16()
    out = torch.empty(1, n, dtype=torch.bfloat16)
    bt = disp.bind(p, w)
    table = disp.table(p)
    f = FP4Linear(w, dispatcher=disp)
    launch = bt.launcher(1)
    for name, fn in (("table(m)", lambda: table(1)), ("bt.launcher(m)", lambda: bt.launcher(1)),
                     ("launcher(x) (picked once)", lambda: launch(x)),
                     ("bound launcher(m)(x)", lambda: bt.launcher(1)(x)),
                     ("bound launcher(m)(x, out=)", lambda: bt.launcher(1)(x, out=out)),
                     ("FP4Linear(x)", lambda: f(x)),
                     ("dispatch((M,N,K))(x, w)", lambda: dispatch((1, n, k))(x, w)),
                     ("x.new_empty((1, N)) alone", lambda: x.new_empty((1, n)))):
        rows[name] = per_call(fn, a.reps, a.batch)
    tri = triton_bound(p, w)
    tri(x)
    rows["triton bound launcher(x), launch a no-op"] = per_call(lambda: tri(x), a.reps, a.batch)
    rows["triton bound launcher(x, out=), launch a no-op"] = per_call(lambda: tri(x, out=out), a.reps, a.batch)
    head = (f"python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}, "
            f"{a.reps} batches x {a.batch} calls, N={n} K={k} for the call rows")
    print(head)
    print("| path | p50 µs/call | p90 µs/call |\n|---|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['p50']:.3f} | {r['p90']:.3f} |")
    if a.json:
        harness.write(a, {"header": head, "rows": rows})


if __name__ == "__main__":
    main()
