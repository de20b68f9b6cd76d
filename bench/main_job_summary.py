"""One summary of the README's main job (`autotune search --model glm5 --tp 8` on a fresh cache):
wall time, time per stage (compile: waited on / overlapped), trials measured and failed by cause, jobs not measured, winners per
(problem, bucket), the defaults among the layers the runtime builds for the model, the workers'
peak device memory, with date, commit and versions.

    python3 bench/main_job_summary.py CACHE.db --search-json search.json --wall-s 312 -o summary.json

"Defaults among the served layers" builds what an engine builds for the model with the runtime's
defaults — FP4MLP for every SwiGLU MLP (the dense layers' gate_up with the SwiGLU epilogue, then
down), FP4Linear for any other dense GEMM, FP4MoE (fused) for the routed experts with the shared
expert given as `shared=` (folded in by default where it fits, else its own FP4MLP) — on random weights, over a Dispatcher reading the cache, and asks each bound table which
rung answers every tuned M: a problem the runtime serves that the search did not tune shows up here
as defaults, whatever the search's own problem list says. bench/device_run.sh runs it on the
GPU; tests/test_main_job.py runs it on the CPU main job in CI.
"""
from __future__ import annotations

import json
import platform
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import harness  # noqa: E402

#: reasons of trials the framework caused (inputs, memory it held), never a tactic's own failure
FRAMEWORK = ("input setup failed", "Ray task failed")


def cause(reason: str) -> str:
    """A failure reason's class: the framework's, a timeout, a lost worker (signal), a wrong
    result, a compile failure, else the exception type the tactic raised."""
    r = reason or ""
    if r.startswith(FRAMEWORK):
        return "framework: " + r.split(":")[0]
    if "timed out" in r:
        return "tactic: timed out"
    if "worker died" in r or "worker exited" in r:
        return "tactic: lost its worker"
    if r.startswith("compile failed"):
        return "tactic: compile failed"
    if "relative error" in r or "outputs not written" in r:
        return "tactic: wrong result"
    m = re.search(r"(\w+(?:Error|Exception|Failed))\b", r)
    return "tactic: " + (m.group(1) if m else "other")


def kernel_seconds(con: sqlite3.Connection) -> dict[str, dict]:
    """Per family and problem kind ("torch grouped_moe"): trials timed and the GPU seconds their calls
    took at least — median × (reps + 3): the timed repetitions, the check, the warm-up and the
    estimate call (a capture's calls and host time come on top)."""
    rows = con.execute("select family, substr(problem_key, 1, instr(problem_key, ':') - 1), count(*), "
                       "sum(median_us * (reps + 3)) from trials where median_us is not null group by 1, 2 order by 4 desc")
    return {f"{fam} {kind}": {"trials": n, "seconds": round(us / 1e6, 1)} for fam, kind, n, us in rows}


def trial_counts(cache: str) -> dict:
    con = sqlite3.connect(f"file:{cache}?mode=ro", uri=True)
    status = Counter(dict(con.execute("select status, count(*) from trials group by status")))
    failed = Counter(cause(r) for (r,) in con.execute("select reason from trials where status = 'failed'"))
    winners = con.execute("select count(*) from winners").fetchone()[0]
    spent = kernel_seconds(con)
    con.close()
    return {"ok": status.get("ok", 0), "dropped": status.get("dropped", 0), "rejected": status.get("rejected", 0),
            "failed": status.get("failed", 0), "failed_by_cause": dict(failed.most_common()),
            "framework_failures": sum(n for c, n in failed.items() if c.startswith("framework")),
            "winners": winners, "kernel_seconds": spent}


def served_layers(cache: str, model: str, tp: int, ep: int, buckets, device: str) -> dict:
    """Build one runtime module per distinct layer kind of the model with the runtime's defaults
    and count, per module problem and tuned M, the rung that answers (exact / nearest / pinned / default)."""
    import torch

    from autotune.core import inputs
    from autotune.models import problems_for
    from autotune.runtime.dispatch import Dispatcher
    from autotune.runtime.moe import FP4MoE
    from autotune.runtime.nn import FP4Linear, FP4MLP
    from autotune.cache import Store

    d = Dispatcher(Store(cache, readonly=True), record_misses=False)
    uses = problems_for(model, tp=tp, ep=ep, fused_moe=False)
    gen = torch.Generator(device=device).manual_seed(0)
    modules: list[tuple[str, list]] = []
    dense = [u for u in uses if u.problem.kind == "dense"]
    down = {layer.split(".down_proj[")[0]: u for u in dense for layer in u.layers if ".down_proj[" in layer}
    paired: set[int] = set()
    shared = None                         # the shared expert's (gate_up, down) uses: FP4MoE(shared=...) takes them
    for u in dense:                       # a SwiGLU MLP: gate_up + the down of the same module
        mod = next((layer.split(".gate_up_proj[")[0] for layer in u.layers if ".gate_up_proj[" in layer), None)
        if mod is None or mod not in down:
            continue
        if mod.endswith("shared_experts"):
            shared = (u, down[mod])
            paired.update((id(u), id(down[mod])))
            continue
        dn = down[mod]
        mlp = FP4MLP(inputs.random_weight(u.problem, device, gen), inputs.random_weight(dn.problem, device, gen),
                     dispatcher=d)
        modules.append((", ".join(u.layers + dn.layers) + " (FP4MLP)", list(mlp.problems)))
        paired.update((id(u), id(dn)))
    for u in dense:
        if id(u) not in paired:
            lin = FP4Linear(inputs.random_weight(u.problem, device, gen), dispatcher=d)
            modules.append((", ".join(u.layers), [lin.problem]))
    moe = [u for u in uses if u.problem.kind == "grouped_moe"]
    w13 = next((u for u in moe if any(".w13" in layer for layer in u.layers)), None)
    w2 = next((u for u in moe if any(".w2" in layer for layer in u.layers)), None)
    if w13 is not None and w2 is not None:
        sh = None if shared is None else tuple(inputs.random_weight(u.problem, device, gen) for u in shared)
        block = FP4MoE(inputs.random_weight(w13.problem, device, gen), inputs.random_weight(w2.problem, device, gen),
                       w13.problem.top_k, dispatcher=d, shared=sh)
        names = w13.layers + w2.layers + ([] if shared is None else shared[0].layers + shared[1].layers)
        form = "" if shared is None else (", shared folded in" if block.shared_folded else ", shared apart")
        probs = [block.problem13, block.problem2] + ([] if block.shared_mlp is None else list(block.shared_mlp.problems))
        modules.append((", ".join(names) + f" (FP4MoE{form})", probs))
    rows, rungs = [], Counter()
    for name, problems in modules:
        for p in problems:       # exact: this M's own winner; nearest: a neighbouring bucket's; default
            per = Counter(d.rung_for(p, m)[0] for m in buckets)
            rungs.update(per)
            rows.append({"layers": name, "problem": p.key, **dict(per)})
    return {"modules": rows, "by_rung": dict(rungs), "defaults": rungs.get("default", 0),
            "not_exact": sum(n for r, n in rungs.items() if r != "exact")}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "triton", "cupy", "sqlalchemy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    try:
        import torch
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name(0)
    except Exception:
        pass
    return out


def commit() -> str | None:
    """HEAD's short hash, plus "+N changed" when the tree differs from it: the device machine runs a
    copy of the working tree whose git metadata may lag it (a run of 978e542's tree once said
    7269537), so a bare hash could name code that did not run."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=root, timeout=10).stdout.strip() or None
        changed = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=root,
                                 timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+{len(changed)} changed" if head and changed else head


def compile_figures(stages: dict) -> dict:
    """The compile stage in two figures (autotune/engine/pipeline.py): `waited`, seconds the jobs
    waited on compilation (the critical path; with the barrier, all of it), `overlapped`, seconds
    the compile pool worked while no job waited (off the critical path; 0 with the barrier)."""
    def sec(name: str) -> float:
        return round(float((stages.get(name) or {}).get("seconds", 0.0)), 1)
    return {"waited": sec("compile"), "overlapped": sec("compile overlapped")}


def summarize(cache: str, *, search: dict | None = None, wall_s: float | None = None, model: str = "glm5",
              tp: int = 8, ep: int = 1, max_tokens: int = 8192, device: str = "cpu", command: str = "") -> dict:
    from autotune.core.buckets import hybrid
    buckets = hybrid(max_tokens)
    search = search or {}
    trials = trial_counts(cache)
    problems = [p["key"] for p in search.get("problems", [])]
    jobs = len(problems) * len(buckets) if problems else None
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(), "versions": versions(),
        "command": command, "wall_s": wall_s,
        "stages": search.get("stages", {}), "compile_s": compile_figures(search.get("stages", {})),
        "notes": search.get("notes", []),
        "trials": trials, "jobs": jobs, "winners": trials["winners"],
        "jobs_not_measured": search.get("job_failures", []),
        "served": served_layers(cache, model, tp, ep, buckets, device),
        "worker_memory_bytes": search.get("worker_memory", {}),
    }


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("cache", help="the main job's cache (SQLite file), opened read-only")
    ap.add_argument("--search-json", help="`autotune search --json` output of the run")
    ap.add_argument("--wall-s", type=float, help="the search's wall time")
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--ep", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--device", default=None, help="where the served modules are built [default: cuda if present]")
    ap.add_argument("--command", default="", help="the command the summary is of (recorded)")
    ap.add_argument("-o", "--output", help="write the JSON here (default: stdout)")
    ap.add_argument("--kernel-time", action="store_true", help="print only the GPU seconds per family and problem "
                    "kind (kernel_seconds) of CACHE (.db or .db.xz) and exit")
    a = ap.parse_args(argv)
    if not Path(a.cache).is_file():
        print(f"main_job_summary: no cache file {a.cache}", file=sys.stderr)
        return 2
    if a.kernel_time:
        import lzma
        import tempfile
        with tempfile.TemporaryDirectory() as t:
            db = a.cache
            if db.endswith(".xz"):
                db = str(Path(t) / "cache.db")
                Path(db).write_bytes(lzma.decompress(Path(a.cache).read_bytes()))
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            print("| family, problem kind | trials timed | GPU s (median × (reps + 3)) |\n|---|---:|---:|")
            for k, v in kernel_seconds(con).items():
                print(f"| {k} | {v['trials']} | {v['seconds']} |")
            con.close()
        return 0
    search = json.loads(Path(a.search_json).read_text()) if a.search_json else None
    import torch
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    s = summarize(a.cache, search=search, wall_s=a.wall_s, model=a.model, tp=a.tp, ep=a.ep,
                  max_tokens=a.max_tokens, device=device, command=a.command)
    text = json.dumps(s, indent=2)
    if a.output:
        Path(a.output).write_text(text + "\n")
    else:
        print(text)
    t = s["trials"]
    print(f"wall {s['wall_s']} s; compile waited {s['compile_s']['waited']} s, overlapped "
          f"{s['compile_s']['overlapped']} s; trials ok {t['ok']} dropped {t['dropped']} failed {t['failed']} "
          f"(framework {t['framework_failures']}); jobs not measured {len(s['jobs_not_measured'])}; "
          f"winners {s['winners']}/{s['jobs']}; served-layer defaults {s['served']['defaults']} "
          f"(not from their own bucket's winner: {s['served']['not_exact']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
