"""Does a failed CUDA-graph capture keep its memory? (docs/moe-decode.md part 16; one device call)

The main job on an 80 GB H100 (2026-12-05) lost the folded w2's M = 4096 and 8192 jobs and 22 trials
to out-of-memory while its worker held ~73 GiB reserved past 5 GiB allocated. The suspect: the timer
captures every call, the torch family's grouped MoE reads the host (`.tolist()`), its capture fails,
and PyTorch's capture_end raises before it ends the allocator's routing into the graph's pool, so
the pool is never released (timing.abandon). Three measurements:
  A. PyTorch alone: N failed captures of a call with a 1 GiB temporary and a host read; reserved
     memory after empty_cache, before and after;
  B. the same through the timer (timing.time_calls → abandon);
  C. the main job's case: the folded w2 (e257:top9) at M = 4096, then 8192, in one ProcessExecutor
     worker, the torch tactics and a Triton one: each job's figures (reserved after it, failed
     captures, pools released), trials failed.
  OUT=DIR python3 bench/capture_leak_h200.py [--tries 4] [--skip-job]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from autotune.engine import timing

GIB = 1 << 30


def _reserved() -> int:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_reserved()


def _syncing_call(i: int) -> int:
    t = torch.ones(GIB, dtype=torch.uint8, device="cuda")
    return int(t[-1].item())


def raw_pytorch(tries: int) -> dict:
    base = _reserved()
    for _ in range(tries):
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                _syncing_call(0)
        except RuntimeError:
            pass
        del g
    return {"tries": tries, "reserved_before": base, "reserved_after": _reserved()}


def through_timer(tries: int) -> dict:
    base, before = _reserved(), dict(timing.ABANDONED)
    for _ in range(tries):
        timing.time_calls(_syncing_call, 1, "cuda", timing.TimerConfig(budget_s=0.001, min_reps=1, max_reps=2), {})
    return {"tries": tries, "reserved_before": base, "reserved_after": _reserved(),
            "captures_failed": timing.ABANDONED["captures"] - before["captures"],
            "pools_released": timing.ABANDONED["released"] - before["released"],
            "pools_kept": timing.ABANDONED["kept"] - before["kept"]}


def main_job_case() -> list[dict]:
    from autotune.core.arch import detect
    from autotune.core.problem import Problem
    from autotune.engine.halving import Halving
    from autotune.engine.search import Job
    from autotune.engine.sink import Collect
    from autotune.engine.workers import ProcessExecutor, run_job
    from autotune.tactics import registry

    p, arch = Problem.from_key("grouped_moe:bf16*nvfp4->bf16:n6144:k256:e257:top9"), detect()
    tactics = []
    for name, n in (("torch", 99), ("triton", 2)):
        fam = registry.get(name)
        tactics += [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok is True][:n]
    ex, rows = ProcessExecutor("cuda", timeout_s=300), []
    try:
        for m in (4096, 8192):
            got, t0 = Collect(), time.perf_counter()
            why = run_job(ex, Job(p, m, tuple(tactics), tactics[0].id), timing.TimerConfig(budget_s=0.01),
                          Halving(budget_s=0.2), 0, got)
            rows.append({"m": m, "tactics": len(tactics), "job_failure": why, "wall_s": round(time.perf_counter() - t0, 1),
                         "trials": {s: sum(o.status == s for o in got.outcomes) for s in ("ok", "dropped", "failed")},
                         "failed_reasons": sorted({o.reason[:160] for o in got.outcomes if o.status == "failed"}),
                         "memory": got.stages.memory, "counts": got.stages.counts, "restarts": ex.restarts})
            print(json.dumps(rows[-1]), flush=True)
    finally:
        ex.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tries", type=int, default=4)
    ap.add_argument("--skip-job", action="store_true")
    a = ap.parse_args()
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out["timer"] = through_timer(a.tries)          # first: the raw run's leak would stay under it
    print("timer:", json.dumps(out["timer"]), flush=True)
    out["pytorch_alone"] = raw_pytorch(a.tries)
    print("pytorch alone:", json.dumps(out["pytorch_alone"]), flush=True)
    if not a.skip_job:
        out["main_job_case"] = main_job_case()
    path = os.path.join(os.environ.get("OUT", "."), "capture-leak.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
