"""cuBLASLt family on a live GPU: enumerate, serialize, replay in a fresh process, compare timings.

Run on the H200 (SM90; bf16 and FP8 baseline problems, since it has no FP4 tensor cores):
    python3 bench/cublaslt_h200.py --out /tmp/cublaslt.json
Phase 1 (this process): for each problem, the family's live enumeration (nvmath Matmul.plan at
a few M, merged), then each algorithm timed at --m through the nvmath object plan() returned,
and every tactic written as JSON (config + 96-byte heuristic result + cuBLAS version).
Phase 2 (a fresh subprocess): the JSON is read back, each tactic rebuilt into an nvmath
Algorithm from its bytes, planned with plan(algorithms=[...]) and timed again; the output of the
family's Launcher is checked against torch. Timing: CUDA events around `--iters` back-to-back
`execute()` calls (so Python launch overhead is included; see docs), median and IQR of `--reps`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROBLEMS = [  # GLM-5 shared-expert shapes (see autotune/models), as bf16 and FP8 baselines
    ("dense:bf16*bf16->bf16:n4096:k6144"), ("dense:bf16*bf16->bf16:n6144:k2048"),
    ("dense:fp8*fp8->bf16:n4096:k6144"), ("dense:fp8*fp8->bf16:n6144:k2048"),
]


def time_mm(mm, alg, iters: int, reps: int) -> tuple[float, float]:
    """(median µs per call, IQR µs) of `iters` back-to-back executes, `reps` times."""
    import torch
    for _ in range(3):
        mm.execute(algorithm=alg)
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            mm.execute(algorithm=alg)
        e.record()
        e.synchronize()
        samples.append(s.elapsed_time(e) * 1e3 / iters)
    q = statistics.quantiles(samples, n=4)
    return statistics.median(samples), q[2] - q[0]


def phase1(args) -> dict:
    import torch
    from autotune.core.problem import Problem
    from autotune.tactics import cublaslt as cl
    out = {"device": torch.cuda.get_device_name(0), "cc": list(torch.cuda.get_device_capability(0)),
           "cublas": cl.cublas_version(), "torch": torch.__version__, "m": args.m, "iters": args.iters,
           "reps": args.reps, "problems": []}
    fam = cl.CublasLtFamily()
    out["available"] = fam.available("cuda")
    from autotune.core.arch import detect
    arch = detect()
    for key in PROBLEMS:
        p = Problem.from_key(key)
        t0 = time.perf_counter()
        tactics = fam.enumerate(p, arch)
        enum_s = time.perf_counter() - t0
        verdicts = {fam.verdict(p, t, arch).ok for t in tactics}
        x, w = cl.operands(p, args.m, "cuda", seed=1)
        rows = []
        from nvmath.linalg.advanced import MatmulPlanPreferences
        with cl.make_matmul(p, x, w) as mm:   # the algorithm objects cuBLASLt hands out at this M
            planned = mm.plan(preferences=MatmulPlanPreferences(limit=args.max_tactics))
            for alg in planned:
                t = cl.tactic_from_algorithm(alg, out["cublas"])
                med, iqr = time_mm(mm, alg, args.iters, args.reps)
                rows.append({"tactic": t.to_json(), "id": t.id, "first_us": med, "first_iqr_us": iqr,
                             "in_enumeration": any(all(t[c] == e[c] for c in cl.CONFIG) for e in tactics)})
        out["problems"].append({"problem": key, "enumerated": len(tactics), "enum_s": enum_s,
                                "verdicts": sorted(map(str, verdicts)), "planned": len(planned), "rows": rows})
        print(f"{key}: {len(tactics)} tactics in {enum_s:.2f} s, {len(planned)} accepted at M={args.m}", flush=True)
    return out


def paired(mms, algs, iters: int, reps: int) -> list[tuple[float, float]]:
    """Interleaved timing (A B A B ...) of several (Matmul, Algorithm): drift hits all alike."""
    import torch
    for mm, alg in zip(mms, algs):
        for _ in range(3):
            mm.execute(algorithm=alg)
    torch.cuda.synchronize()
    samples: list[list[float]] = [[] for _ in mms]
    for _ in range(reps):
        for i, (mm, alg) in enumerate(zip(mms, algs)):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                mm.execute(algorithm=alg)
            e.record()
            e.synchronize()
            samples[i].append(s.elapsed_time(e) * 1e3 / iters)
    out = []
    for smp in samples:
        q = statistics.quantiles(smp, n=4)
        out.append((statistics.median(smp), q[2] - q[0]))
    return out


def phase2(args) -> None:
    """Fresh process: rebuild each stored tactic from JSON; time it interleaved with the algorithm
    a fresh heuristic plan returns with the same 64 algorithm bytes; check numerics."""
    import torch
    from nvmath.linalg.advanced import MatmulPlanPreferences
    from autotune.core.problem import Problem
    from autotune.tactics import cublaslt as cl
    from autotune.core.tactic import Tactic
    data = json.loads(Path(args.replay).read_text())
    fam = cl.CublasLtFamily()
    for prob in data["problems"]:
        p = Problem.from_key(prob["problem"])
        x, w = cl.operands(p, args.m, "cuda", seed=1)
        fresh_mm = cl.make_matmul(p, x, w)
        fresh = fresh_mm.plan(preferences=MatmulPlanPreferences(limit=64))
        by_bytes = {a.as_numpy().tobytes()[: cl.ALGO_BYTES]: a for a in fresh}
        for r in prob["rows"]:
            t = Tactic.from_json(r["tactic"])
            assert t.id == r["id"], "tactic id changed across processes"
            raw = cl.decode(t["algo"])[: cl.ALGO_BYTES]
            r["same_bytes_in_fresh_plan"] = raw in by_bytes
            with cl.make_matmul(p, x, w) as mm:   # a fresh Matmul per tactic: nothing carried over
                algs = mm.plan(algorithms=[cl.algorithm_from_tactic(t)])
                r["replay_accepted"] = len(algs)
                if raw in by_bytes:
                    (r["fresh_us"], r["fresh_iqr_us"]), (r["replay_us"], r["replay_iqr_us"]) = paired(
                        [fresh_mm, mm], [by_bytes[raw], algs[0]], args.iters, args.reps)
                else:
                    ((r["replay_us"], r["replay_iqr_us"]),) = paired([mm], [algs[0]], args.iters, args.reps)
        fresh_mm.free()
        # numerics of the family's launcher (the path the search uses), at M and at M/16
        errs = []
        for m in (args.m, args.m // 16):
            xx, ww = cl.operands(p, m, "cuda", seed=2)
            wf = ww.float() if isinstance(ww, torch.Tensor) else ww[0].float() * ww[1]
            ref = xx.float() @ wf.T
            for r in prob["rows"][:3]:
                try:
                    y = fam.build(p, Tactic.from_json(r["tactic"]), "cuda")(xx, ww).float()
                    errs.append(float((y - ref).norm() / ref.norm()))
                except RuntimeError as e:
                    prob.setdefault("launcher_failures", []).append(f"M={m}: {e}"[:300])
        prob["rel_err_max"] = max(errs) if errs else None
    Path(args.replay).write_text(json.dumps(data, indent=1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--max-tactics", type=int, default=8)
    ap.add_argument("--replay", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.replay:
        phase2(args)
        return 0
    data = phase1(args)
    args.out.write_text(json.dumps(data, indent=1))
    cmd = [sys.executable, __file__, "--out", str(args.out), "--replay", str(args.out), "--m", str(args.m),
           "--iters", str(args.iters), "--reps", str(args.reps)]
    subprocess.run(cmd, check=True)
    data = json.loads(args.out.read_text())
    print(f"{data['device']} cc {data['cc']} cuBLASLt {data['cublas']} torch {data['torch']}; M={args.m}, "
          f"{args.iters} calls x {args.reps} reps, median µs/call (IQR)")
    for prob in data["problems"]:
        print(f"\n{prob['problem']}: {prob['enumerated']} tactics enumerated in {prob['enum_s']:.2f} s; "
              f"verdicts {prob['verdicts']}; launcher rel. err. vs fp32 torch (max) {prob['rel_err_max']}; "
              f"launcher failures {prob.get('launcher_failures', [])}")
        print("  algo tile        stages         cluster    enum same64B  phase1 µs (IQR) | new process: "
              "fresh plan µs (IQR)  replayed µs (IQR)  replay/fresh")
        for r in prob["rows"]:
            t = json.loads(r["tactic"])["params"]
            fr, rp = r.get("fresh_us"), r.get("replay_us")
            ratio = f"{rp / fr:.3f}" if fr and rp else "-"
            print(f"  {t['algo_id']:>4} {str(t['tile']):<11} {str(t['stages']):<14} {str(t['cluster_shape']):<10} "
                  f"{str(r['in_enumeration'])[0]:>4} {str(r['same_bytes_in_fresh_plan'])[0]:>7}  "
                  f"{r['first_us']:7.1f} ({r['first_iqr_us']:4.1f}) | {(fr or float('nan')):7.1f} "
                  f"({r.get('fresh_iqr_us', float('nan')):4.1f})      {rp:7.1f} ({r['replay_iqr_us']:4.1f})     {ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
