"""Two ranked searches on the H200 compared, and a triton.autotune sample (issue #18).

    python3 bench/rank_h200.py compare A.db B.db --json out.json    # winners that differ, re-timed interleaved
    python3 bench/rank_h200.py autotune --json out.json              # triton.autotune sample, extrapolated

compare: per (problem, bucket) whether the two caches' winners are the same tactic; where they
differ, both winners are re-timed together in one process, interleaved (A B A B ..., 7 cycles,
the search's graph timer), and the gap between their medians is reported.

autotune: triton.autotune (its defaults: do_bench, key M, N, K) over `SAMPLE` configs of the
fused dense member's kept space for one GLM-5 TP8 problem at two buckets (the first pays the
compiles, the second reuses them), timed by wall clock; the per-config costs are then
extrapolated to every kept config of every dense problem at every bucket of the full search —
an extrapolation, not a run (the whole space would take hours of device time).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SAMPLE = 16
PROBLEM = (3072, 6144)
BUCKETS = (16, 256)


def compare(a: str, b: str, cycles: int = 7, device: str = "cuda") -> dict:
    from autotune.core.tactic import Tactic
    from autotune.engine import timing
    from autotune.engine.worker import Bench
    from autotune.cache import Store
    wa = {(w.problem_key, w.bucket): w for w in Store(a, readonly=True).winners()}
    wb = {(w.problem_key, w.bucket): w for w in Store(b, readonly=True).winners()}
    keys = sorted(set(wa) & set(wb))
    diff = [k for k in keys if wa[k].tactic_id != wb[k].tactic_id]
    rows = []
    bench, timer = Bench(device), timing.TimerConfig(budget_s=0.02, min_reps=5, max_reps=200)
    for pk, m in diff:
        ta, tb = Tactic.from_json(wa[(pk, m)].params_json), Tactic.from_json(wb[(pk, m)].params_json)
        bench.setup(pk, m, 0)
        bench.check(ta)
        bench.check(tb)
        sa, sb = [], []
        for _ in range(cycles):
            sa.append(bench.time(ta, timer)["median_us"])
            sb.append(bench.time(tb, timer)["median_us"])
        ma, mb = statistics.median(sa), statistics.median(sb)
        rows.append({"problem": pk, "bucket": m, "a": str(ta), "b": str(tb), "a_us": ma, "b_us": mb,
                     "gap": max(ma, mb) / min(ma, mb) - 1, "stored_a_us": wa[(pk, m)].median_us,
                     "stored_b_us": wb[(pk, m)].median_us})
    within = sum(r["gap"] <= 0.03 for r in rows)
    return {"pairs": len(keys), "differ": len(diff), "differ_within_3pct_retimed": within,
            "agree_share": (len(keys) - len(diff) + within) / max(1, len(keys)), "rows": rows}


def autotune_sample() -> dict:
    import torch
    import triton

    from autotune.core import inputs
    from autotune.core.arch import get_arch
    from autotune.core.problem import Problem
    from autotune.models import problems_for
    from autotune.tactics.triton_fp4.family import TritonFamily
    from autotune.tactics.triton_fp4.kernel import w4a16_dequant_kernel
    fam, arch = TritonFamily(), get_arch("sm90")
    p = Problem.dense(*PROBLEM)
    kept = [t for t in fam.enumerate(p, arch) if t["kernel"] == "w4a16_dequant" and fam.verdict(p, t, arch).ok]
    sample = kept[::max(1, len(kept) // SAMPLE)][:SAMPLE]
    configs = [triton.Config({"BLOCK_M": t["block_m"], "BLOCK_N": t["block_n"], "BLOCK_K": t["block_k"],
                              "GROUP_M": t["group_m"], "SPLIT_K": t["split_k"]},
                             num_warps=t["num_warps"], num_stages=t["num_stages"]) for t in sample]
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(w4a16_dequant_kernel)
    n, k = PROBLEM
    walls = []
    for m in BUCKETS:
        s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
        out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(16 * ((m + 127) // 128 * 128) * (n + 256), dtype=torch.float32, device="cuda")
        locks = torch.zeros((m // 16 + 1) * (n // 32 + 1) + 16, dtype=torch.int32, device="cuda")
        gs = s.w.global_scale.reshape(1).float()

        def grid(meta, m=m):
            return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])
        t0 = time.perf_counter()
        tuned[grid](s.x, s.w.packed, s.w.scales.view(torch.uint8), gs, out, ws, locks, m, n, k,
                    SCALE_GROUP=16, SCALE_E4M3=1, DEQ_ASM=1, DOT_F32=0)
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
    first, later = walls[0] / len(sample), walls[1] / len(sample)     # per config: compile + bench, bench
    dense = [u.problem for u in problems_for("glm5", tp=8) if u.problem.kind == "dense"]
    space = {q.key: sum(1 for t in fam.enumerate(q, arch) if fam.verdict(q, t, arch).ok) for q in dense}
    buckets = 21
    est = sum(c * (first + (buckets - 1) * later) for c in space.values())
    return {"sample": len(sample), "buckets": list(BUCKETS), "wall_s": walls, "per_config_first_s": first,
            "per_config_later_s": later, "kept_per_dense_problem": space, "extrapolated_dense_s": est,
            "note": "extrapolated: sampled configs x kept configs x 21 buckets, dense problems only"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["compare", "autotune"])
    ap.add_argument("dbs", nargs="*")
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", default="cuda", help="compare: where to re-time (cpu for a dry run)")
    a = ap.parse_args(argv)
    res = compare(*a.dbs, device=a.device) if a.what == "compare" else autotune_sample()
    Path(a.json).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
