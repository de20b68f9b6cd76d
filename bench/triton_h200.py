"""Triton FP4 family on a CUDA GPU (issue #4): tuned vs default vs cuBLAS bf16, ceilings, search cost.

    python3 bench/triton_h200.py run --out DIR [--phases table,search]   # on the GPU machine
    python3 bench/triton_h200.py render DIR/triton_h200.json docs/triton-h200.md   # anywhere

`run` (one device command, about 6 minutes on an H200):
  0. precompiles every candidate in 16 processes (TritonFamily.precompile), so timing never waits
     for the compiler;
  1. ceilings: device-to-device copy bandwidth (1 GiB, bytes read + written) and the bf16 GEMM rate
     (8192³ torch.matmul on random data), medians of events;
  2. table: GLM-5 NVFP4 dense problems at TP1 and TP8 (autotune.models.problems_for) × buckets
     1 … 8192: the best of a bucket-specific candidate list ("tuned"), the family default, and
     cuBLAS bf16 (torch.matmul on weights dequantized to bf16 beforehand). Every candidate is checked
     against the float64 reference with a NaN-poisoned output before it is timed. All columns use
     autotune.engine.timing.time_calls: input sets rotated to exceed twice the L2, CUDA-graph replay of 32
     calls when a call is under 200 µs, events otherwise;
  3. search cost vs triton.autotune, each in a fresh process with an empty Triton cache: the same
     kernel and the same configs (a fixed sample of the family's enumeration, over-limit configs
     included) on 2 problems × 5 buckets. Ours: verdicts drop over-limit configs, parallel
     precompile, check + graph-timed median. triton.autotune: its defaults (do_bench, key=M). Then
     every config is re-timed carefully to find the exhaustive best, and both winners are compared.
`render` writes the markdown tables from the JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402
from autotune.tactics.triton_fp4.dequant_cublas import KERNEL as DQ_KERNEL, TILE as DQ_TILE  # noqa: E402
from autotune.tactics.triton_fp4.family import TritonFamily  # noqa: E402

FAM = TritonFamily()
BUCKETS = [1 << i for i in range(14)]          # 1 … 8192
SEARCH_PROBLEMS = [(3072, 6144), (6144, 1536)]  # GLM-5 TP8 gate_up and down_proj
SEARCH_BUCKETS = [1, 16, 128, 1024, 4096]
SEARCH_SAMPLE = 40


def _t(bm, bn, bk, w, s, sk=1, gm=1) -> Tactic:
    return FAM._tactic(bm, bn, bk, gm, w, s, sk)


def candidates(m: int) -> list[Tactic]:
    """The bucket's candidate list for the table (a pruned exhaustive search, not the full space)."""
    if m <= 16:
        c = [_t(16, bn, bk, 4, 3, sk) for bn in (32, 64, 128) for bk in (128, 256) for sk in (1, 2, 4, 8, 16)]
    elif m <= 64:
        c = [_t(bm, bn, bk, 4, 3, sk) for bm in (16, 32) for bn in (64, 128) for bk in (128, 256) for sk in (1, 2, 4)]
    elif m <= 512:
        c = [_t(bm, bn, bk, 4, s, 1, 8) for bm in (32, 64) for bn in (64, 128) for bk in (64, 128) for s in (3, 4)]
        c += [_t(128, 128, 64, 8, 3, 1, 8), _t(128, 64, 128, 4, 3, 1, 8)]
        c += [_t(32, bn, 256, 4, 3, sk) for bn in (64, 128) for sk in (2, 4, 8)]
    else:
        c = [_t(bm, bn, bk, w, s, 1, 8) for bm, bn, bk, w in ((128, 128, 64, 8), (128, 256, 64, 8), (128, 128, 128, 8),
                                                              (64, 128, 128, 4), (64, 256, 64, 8), (128, 64, 128, 4),
                                                              (64, 128, 64, 4), (128, 128, 64, 4))
             for s in (3, 4)]
    return c + [Tactic("triton", kernel=DQ_KERNEL, **DQ_TILE)]


def glm5_problems() -> list[tuple[str, Problem]]:
    from autotune.models import problems_for
    out = []
    for tp in (1, 8):
        for u in problems_for("glm5", tp):
            if u.problem.kind == "dense":
                out.append((f"TP{tp} {u.layers[0].split('[')[0].replace('mlp.', '')}", u.problem))
    return out


# -- precompile -------------------------------------------------------------------------------

def _pre_one(args):
    key, tj, arch = args
    from autotune.core.arch import get_arch
    t0 = time.perf_counter()
    try:
        smem = FAM.precompile(Problem.from_key(key), Tactic.from_json(tj), get_arch(arch))
        return tj, smem, None, time.perf_counter() - t0
    except Exception as e:  # noqa: BLE001 - reported in the JSON
        return tj, None, f"{type(e).__name__}: {str(e)[:200]}", time.perf_counter() - t0


def precompile(items: list[tuple[str, str]], arch: str, procs: int = 16) -> dict:
    """Compile (problem key, tactic json) items in `procs` spawned processes; one per distinct
    tactic (every problem here has the same specialization: N, K multiples of 16)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor
    seen, work = set(), []
    for key, tj in items:
        if tj not in seen and json.loads(tj)["params"]["kernel"] != DQ_KERNEL:
            seen.add(tj)
            work.append((key, tj, arch))
    t0 = time.perf_counter()
    with ProcessPoolExecutor(procs, mp_context=mp.get_context("spawn")) as ex:
        res = list(ex.map(_pre_one, work))
    return {"compiled": len(work), "wall_s": time.perf_counter() - t0,
            "errors": [r[2] for r in res if r[2]][:5], "smem": {r[0]: r[1] for r in res}}


# -- measuring helpers ------------------------------------------------------------------------

def ceilings() -> dict:
    import torch
    nb = 1 << 30
    src = torch.randint(0, 255, (nb,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def med(fn, n):
        ts = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return sorted(ts)[len(ts) // 2]
    med(lambda: dst.copy_(src), 3)
    copy = 2 * nb / med(lambda: dst.copy_(src), 15)
    del src, dst
    g = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    h = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    med(lambda: g @ h, 3)
    rate = 2 * 8192 ** 3 / med(lambda: g @ h, 15)
    return {"copy_GBps": copy / 1e9, "bf16_TFLOPs": rate / 1e12}


class Inputs:
    """Weights drawn once per problem (n_sets of them, rotated for cold L2), fresh x per bucket."""

    def __init__(self, p: Problem, seed: int):
        import torch

        from autotune.core import inputs
        from autotune.engine import timing
        self.p = p
        gen = torch.Generator().manual_seed(seed)
        w0 = inputs.random_weight(p, "cuda", gen)
        per = w0.packed.numel() + w0.scales.numel()
        self.n_sets = bench.sets_for_cold_l2(per, "cuda", cap=16)
        self.w = [w0] + [inputs.random_weight(p, "cuda", gen) for _ in range(self.n_sets - 1)]
        self.wbf16 = [w.dequantize(torch.bfloat16) for w in self.w]

    def sets(self, m: int, seed: int):
        import torch

        from autotune.core import inputs
        from autotune.engine import timing
        g = torch.Generator(device="cuda").manual_seed(seed)
        return [inputs.InputSet(torch.randn(m, self.p.k, device="cuda", generator=g).to(torch.bfloat16), w)
                for w in self.w]


def measure(p: Problem, tactic: Tactic, sets, ref, outs, timer) -> dict:
    from autotune.core import inputs
    from autotune.engine import timing
    k = FAM.build(p, tactic, "cuda")
    try:
        err = inputs.check(p, k, sets[0], ref)
    except Exception as e:  # noqa: BLE001 - a failed check is a result
        return {"tactic": tactic.params, "fail": f"{type(e).__name__}: {str(e)[:200]}"}
    tm = timing.time_calls(lambda i: k(*sets[i].args(), out=outs[i]), len(sets), "cuda", timer)
    return {"tactic": tactic.params, "id": tactic.id, "us": tm.median_us, "iqr": tm.iqr_us, "reps": tm.reps,
            "err": err, "smem": getattr(k, "smem_compiled", None), "smem_model": getattr(k, "smem_model", None)}


def table_phase(res: dict, out: Path, deadline: float) -> None:
    import torch

    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.core.arch import detect
    arch = detect()
    timer = timing.TimerConfig(budget_s=0.03, max_reps=20)
    rows = res.setdefault("table", [])
    for pi, (label, p) in enumerate(glm5_problems()):
        inp = Inputs(p, seed=100 + pi)
        default = FAM.default(p, arch)
        for m in BUCKETS:
            if time.time() > deadline:
                res.setdefault("notes", []).append(f"table stopped at {label} M={m}: time budget")
                return
            sets = inp.sets(m, seed=1000 * pi + m)
            ref = inputs.reference(p, sets[0])
            outs = [inputs.torch_empty_out(p, m, s) for s in sets]
            # cuBLAS bf16 on pre-dequantized weights (checked like the rest)
            cb = inputs.check(p, lambda x, w, out: torch.matmul(x, inp.wbf16[0].T, out=out), sets[0], ref)
            tcb = timing.time_calls(lambda i: torch.matmul(sets[i].x, inp.wbf16[i].T, out=outs[i]), len(sets), "cuda", timer)
            cands = [c for c in candidates(m) if FAM.verdict(p, c, arch).ok]
            if default not in cands:
                cands.append(default)
            meas = [measure(p, c, sets, ref, outs, timer) for c in cands]
            ok = [r for r in meas if "us" in r]
            fused = [r for r in ok if r["tactic"]["kernel"] != DQ_KERNEL]
            best = min(ok, key=lambda r: r["us"])
            bestf = min(fused, key=lambda r: r["us"])
            d = next(r for r in meas if r["tactic"] == default.params)
            wb = p.n * p.k // 2 + p.n * p.k // p.block
            rows.append({"problem": label, "key": p.key, "n": p.n, "k": p.k, "m": m, "cublas_us": tcb.median_us,
                         "cublas_err": cb, "tuned": best, "tuned_fused": bestf, "default": d,
                         "bytes": wb + m * p.k * 2 + m * p.n * 2, "flop": 2 * m * p.n * p.k,
                         "fails": [r for r in meas if "fail" in r],
                         "smem_mismatch": [r for r in ok if r.get("smem") is not None and r.get("smem_model") is not None
                                           and r["smem"] != r["smem_model"]],
                         "n_cands": len(cands)})
            print(f"{label:32s} M={m:5d} tuned {best['us']:9.1f} fused {bestf['us']:9.1f} default "
                  f"{d.get('us', float('nan')):9.1f} cublas {tcb.median_us:9.1f} us", flush=True)
            del sets, outs, ref
        del inp
        torch.cuda.empty_cache()
        (out / "triton_h200.json").write_text(json.dumps(res, indent=1, default=str))


# -- search cost ------------------------------------------------------------------------------

def search_sample() -> list[Tactic]:
    """A fixed sample of the family's enumeration for sm90, with over-limit configs in it."""
    from autotune.core.arch import get_arch
    p = Problem.dense(*SEARCH_PROBLEMS[0])
    space = [t for t in FAM.enumerate(p, get_arch("sm90")) if t["kernel"] != DQ_KERNEL]
    rng = random.Random(4)
    over = [t for t in space if FAM.verdict(p, t, get_arch("sm90")).reason.startswith("smem")]
    # no over-limit config is left in the space at the default stage counts: add deeper pipelines of
    # big tiles (what a triton.autotune user would list) so the cost of compiling them shows
    if not over:
        over = [_t(128, 256, 128, 8, s) for s in (5, 6)] + [_t(128, 128, 256, 8, s) for s in (5, 6)]
    kept = [t for t in space if t not in over]
    return sorted(rng.sample(kept, SEARCH_SAMPLE - 4) + over[:4], key=lambda t: t.id)


def _autotune_child(out_json: str) -> None:
    """triton.autotune over the sample: one autotuned kernel, key M, Triton's defaults."""
    import torch
    import triton

    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.tactics.triton_fp4.kernel import w4a16_dequant_kernel
    sample = search_sample()
    configs = [triton.Config({"BLOCK_M": t["block_m"], "BLOCK_N": t["block_n"], "BLOCK_K": t["block_k"],
                              "GROUP_M": t["group_m"], "SPLIT_K": t["split_k"]},
                             num_warps=t["num_warps"], num_stages=t["num_stages"]) for t in sample]
    tuned = triton.autotune(configs=configs, key=["M", "N", "K"])(w4a16_dequant_kernel)
    result = {"problems": []}
    t_all = time.perf_counter()
    for n, k in SEARCH_PROBLEMS:
        p = Problem.dense(n, k)
        for m in SEARCH_BUCKETS:
            s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            # room for any config's split-K partials: 16 splits × M padded to 128 × N padded
            ws = torch.empty(16 * ((m + 127) // 128 * 128) * (n + 256), dtype=torch.float32, device="cuda")
            locks = torch.zeros((m // 16 + 1) * (n // 32 + 1) + 16, dtype=torch.int32, device="cuda")
            gs = s.w.global_scale.reshape(1).float()

            def grid(meta):
                return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])
            t0 = time.perf_counter()
            tuned[grid](s.x, s.w.packed, s.w.scales.view(torch.uint8), gs, out, ws, locks, m, n, k,
                        SCALE_GROUP=16, SCALE_E4M3=1, DEQ_ASM=1, DOT_F32=0)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            timings = {str(c): v for c, v in getattr(tuned, "configs_timings", {}).items()}
            failed = sum(1 for v in timings.values() if not all(math.isfinite(x) for x in (v if isinstance(v, list) else [v])))
            bc = tuned.best_config
            win = _t(bc.kwargs["BLOCK_M"], bc.kwargs["BLOCK_N"], bc.kwargs["BLOCK_K"], bc.num_warps, bc.num_stages,
                     bc.kwargs["SPLIT_K"], bc.kwargs["GROUP_M"])
            result["problems"].append({"key": p.key, "m": m, "wall_s": wall, "winner": win.to_json(),
                                       "failed_configs": failed, "configs_timed": len(timings)})
            print(f"autotune {p.key} M={m}: {wall:.1f}s, {failed} configs failed", flush=True)
    result["wall_s"] = time.perf_counter() - t_all
    Path(out_json).write_text(json.dumps(result))


def _ours_child(out_json: str) -> None:
    """Our search over the same sample: verdict, parallel precompile, check, graph-timed median."""
    t_all = time.perf_counter()
    from autotune.core.arch import get_arch
    sample = search_sample()
    arch = get_arch("sm90")
    kept = {(n, k): [t for t in sample if FAM.verdict(Problem.dense(n, k), t, arch).ok] for n, k in SEARCH_PROBLEMS}
    items = [(Problem.dense(n, k).key, t.to_json()) for (n, k), ts in kept.items() for t in ts]
    pre = precompile(items, "sm90")
    import torch

    from autotune.core import inputs
    from autotune.engine import timing
    result = {"precompile_s": pre["wall_s"], "compiled": pre["compiled"], "problems": []}
    timer = timing.TimerConfig(budget_s=0.02, max_reps=10)
    for n, k in SEARCH_PROBLEMS:
        p = Problem.dense(n, k)
        for m in SEARCH_BUCKETS:
            t0 = time.perf_counter()
            s1 = inputs.make_inputs(p, m, "cuda", seed=m)[0]
            n_sets = bench.sets_for_cold_l2(s1.nbytes(), "cuda", cap=16)
            sets = [s1] + (inputs.make_inputs(p, m, "cuda", seed=m + 7, n_sets=n_sets - 1) if n_sets > 1 else [])
            ref = inputs.reference(p, sets[0])
            outs = [inputs.torch_empty_out(p, m, s) for s in sets]
            meas = [measure(p, t, sets, ref, outs, timer) for t in kept[(n, k)]]
            ok = [r for r in meas if "us" in r]
            win = min(ok, key=lambda r: r["us"])
            result["problems"].append({"key": p.key, "m": m, "wall_s": time.perf_counter() - t0,
                                       "winner": Tactic("triton", win["tactic"]).to_json(),
                                       "rejected_by_verdict": len(sample) - len(kept[(n, k)]),
                                       "fails": len(meas) - len(ok)})
            print(f"ours {p.key} M={m}: {time.perf_counter() - t0:.1f}s", flush=True)
            del sets, outs, ref
    result["wall_s"] = time.perf_counter() - t_all
    Path(out_json).write_text(json.dumps(result))


def _exhaustive(ours: dict, theirs: dict) -> list[dict]:
    """Re-time every kept sample config carefully (default TimerConfig) per (problem, bucket)."""
    import torch

    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.core.arch import detect
    arch = detect()
    sample = search_sample()
    rows = []
    for n, k in SEARCH_PROBLEMS:
        p = Problem.dense(n, k)
        for m in SEARCH_BUCKETS:
            s1 = inputs.make_inputs(p, m, "cuda", seed=m + 99)[0]
            n_sets = bench.sets_for_cold_l2(s1.nbytes(), "cuda", cap=16)
            sets = [s1] + (inputs.make_inputs(p, m, "cuda", seed=m + 98, n_sets=n_sets - 1) if n_sets > 1 else [])
            ref = inputs.reference(p, sets[0])
            outs = [inputs.torch_empty_out(p, m, s) for s in sets]
            timer = timing.TimerConfig(budget_s=0.1, max_reps=50)
            times = {}
            for t in sample:
                if FAM.verdict(p, t, arch).ok:
                    r = measure(p, t, sets, ref, outs, timer)
                    if "us" in r:
                        times[t.id] = r["us"]
            best = min(times.values())
            ow = Tactic.from_json(next(x["winner"] for x in ours["problems"] if x["key"] == p.key and x["m"] == m))
            tw = Tactic.from_json(next(x["winner"] for x in theirs["problems"] if x["key"] == p.key and x["m"] == m))
            rows.append({"key": p.key, "m": m, "best_us": best, "ours_us": times.get(ow.id), "autotune_us": times.get(tw.id),
                         "ours": ow.params, "autotune": tw.params})
            del sets, outs, ref
            torch.cuda.empty_cache()
    return rows


def search_phase(res: dict, out: Path) -> None:
    import tempfile
    env = {k: v for k, v in os.environ.items() if k != "TRITON_CACHE_DIR"}
    for who in ("autotune", "ours"):
        d = tempfile.mkdtemp(prefix=f"tc-{who}-")
        oj = str(out / f"search_{who}.json")
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, f"_{who}", oj], env={**env, "TRITON_CACHE_DIR": d},
                           capture_output=True, text=True, timeout=300)
        print(r.stdout[-2000:], r.stderr[-2000:] if r.returncode else "", flush=True)
        if r.returncode:
            res.setdefault("notes", []).append(f"{who} search failed: {r.stderr[-500:]}")
            return
        res[f"search_{who}"] = {**json.loads(Path(oj).read_text()), "process_wall_s": time.perf_counter() - t0}
    smp = search_sample()
    precompile([(Problem.dense(*SEARCH_PROBLEMS[0]).key, t.to_json()) for t in smp
                if FAM.verdict(Problem.dense(*SEARCH_PROBLEMS[0]), t, __import__("autotune.core.arch", fromlist=["x"]).get_arch("sm90")).ok], "sm90")
    res["search_exhaustive"] = _exhaustive(res["search_ours"], res["search_autotune"])
    res["search_sample"] = [t.params for t in search_sample()]


def moe_phase(res: dict) -> None:
    """GLM-5 TP8 grouped-MoE problems: the triton MoE member (default and best of its space) vs
    the torch family's default, skewed top-8 routing, same timer as the table."""
    import torch

    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.models import problems_for
    from autotune.tactics import registry
    from autotune.core.arch import detect
    arch = detect()
    torch_fam = registry.get("torch")
    # CUDA-graph replay for every call: the routing alignment is a handful of small torch ops whose
    # host launch cost would otherwise dominate (the torch family's host syncs make its calls
    # uncapturable: time_calls falls back to events for it)
    timer = timing.TimerConfig(budget_s=0.03, max_reps=20, graph_below_us=1e9)
    probs = [u.problem for u in problems_for("glm5", 8) if u.problem.kind == "grouped_moe"]
    items = [(p.key, t.to_json()) for p in probs for t in FAM.enumerate(p, arch) if FAM.verdict(p, t, arch).ok]
    pre = precompile(items, arch.name)
    rows = res.setdefault("moe", [])
    for p in probs:
        space = [t for t in FAM.enumerate(p, arch) if FAM.verdict(p, t, arch).ok]
        for m in (1, 16, 128, 1024):
            s = inputs.make_inputs(p, m, "cuda", seed=m)[0]
            ref = inputs.reference(p, s)
            out = [inputs.torch_empty_out(p, m, s)]
            meas = [measure(p, t, [s], ref, out, timer) for t in space]
            ok = [r for r in meas if "us" in r]
            tk = torch_fam.build(p, torch_fam.default(p, arch), "cuda")
            inputs.check(p, tk, s, ref)
            tt = timing.time_calls(lambda i: tk(*s.args(), out=out[0]), 1, "cuda", timer)
            d = next(r for r in meas if r["tactic"] == FAM.default(p, arch).params)
            best = min(ok, key=lambda r: r["us"])
            rows.append({"key": p.key, "m": m, "torch_us": tt.median_us, "default": d, "tuned": best,
                         "fails": [r for r in meas if "fail" in r], "precompile_s": pre["wall_s"]})
            print(f"{p.key} M={m}: triton tuned {best['us']:.1f} default {d.get('us', float('nan')):.1f} "
                  f"torch {tt.median_us:.1f} us, {len(meas) - len(ok)} failed", flush=True)
            del s, ref, out
            torch.cuda.empty_cache()


def run(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + a.table_budget_s
    res: dict = {"command": "python3 bench/triton_h200.py " + " ".join(sys.argv[1:]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    phases = a.phases.split(",")
    if "table" in phases:
        from autotune.core.arch import get_arch
        items = [(p.key, c.to_json()) for _, p in glm5_problems() for m in BUCKETS for c in candidates(m) + [FAM.default(p, get_arch("sm90"))]
                 if FAM.verdict(p, c, get_arch("sm90")).ok]
        pre = precompile(items, "sm90")
        res["precompile"] = {k: v for k, v in pre.items() if k != "smem"}
        print(f"precompiled {pre['compiled']} in {pre['wall_s']:.1f}s errors {pre['errors']}", flush=True)
    import torch
    import triton
    from autotune.core.arch import detect
    res["env"] = {"gpu": torch.cuda.get_device_name(), "sms": torch.cuda.get_device_properties(0).multi_processor_count,
                  "l2_MiB": torch.cuda.get_device_properties(0).L2_cache_size / 2**20,
                  "torch": torch.__version__, "triton": triton.__version__, "arch": detect().name}
    res["ceilings"] = ceilings()
    print(res["env"], res["ceilings"], flush=True)
    if "table" in phases:
        table_phase(res, out, deadline)
    (out / "triton_h200.json").write_text(json.dumps(res, indent=1, default=str))
    if "moe" in phases:
        moe_phase(res)
    (out / "triton_h200.json").write_text(json.dumps(res, indent=1, default=str))
    if "search" in phases:
        search_phase(res, out)
    (out / "triton_h200.json").write_text(json.dumps(res, indent=1, default=str))
    return 0


# -- render -----------------------------------------------------------------------------------

def main() -> int:
    if len(sys.argv) >= 3 and sys.argv[1] in ("_autotune", "_ours"):
        (_autotune_child if sys.argv[1] == "_autotune" else _ours_child)(sys.argv[2])
        return 0
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default=os.environ.get("OUT", "."))
    r.add_argument("--phases", default="table,search")
    r.add_argument("--table-budget-s", type=float, default=330.0)
    d = sub.add_parser("render")
    d.add_argument("src")
    d.add_argument("dst")
    a = ap.parse_args()
    if a.cmd == "run":
        return run(a)
    from triton_h200_render import render     # bench/ is on sys.path when run as a script
    return render(a.src, a.dst)


if __name__ == "__main__":
    sys.exit(main())
