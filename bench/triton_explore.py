"""One-call exploration of the Triton W4A16 family on a CUDA GPU (issue #4), before the full bench.

    python3 bench/triton_explore.py [--out DIR]

1. ceilings: device-to-device copy bandwidth (bytes read + written) and the bf16 GEMM rate;
2. precompiles every candidate in 16 processes through TritonFamily.precompile, then checks that
   the JIT launch found it in the cache (first-launch time);
3. correctness: each candidate against the float64 reference with NaN-poisoned outputs;
4. timing (autotune.engine.timing.time_calls: cold L2 rotation, CUDA-graph replay for short calls) of
   decode candidates at M = 1, 16 and prefill candidates at M = 4096 on GLM-5 shapes, with
   cuBLAS bf16 on pre-dequantized weights beside them.
Writes explore.json to --out and prints a short table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402
from autotune.tactics.triton_fp4.dequant_cublas import KERNEL as DQ_KERNEL, TILE as DQ_TILE  # noqa: E402
from autotune.tactics.triton_fp4.family import TritonFamily  # noqa: E402

FAM = TritonFamily()
SHAPES = {"tp1_gate_up": (24576, 6144), "tp1_down": (6144, 12288), "tp8_gate_up": (3072, 6144),
          "tp8_shared_gate_up": (512, 6144)}


def t(bm, bn, bk, w, s, sk=1, gm=1):
    return FAM._tactic(bm, bn, bk, gm, w, s, sk)


DECODE = [t(16, bn, bk, 4, s, sk) for bn in (32, 64, 128) for bk in (128, 256) for s in (3, 4)
          for sk in (1, 2, 4, 8, 16) if not (bn == 128 and bk == 256 and s == 4)]
PREFILL = [t(bm, bn, bk, w, s, 1, 8) for bm, bn, bk, w in ((128, 128, 64, 8), (128, 256, 64, 8), (128, 128, 128, 8),
                                                           (64, 128, 128, 4), (64, 256, 64, 8), (128, 64, 128, 4),
                                                           (64, 128, 64, 4), (128, 128, 64, 4))
           for s in (3, 4)]
DQ = Tactic("triton", kernel=DQ_KERNEL, **DQ_TILE)


def _pre(args):
    key, tj = args
    from autotune.core.problem import Problem
    from autotune.core.arch import get_arch
    t0 = time.perf_counter()
    try:
        smem = FAM.precompile(Problem.from_key(key), Tactic.from_json(tj), get_arch("sm90"))
        return key, tj, smem, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        return key, tj, None, f"{type(e).__name__}: {str(e)[:300]}", time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args()
    res: dict = {"notes": []}
    probs = {name: Problem.dense(n, k, "nvfp4") for name, (n, k) in SHAPES.items()}
    cands = {name: DECODE + PREFILL for name in probs}

    # -- 2. precompile (before CUDA is initialised in this process) --
    items = sorted({(p.key, c.to_json()) for name, p in probs.items() for c in cands[name]
                    if FAM.verdict(p, c, __import__("autotune.core.arch", fromlist=["x"]).get_arch("sm90")).ok})
    t0 = time.perf_counter()
    import multiprocessing as mp
    with ProcessPoolExecutor(16, mp_context=mp.get_context("spawn")) as ex:
        pre = list(ex.map(_pre, items))
    res["precompile"] = {"items": len(items), "wall_s": time.perf_counter() - t0,
                         "errors": [r for r in pre if r[3]][:10]}
    pre_smem = {(k, tj): s for k, tj, s, e, _ in pre}
    print(f"precompiled {len(items)} in {res['precompile']['wall_s']:.1f}s, errors {len(res['precompile']['errors'])}",
          flush=True)
    for e in res["precompile"]["errors"][:3]:
        print("  ", e, flush=True)

    import torch
    import triton

    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.core.arch import detect
    arch = detect()
    res["env"] = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                  "arch": arch.name}
    print(res["env"], flush=True)

    # -- 1. ceilings --
    nb = 1 << 30
    src = torch.randint(0, 255, (nb,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); dst.copy_(src); e1.record(); e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    copy_bw = 2 * nb / sorted(times)[len(times) // 2]
    del src, dst
    g = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    times = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record(); g @ h; e1.record(); e1.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    gemm = 2 * 8192 ** 3 / sorted(times)[len(times) // 2]
    del g, h
    res["ceilings"] = {"copy_GBps": copy_bw / 1e9, "bf16_TFLOPs": gemm / 1e12}
    print(res["ceilings"], flush=True)

    timer = timing.TimerConfig(budget_s=0.05, max_reps=30)
    rows = []
    for name, p in probs.items():
        for m in (1, 16, 4096):
            if m == 4096 and name not in ("tp1_gate_up", "tp8_gate_up"):
                continue
            one = inputs.make_inputs(p, m, "cuda", seed=m)[0]
            n_sets = timing.sets_for_cold_l2(one.nbytes(), "cuda", cap=8)
            sets = [one] + (inputs.make_inputs(p, m, "cuda", seed=m + 1, n_sets=n_sets - 1) if n_sets > 1 else [])
            ref = inputs.reference(p, sets[0])
            outs = [inputs.torch_empty_out(p, m, s) for s in sets]
            wq = [s.w.dequantize(torch.bfloat16) for s in sets]
            tm = timing.time_calls(lambda i: torch.matmul(sets[i].x, wq[i].T, out=outs[i]), len(sets), "cuda", timer)
            wbytes = p.n * p.k // 2 + p.n * p.k // 16
            io = wbytes + m * p.k * 2 + m * p.n * 2
            rows.append({"shape": name, "m": m, "tactic": "cublas_bf16", "us": tm.median_us, "iqr": tm.iqr_us})
            print(f"{name} m={m} cublas {tm.median_us:.1f}us floor(copy) {io / copy_bw * 1e6:.1f}us", flush=True)
            del wq
            cl = [c for c in cands[name] if (m <= 16) == (c in DECODE)] + [DQ]
            for c in cl:
                if not FAM.verdict(p, c, arch).ok:
                    continue
                k = FAM.build(p, c, "cuda")
                t1 = time.perf_counter()
                try:
                    err = inputs.check(p, k, sets[0], ref)
                except Exception as e:  # noqa: BLE001
                    rows.append({"shape": name, "m": m, "tactic": c.params, "fail": f"{type(e).__name__}: {str(e)[:200]}"})
                    print("FAIL", name, m, c.params, str(e)[:200], flush=True)
                    continue
                first = time.perf_counter() - t1
                tt = timing.time_calls(lambda i: k(*sets[i].args(), out=outs[i]), len(sets), "cuda", timer)
                r = {"shape": name, "m": m, "tactic": c.params, "us": tt.median_us, "iqr": tt.iqr_us, "err": err,
                     "first_call_s": first, "smem": getattr(k, "smem_compiled", None),
                     "smem_model": getattr(k, "smem_model", None), "smem_pre": pre_smem.get((p.key, c.to_json())),
                     "GBps": io / (tt.median_us * 1e-6) / 1e9, "TFLOPs": 2 * m * p.n * p.k / (tt.median_us * 1e-6) / 1e12}
                rows.append(r)
            best = sorted([r for r in rows if r["shape"] == name and r["m"] == m and "us" in r], key=lambda r: r["us"])[:4]
            for r in best:
                print(f"   {r['us']:.1f}us {r.get('GBps', 0):.0f}GB/s {r['tactic']}", flush=True)
            del sets, outs, ref
            torch.cuda.empty_cache()
            res["rows"] = rows
            Path(a.out, "explore.json").write_text(json.dumps(res, indent=1, default=str))
    mism = [r for r in rows if r.get("smem") is not None and r.get("smem_model") is not None and r["smem"] != r["smem_model"]]
    slow_first = [r for r in rows if r.get("first_call_s", 0) > 0.5]
    print(f"smem model != compiled (Triton {triton.__version__}): {len(mism)} of "
          f"{len([r for r in rows if r.get('smem') is not None])}", flush=True)
    for r in mism[:12]:
        print("  ", r["tactic"], "model", r["smem_model"], "compiled", r["smem"], "pre", r["smem_pre"])
    print(f"first calls > 0.5 s (JIT compiled despite precompile): {len(slow_first)}", flush=True)
    Path(a.out, "explore.json").write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
