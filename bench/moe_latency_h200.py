"""Where a cuda grouped-MoE decode kernel's time goes at M = 1 (issue #26: the stage targets' "why").

    python3 bench/moe_latency_h200.py --out DIR [--budget-s 200] [--baseline SRC]   # probes + sweep (GPU)
    python3 bench/moe_latency_h200.py --ncu-launch                  # one launch per kernel between
                                                                    # cudaProfilerStart/Stop: run it under
                                                                    # ncu (bench/h200_moe_latency.sh)
    python3 bench/moe_latency_h200.py --plan [--compile]            # the probe texts and the sweep (CPU)

GLM-5 TP8's routed problems as FP4MoE serves them (E = 256, top-8, uniform routing, NVFP4):
w13:swiglu (N = 512, K = 6144) and w2:reduce (N = 6144, K = 256, routing weights, one x row per pair).

1. **Probes** (the served M = 1 winner config of each): the kernel's text cut short at one stage —
   `launch` (returns right after its PDL wait), `id` (after reading its own expert id), `route`
   (after the rank scan and the gather), `loop` (the main loop done, no epilogue: split-K partials,
   SwiGLU, the top_k reduce and the stores left out), `full` — each compiled by NVRTC and timed as
   CUDA-graph replays over a cold-L2 rotation; differences place the time. Beside them: a
   graph-replayed device copy moving the same bytes as the kernel's weights (read + written), the
   smallest time a kernel touching those bytes can take here.
2. **Sweep**: every moe_mma config the verdicts keep (m_tiles 1) at M = 1 and 4 for both problems, and
   w2:reduce's every kept moe_tok config (the token-major kernel) beside them, w2:reduce also at M = 16,
   timed the same way (cubins compiled first by a process pool); with `--baseline SRC` each config
   is also timed compiled from SRC's text (another revision) and with -DXPRE=0 (this text without
   its x prefetch): an A/B/C from one run; with `--store DB` its timings are written as trials (a
   rank-model source, tools/fit_rank_models.py). The sweep checks nothing against
   float64: the family's GPU tests do (bench/h200_moe_latency.sh runs them first).
3. `--ncu-launch`: the served M = 1 kernels (both routed ones, the shared expert's gate_up:swiglu and
   down), w13:swiglu at M = 16 and w2:reduce at M = 16 and 64, one launch each inside cudaProfilerStart/Stop, so
   `ncu --profile-from-start off` profiles exactly those.
The search's trials time with PDL off; so do these (AUTOTUNE_PDL=0 unless set).
Writes DIR/moe_latency.json after every phase.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AUTOTUNE_PDL", "0")

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402

E, TOP_K, H, I = 256, 8, 6144, 256
W13 = Problem.moe(2 * I, H, E, TOP_K, epilogue="swiglu")
W2 = Problem.moe(H, I, E, TOP_K, epilogue="reduce")
GATE_UP = Problem.dense(2 * I, H, epilogue="swiglu")
DOWN = Problem.dense(H, I)


def moe_t(wk, sk, tn, st, mt=1) -> Tactic:
    return Tactic("cuda", kernel="moe_mma", warps_k=wk, stages=st, tiles_n=tn, m_tiles=mt, split_k=sk)


#: the main job's M = 1 winners (docs/data/main-job-h200.db.xz, run 10) and w13:swiglu's at M = 16
SERVED = {"w13_swiglu": (W13, moe_t(8, 2, 2, 2)), "w2_reduce": (W2, moe_t(2, 1, 4, 2))}
NCU = [("w13_swiglu_m1", W13, moe_t(8, 2, 2, 2), 1), ("w2_reduce_m1", W2, moe_t(2, 1, 4, 2), 1),
       ("gate_up_swiglu_m1", GATE_UP, Tactic("cuda", warps_k=2, stages=2, tiles_n=2, split_k=8), 1),
       ("down_m1", DOWN, Tactic("cuda", warps_k=2, stages=6, tiles_n=1), 1),
       ("w13_swiglu_m16", W13, moe_t(8, 1, 2, 2), 16),
       # w2:reduce sits at 2.3-2.4x its bytes at M = 16 and 64 where w13 is at 1.04-1.08x (docs/moe-decode.md
       # part 11): the folded step's served config there (docs/data/mlp-step-h200/winners-fold-c5148b3.json)
       ("w2_reduce_m16", W2, moe_t(1, 1, 4, 2), 16), ("w2_reduce_m64", W2, moe_t(1, 1, 4, 2), 64)]

# ---- probes: (stage, the line the cut follows, the code inserted after it) -------------------------
# each cut keeps what came before it live (a branch on the value read) and returns; `P >= 0` is
# always true but unknown to the compiler, so nothing after the cut is removed as dead
_ACC_SINK = ("{ float s_ = 0.f; for (int u_ = 0; u_ < TN; ++u_) for (int j_ = 0; j_ < MT; ++j_) "
             "for (int c_ = 0; c_ < 4; ++c_) s_ += acc[u_][j_][c_]; "
             "if (__float_as_uint(s_) == 0x7f80deadu) y[0] = 0; if (P >= 0) return; }")
PROBES = [
    ("launch", "  pdl_release();\n  const int groups", "if (P >= 0) return;"),
    ("id", "  const long long eid = pair_id(ids, ids64, q, top_k, ids_cols, shared_e);\n", "  if (P >= 0 && eid != -7) return;\n"),
    ("route", "  __syncthreads();\n  const int r0 = rows_s[0];", "\n  if (P >= 0 && r0 != -7) return;"),
    ("loop", "    wait_pending<0>();\n    __syncthreads();\n", "    " + _ACC_SINK + "\n"),
]
STAGES = [p[0] for p in PROBES] + ["full"]


def probe_text(text: str, stage: str) -> str:
    """The kernel text cut after `stage` (the text itself for "full"); a marker not found exactly
    once is an error, so a kernel edit cannot make a probe silently measure something else."""
    if stage == "full":
        return text
    marker, code = next((m, c) for s, m, c in PROBES if s == stage)
    n = text.count(marker)
    if n != 1:
        raise ValueError(f"probe {stage}: its marker occurs {n} times in moe_mma's text (want 1)")
    if stage == "launch":      # insert between the release and the id read
        head, tail = text.split(marker)
        return head + "  pdl_release();\n  " + code + "\n  const int groups" + tail
    i = text.index(marker) + len(marker)
    return text[:i] + code + text[i:]


def sweep_tactics(prob: Problem, arch) -> list[Tactic]:
    from autotune.tactics.cuda import moe as MOE
    from autotune.tactics.cuda import moe_search as MOE_SEARCH
    return [t for t in MOE_SEARCH.enumerate_space(prob) if t.params.get("m_tiles", 1) == 1 and MOE.verdict(prob, t, arch).ok]


def plan(compile_: bool) -> int:
    from autotune.core.arch import get_arch
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import moe as MOE
    arch, bad = get_arch("sm90"), 0
    for name, (prob, t) in SERVED.items():
        cfg = MOE.config(prob, t)
        for st in STAGES:
            try:
                txt = probe_text(B.text(cfg), st)
                msg = "ok"
                if compile_ and B.nvcc():
                    import tempfile
                    with tempfile.TemporaryDirectory() as d:
                        src = Path(d) / "p.cu"
                        src.write_text(txt)
                        import subprocess
                        r = subprocess.run([B.nvcc(), "-cubin", "-arch=sm_90", "-O3", *B.options(cfg), "-o",
                                            str(Path(d) / "p.cubin"), str(src)], capture_output=True, text=True)
                        msg = "compiled" if r.returncode == 0 else "NVCC FAILED " + r.stderr[-300:]
                        bad += r.returncode != 0
            except ValueError as exc:
                msg, bad = f"FAILED {exc}", bad + 1
            print(f"probe {name:11s} {st:7s} {msg}")
    for prob in (W13, W2):
        print(f"sweep {prob.key}: {len(sweep_tactics(prob, arch))} configs kept on sm90")
    for label, prob, t, m in NCU:
        print(f"ncu {label}: {prob.key} {t.params} M={m}")
    return 1 if bad else 0


# ---- GPU --------------------------------------------------------------------------------------------
def _precompile(args) -> str:
    cfg, arch = args
    from autotune.tactics.cuda import build as B
    try:
        B.nvrtc_cubin(cfg, arch)
        return ""
    except Exception as exc:             # reported by the build that follows
        return str(exc)[:200]


class Bench:
    def __init__(self):
        import torch
        from autotune.core import inputs
        from autotune.core.arch import detect
        from autotune.tactics import registry
        self.torch, self.inputs = torch, inputs
        self.fam, self.arch = registry.get("cuda"), detect()
        self.sm = "sm_%d%d" % torch.cuda.get_device_capability()
        self.l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.w = {p: [self.fam.pack("cuda-mma-a-frag-v1", inputs.seeded_weight(p, "cuda", 10 + i)) for i in range(2)]
                  for p in (W13, W2)}
        self.gen = torch.Generator().manual_seed(0)

    def sets(self, prob: Problem, m: int, n: int) -> list:
        torch = self.torch
        out = []
        for i in range(n):
            ids, tw = self.inputs.routing(m, E, TOP_K, self.gen, skew=0.0)
            lead = (m, TOP_K) if prob.epilogue == "reduce" else (m,)
            x = (torch.randn(*lead, prob.k, device="cuda") * 0.5).to(torch.bfloat16)
            tw = tw.cuda() if prob.epilogue == "reduce" else None
            out.append((x, ids.cuda(), tw, self.w[prob][i % 2]))
        return out

    def touched_bytes(self, prob: Problem, m: int) -> float:
        per = prob.n * (prob.k // 2 + prob.k // prob.block)
        return per * min(E, m * TOP_K) if m == 1 else per * m * TOP_K * 0.9

    def time_kernel(self, k, prob: Problem, m: int) -> float:
        from autotune.engine import timing
        n = timing.sets_for_cold_l2(int(self.touched_bytes(prob, m)), "cuda", cap=24)
        sets = self.sets(prob, m, n)
        cfg = timing.TimerConfig(min_reps=5, max_reps=20, budget_s=0.05)
        return timing.time_calls(lambda i: k(sets[i][0], sets[i][3], sets[i][1], sets[i][2]), n, "cuda", cfg).median_us

    def copy_us(self, nbytes: int) -> float:
        """A graph-replayed device copy moving nbytes (half read, half written), cold L2."""
        from autotune.engine import timing
        torch = self.torch
        half = max(16, nbytes // 2)
        n = timing.sets_for_cold_l2(nbytes, "cuda", cap=24)
        src = [torch.empty(half, dtype=torch.uint8, device="cuda") for _ in range(n)]
        dst = [torch.empty_like(s) for s in src]
        cfg = timing.TimerConfig(min_reps=5, max_reps=20, budget_s=0.05)
        return timing.time_calls(lambda i: dst[i].copy_(src[i]), n, "cuda", cfg).median_us

    def probe_kernel(self, prob: Problem, t: Tactic, stage: str):
        """The family's kernel for (prob, t) with its launcher's function replaced by the probe's."""
        from autotune.tactics.cuda import build as B
        from autotune.tactics.cuda import moe as MOE
        return self.text_kernel(prob, t, probe_text(B.text(MOE.config(prob, t)), stage))

    def text_kernel(self, prob: Problem, t: Tactic, txt: str, extra: tuple = ()):
        """The family's kernel for (prob, t) with its launcher's function compiled from `txt` (with
        `extra` NVRTC options)."""
        import cupy
        from autotune.tactics.cuda import build as B
        from autotune.tactics.cuda import pdl as P
        k = self.fam.build(prob, t, "cuda")
        run = k.launcher
        cfg = run.cfg
        mod = cupy.RawModule(code=txt, options=("-default-device", *B.options(cfg), *extra), name_expressions=None)
        fn = mod.get_function(B.kernel_name(cfg))
        run._fns[0] = fn
        run._runs[0] = P.runner(fn, txt, B.kernel_name(cfg), 0)
        return k


def baseline_text(d: Path | None) -> str | None:
    """Another revision's moe_mma text (DIR/mma_common.cuh [+ DIR/moe_common.cuh where that revision
    has one] + DIR/moe_mma.cu, as build.text joins them), timed beside this one's config by config:
    an A/B from one run (moe_mma configs only)."""
    if d is None:
        return None
    names = ["mma_common.cuh"] + (["moe_common.cuh"] if (d / "moe_common.cuh").exists() else []) + ["moe_mma.cu"]
    return "\n".join((d / n).read_text() for n in names)


def store_sweep(path: Path, rows: list, fam, arch, env=None, code_root: Path | None = None, code=None) -> int:
    """The sweep's timings of this revision's code as trials of a cache at `path` (status ok, keyed
    by device, libraries and code like the engine's): a source the rank model can be fitted on
    (tools/fit_rank_models.py), the one complete measurement of moe_mma's space at M = 1 and 4.
    env: the environment measured (None: GPU 0's, live); code_root: a checkout of the revision that
    measured (None: the code installed here), its code keys taken from there, with `code` (that
    revision's own declaration of moe_mma's sources; None: this install's). For rebuilding the cache
    from a committed JSON without a GPU (tools/sweep_db_from_json.py)."""
    from autotune.cache.store import Store
    from autotune.core import env as ENV
    from autotune.core.codekey import code_key_at
    from autotune.core.records import Trial
    from autotune.tactics import registry
    from autotune.tactics.cuda import moe as MOE
    env = ENV.current(0) if env is None else env
    lib = env.lib_key(fam.depends_on)
    probs = {p.key: p for p in (W13, W2)}
    trials = []
    for r in rows:
        if "us" not in r:
            continue
        prob = probs[r["problem"]]
        t = Tactic("cuda", **({"kernel": "moe_mma"} | r["tactic"]))    # sweeps before moe_tok stored no kernel
        trials.append(Trial(prob.key, r["m"], t.id, "cuda", t.to_json(), env.device_key, lib, "ok",
                            "bench/moe_latency_h200.py sweep", r["us"], None, 0, None,
                            MOE.verdict(prob, t, arch).smem_bytes,
                            code_key=registry.code_key(t, lib) if code_root is None
                            else code_key_at(lib, code or registry.code_of(t), code_root)))
    with Store(str(path)) as st:
        st.put_environment(env, fam.depends_on)
        for prob in probs.values():
            st.put_problem(prob)
        st.put_trials(trials)
    return len(trials)


def run_gpu(out: Path, budget_s: float, baseline: Path | None = None, store: Path | None = None) -> int:
    import torch
    t0 = time.time()
    path = out / "moe_latency.json"
    doc = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "pdl": os.environ.get("AUTOTUNE_PDL"), "probes": [], "sweep": [],
           "command": "python3 bench/moe_latency_h200.py --out $OUT"}
    b = Bench()
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import moe as MOE
    fails = 0

    def save():
        doc["elapsed_s"] = round(time.time() - t0, 1)
        path.write_text(json.dumps(doc, indent=1, default=str))

    for name, (prob, t) in SERVED.items():
        row = {"variant": name, "tactic": t.params, "m": 1, "bytes": b.touched_bytes(prob, 1),
               "copy_same_bytes_us": b.copy_us(int(b.touched_bytes(prob, 1)))}
        for st in STAGES:
            try:
                row[st] = b.time_kernel(b.probe_kernel(prob, t, st), prob, 1)
            except Exception as exc:
                fails += 1
                row[st] = f"{type(exc).__name__}: {str(exc)[:200]}"
        doc["probes"].append(row)
        print(name, {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items() if k != "tactic"}, flush=True)
        save()

    jobs = [(prob, t) for prob in (W13, W2) for t in sweep_tactics(prob, b.arch)]
    import multiprocessing as mp
    with mp.get_context("spawn").Pool(min(14, os.cpu_count() or 2)) as pool:
        errs = [e for e in pool.map(_precompile, [(MOE.config(p, t), b.sm) for p, t in jobs]) if e]
    doc["compile_errors"] = errs[:5]
    doc["compile_s"] = round(time.time() - t0, 1)
    print(f"{len(jobs)} sweep configs compiled ({len(errs)} failed) at {doc['compile_s']} s", flush=True)
    base_txt, base_k = baseline_text(baseline), {}
    doc["baseline"] = str(baseline) if baseline else None
    for m in (1, 4, 16):
        for prob, t in jobs:
            if m == 16 and prob is not W2:                  # w2:reduce at M = 16: where moe_tok stops paying
                continue
            if time.time() - t0 > budget_s:
                doc["sweep_cut"] = f"budget {budget_s} s reached"
                break
            r = {"problem": prob.key, "m": m, "tactic": t.params}
            try:
                r["us"] = b.time_kernel(b.fam.build(prob, t, "cuda"), prob, m)
                if base_txt is not None and not MOE.is_tok(t):
                    key = (prob.key, t.id)
                    if key not in base_k:
                        base_k[key] = b.text_kernel(prob, t, base_txt)
                        base_k[key + ("x0",)] = b.text_kernel(prob, t, B.text(MOE.config(prob, t)), ("-DXPRE=0",))
                    r["baseline_us"] = b.time_kernel(base_k[key], prob, m)
                    r["no_xpre_us"] = b.time_kernel(base_k[key + ("x0",)], prob, m)
            except Exception as exc:
                fails += 1
                r["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            doc["sweep"].append(r)
        save()
        for prob in ((W13, W2) if m < 16 else (W2,)):
            rows = sorted((r for r in doc["sweep"] if r["m"] == m and r["problem"] == prob.key and "us" in r),
                          key=lambda r: r["us"])
            for r in rows[:6]:
                ab = f" (baseline {r['baseline_us']:.2f}, no x prefetch {r['no_xpre_us']:.2f})" if "baseline_us" in r else ""
                print(f"M={m} {prob.key} {r['us']:.2f} us{ab} {r['tactic']}", flush=True)
            if rows:
                print(f"M={m} {prob.key}: {len(rows)} timed, median {statistics.median(r['us'] for r in rows):.2f} us", flush=True)
    if store is not None:
        doc["stored_trials"] = store_sweep(store, doc["sweep"], b.fam, b.arch)
    save()
    return 1 if fails else 0


def ncu_launch() -> int:
    """One launch of each NCU kernel between cudaProfilerStart/Stop (compiled and warmed first)."""
    import torch
    from autotune.core import inputs
    from autotune.tactics import registry
    fam = registry.get("cuda")
    calls = []
    for label, prob, t, m in NCU:
        w = fam.pack("cuda-mma-a-frag-v1", inputs.seeded_weight(prob, "cuda", 5))
        k = fam.build(prob, t, "cuda")
        x = (torch.randn(m, TOP_K, prob.k, device="cuda") if prob.epilogue == "reduce"
             else torch.randn(m, prob.k, device="cuda")).mul(0.5).to(torch.bfloat16)
        if prob.kind == "grouped_moe":
            ids, tw = inputs.routing(m, E, TOP_K, torch.Generator().manual_seed(m), skew=0.0)
            ids, tw = ids.cuda(), tw.cuda()
            call = (lambda k=k, x=x, w=w, ids=ids, tw=tw, r=prob.epilogue == "reduce": k(x, w, ids, tw if r else None))
        else:
            call = (lambda k=k, x=x, w=w: k(x, w))
        for _ in range(3):
            call()
        calls.append((label, call))
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for label, call in calls:
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled, in order:", ", ".join(lbl for lbl, _ in calls))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=200.0, help="the sweep stops being started past this")
    ap.add_argument("--ncu-launch", action="store_true")
    ap.add_argument("--store", type=Path, help="write the sweep's timings as trials of this cache (SQLite)")
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--baseline", type=Path, help="a folder holding another revision's mma_common.cuh and "
                    "moe_mma.cu: the sweep times each config with that text too")
    ap.add_argument("--compile", action="store_true", help="with --plan: compile each probe with nvcc for sm_90")
    a = ap.parse_args()
    if a.plan:
        return plan(a.compile)
    if a.ncu_launch:
        return ncu_launch()
    if a.out is None:
        ap.error("--out DIR (or --plan, --ncu-launch) is required")
    a.out.mkdir(parents=True, exist_ok=True)
    return run_gpu(a.out, a.budget_s, a.baseline, a.store)


if __name__ == "__main__":
    raise SystemExit(main())
