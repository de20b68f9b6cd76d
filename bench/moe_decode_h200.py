"""GLM-5 TP8 routed MoE at decode sizes (issue #15): the `moe_decode` member against the existing
`moe_w4a16` default, the byte floor of the experts touched, torch's bf16 `_grouped_mm` and a bf16 GEMV.

    python3 bench/moe_decode_h200.py --out DIR [--budget-s 480]          # on the GPU machine
    python3 bench/moe_decode_h200.py --render docs/data/moe-decode-h200.json   # the tables of docs/moe-decode.md
    MOE_DECODE_SMOKE=1 TRITON_INTERPRET=1 python3 bench/moe_decode_h200.py --out DIR   # CPU smoke test

Problems (E = 256, top-8, NVFP4): w13 N=512 K=6144 (plain, and the SwiGLU epilogue → N/2), w2
N=6144 K=256 (routing weights applied; plain, and the top_k-reducing epilogue → [M, N]).
Buckets 1 … 1024, routing skewed (Zipf 1.2, autotune.engine.inputs.routing) and uniform.

1. The copy rate: a 1 GiB device-to-device copy (bytes read + written), median of 20.
2. Compile every kept config (Triton's cache; a process pool), then check every kept config of
   every variant against float64 (dequantize-then-matmul on the GPU, NaN-poisoned output) at
   M = 3 (one slot routed off the rank, -1) and M = 40 (320 pairs: the aligned route).
3. Per (variant, bucket, routing), with autotune.engine.timing.time_calls (CUDA-graph replay, one
   call per input set, sets rotated over ≥ 2× the L2 with distinct expert weights, medians):
   the member's configs (all kept ones for w13/w2 with skewed routing; the 6 best of that and the
   default otherwise), moe_w4a16's default (unfused variants), moe_align alone, the floor (weights
   and scales of the experts touched + activations + outputs + routing, at the copy rate), torch
   `_grouped_mm` on bf16 weights with the routing sorted by torch ops inside the call (unfused
   variants), and one bf16 GEMV over the touched experts' bf16 bytes (a [n_touched·N, K] weight).
Writes DIR/moe_decode.json after every bucket; prints a table at the end.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.core.problem import Problem  # noqa: E402

SMOKE = os.environ.get("MOE_DECODE_SMOKE") == "1"
E, TOP_K = (256, 8) if not SMOKE else (6, 2)
W13 = Problem.moe(512, 6144, E, TOP_K) if not SMOKE else Problem.moe(64, 256, E, TOP_K)
W2 = Problem.moe(6144, 256, E, TOP_K) if not SMOKE else Problem.moe(64, 128, E, TOP_K)
#: variant → (problem, epilogue, routing weights passed)
VARIANTS = {"w13": (W13, "none", False), "w13_swiglu": (W13, "swiglu", False),
            "w2": (W2, "none", True), "w2_reduce": (W2, "reduce", True)}
BASE = {"w13_swiglu": "w13", "w2_reduce": "w2"}
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024] if not SMOKE else [1, 3]
ROUTINGS = {"skewed": 1.2, "uniform": 0.0}
MAX_SETS = 10 if not SMOKE else 2
DEV = "cpu" if SMOKE else "cuda"


def _compile_one(args):
    from autotune.tactics.triton_fp4 import moe_decode as md
    prob, cfg, cc, epi, routed, aligned, split = args
    c = dict(cfg, route="aligned" if aligned else cfg["route"], split_k=split)
    try:
        md.cross_compile(prob, c, cc, epi, routed, stop_at="cubin")
        return None
    except Exception as exc:   # the launch compiles it again and records the error
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"


def precompile(kept: dict, cc: int, jobs: int) -> list[str]:
    """Fill Triton's cache with every kernel the run launches (both routes of direct configs: a
    direct launcher runs the aligned route above DIRECT_MAX_PAIRS pairs). Split-K keeps its split
    at every M (large M is cut into token chunks, since 2026-12-01): no lowered variant to compile."""
    work = []
    for name, (prob, epi, routed) in VARIANTS.items():
        for cfg in kept[name]:
            for aligned in ((False, True) if cfg["route"] == "direct" else (True,)):
                work.append((prob, cfg, cc, epi, routed, aligned, cfg["split_k"]))
    import multiprocessing as mp
    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
        return [r for r in ex.map(_compile_one, work, chunksize=4) if r]


def reference(prob, epi, x, w, ids, tw):
    """float64 dequantize-then-matmul per expert hit; -1 slots are zero rows."""
    import torch
    m, k = ids.shape
    n_out = prob.n // 2 if epi == "swiglu" else prob.n
    out = torch.zeros(m, k, n_out, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids).tolist():
        if e < 0:
            continue
        rows, slots = torch.nonzero(ids == e, as_tuple=True)
        y = x[rows].double() @ w.expert(e).dequantize(torch.float64).T
        if epi == "swiglu":
            g, u = y[:, : prob.n // 2], y[:, prob.n // 2:]
            y = g * torch.sigmoid(g) * u
        if tw is not None:
            y = y * tw[rows, slots, None].double()
        out[rows, slots] = y
    return out.sum(1) if epi == "reduce" else out


def out_shape(prob, epi, m):
    if epi == "reduce":
        return (m, prob.n)
    return (m, TOP_K, prob.n // 2 if epi == "swiglu" else prob.n)


def copy_rate() -> float:
    """Bytes per second of a device-to-device copy, read + written (median of 20)."""
    import torch
    if SMOKE:
        return 1e10
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    ts = []
    for _ in range(20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) / 1e3)
    del a, b
    return 2 * (1 << 30) / statistics.median(ts)


def routing(m, skew, seed):
    import torch
    from autotune.core.inputs import routing as draw
    ids, tw = draw(m, E, TOP_K, torch.Generator().manual_seed(seed), skew=skew)
    return ids.to(DEV), tw.to(DEV)


def grouped_mm_call(x, wb, ids, out):
    """torch bf16 MoE on the same routing: sort pairs by expert with torch ops, _grouped_mm, scatter back."""
    import torch
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    y = torch._grouped_mm(x[order // TOP_K], wb.transpose(1, 2), offs=offs)
    out.view(-1, out.shape[-1]).index_copy_(0, order, y)
    return out


def err_of(out, ref) -> float:
    import torch
    if torch.isnan(out).any():
        return float("nan")
    return float((out.double() - ref).norm() / ref.norm())


def _short(c) -> str:
    return f"{c['route'][0]} {c['block_m']}×{c['block_n']}×{c['block_k']} s{c['split_k']} st{c['num_stages']}"


def _f(v, fmt="{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def render(path: Path) -> str:
    """Markdown tables from a result JSON (every number in docs/moe-decode.md comes from here)."""
    r = json.loads(path.read_text())
    rows = r["rows"]
    get = {(x["variant"], x["routing"], x["m"]): x for x in rows}
    out = [f"{r['gpu']}, torch {r['torch']}, Triton {r['triton']}, {r['when']}; copy rate "
           f"{r['copy_Bps'] / 1e12:.2f} TB/s (read + write), L2 {r['l2_bytes'] / 2**20:.0f} MiB.", ""]
    out.append("Checks against float64 (M = 3 with a -1 slot, M = 40): " + "; ".join(
        f"{k} {v['checked']}/{v['of']} runs, {v['failed']} failed, worst {v['worst_ok']:.2e}"
        for k, v in r["checks"].items()))
    for routing in ROUTINGS:
        for name in VARIANTS:
            out += ["", f"**{name}, {routing} routing** (µs; floor = touched experts' FP4 bytes + activations + "
                    "outputs at the copy rate)", "",
                    "| M | experts touched | moe_decode tuned | config | ×floor | moe_decode default | "
                    "moe_w4a16 default | bf16 _grouped_mm | bf16 GEMV (touched bytes) | floor |",
                    "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
            for m in BUCKETS:
                x = get.get((name, routing, m))
                if not x or "best_us" not in x:
                    continue
                out.append(f"| {m} | {x['touched']:.1f} | {x['best_us']:.1f} | {_short(x['best_config'])} | "
                           f"{x['best_us'] / x['floor_us']:.1f} | {_f(x['default_us'])} | "
                           f"{_f(x.get('moe_w4a16_default_us'))} | {_f(x.get('grouped_mm_bf16_us'))} | "
                           f"{_f(x.get('gemv_bf16_us'))} | {x['floor_us']:.1f} |")
    out += ["", "**One MoE layer's routed work** (skewed routing, µs): fused = w13_swiglu + w2_reduce; unfused = "
            "w13 + w2 (no SiLU, no top-k sum); moe_w4a16 = its default w13 + w2. Every aligned-route call (and "
            "every call above 256 pairs) ran its own moe_align inside its time; a layer sharing one alignment "
            "saves one 'align alone' from these sums", "",
            "| M | fused | unfused | moe_w4a16 | align alone |", "|---:|---:|---:|---:|---:|"]
    for m in BUCKETS:
        a, b = get.get(("w13_swiglu", "skewed", m)), get.get(("w2_reduce", "skewed", m))
        c, d = get.get(("w13", "skewed", m)), get.get(("w2", "skewed", m))
        if not all(x and "best_us" in x for x in (a, b, c, d)):
            continue
        fused = a["best_us"] + b["best_us"]
        old = (c.get("moe_w4a16_default_us") or 0) + (d.get("moe_w4a16_default_us") or 0)
        out.append(f"| {m} | {fused:.1f} | {c['best_us'] + d['best_us']:.1f} | {old:.1f} | {_f(c.get('align_us'))} |")
    out += ["", "**Tuned vs the best single config** (skewed routing, all kept configs timed at every bucket; "
            "geomean over buckets of single/tuned)", ""]
    for name in ("w13", "w2"):
        rs = [get[(name, "skewed", m)] for m in BUCKETS if (name, "skewed", m) in get]
        common = set.intersection(*[set(x["configs"]) for x in rs])
        if not common:
            continue
        single = min(common, key=lambda c: sum(math.log(x["configs"][c]["us"]) for x in rs))
        ratios = [x["configs"][single]["us"] / x["best_us"] for x in rs]
        dflt = [x["default_us"] / x["best_us"] for x in rs if x.get("default_us")]
        gm = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
        out.append(f"* {name}: single best {_short(rs[0]['configs'][single]['config'])}, tuned/single "
                   f"{gm(ratios):.2f}× (max {max(ratios):.2f}×); tuned/default {gm(dflt):.2f}× over {len(rs)} buckets, "
                   f"{len(common)} configs")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--render", type=Path, help="print the markdown tables of a result JSON and exit")
    ap.add_argument("--budget-s", type=float, default=480.0)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1))
    a = ap.parse_args()
    if a.render:
        print(render(a.render))
        return 0
    if a.out is None:
        ap.error("--out DIR (or --render JSON) is required")
    a.out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    import torch
    import triton

    from autotune.core.arch import ARCHS, detect
    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.tactics.triton_fp4 import moe_decode as md
    from autotune.tactics.triton_fp4.family import TritonFamily
    from autotune.tactics.triton_fp4.moe_align import Aligner

    arch = ARCHS["cpu"] if SMOKE else detect()
    res = {"gpu": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "arch": arch.name,
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python3 bench/moe_decode_h200.py --out $OUT", "rows": [], "checks": {}}
    path = a.out / "moe_decode.json"

    def save():
        path.write_text(json.dumps(res, indent=1))

    res["copy_Bps"] = rate = copy_rate()
    res["l2_bytes"] = l2 = 0 if SMOKE else torch.cuda.get_device_properties(0).L2_cache_size
    print(f"copy {rate / 1e12:.2f} TB/s, L2 {l2 / 2**20:.0f} MiB", flush=True)
    kept = {name: list(md.space(prob, arch)) for name, (prob, _, _) in VARIANTS.items()}
    if SMOKE:
        kept = {k: v[:2] + [c for c in v if c["route"] == "aligned"][:1] for k, v in kept.items()}
    if not SMOKE:
        t = time.time()
        errs = precompile(kept, arch.cc_int, a.jobs)
        res["precompile"] = {"s": round(time.time() - t, 1), "errors": errs[:5], "n_errors": len(errs)}
        print(f"precompiled in {time.time() - t:.0f} s, {len(errs)} errors", flush=True)

    # ---- weights: MAX_SETS distinct FP4 expert sets per problem, and bf16 ones for torch ----------
    pools, bf16 = {}, {}
    for prob in (W13, W2):
        pools[prob] = [inputs.seeded_weight(prob, DEV, 100 + i) for i in range(MAX_SETS)]
        g = torch.Generator(device=DEV).manual_seed(7)
        bf16[prob] = [(torch.randn(E, prob.n, prob.k, generator=g, device=DEV) * 0.02).to(torch.bfloat16)
                      for _ in range(MAX_SETS if not SMOKE else 1)]
    gen = torch.Generator(device=DEV).manual_seed(1)

    # ---- 2. every kept config against float64 ----------------------------------------------------------
    for name, (prob, epi, routed) in VARIANTS.items():
        fails, worst, n = [], 0.0, 0
        for m in (3, 40):
            ids, tw = routing(m, ROUTINGS["skewed"], 11 + m)
            ids[0, -1] = -1
            x = torch.randn(m, prob.k, generator=gen, device=DEV).to(torch.bfloat16)
            w = pools[prob][0]
            ref = reference(prob, epi, x, w, ids, tw if routed else None)
            for cfg in kept[name]:
                if time.time() - t_start > 0.4 * a.budget_s:
                    break                       # compiles missed the cache: leave time for the timings
                t0 = time.time()
                out = torch.full(out_shape(prob, epi, m), float("nan"), dtype=torch.bfloat16, device=DEV)
                try:
                    md.make_launcher(prob, cfg, epi)(x, w, ids, tw if routed else None, out=out)
                    e = err_of(out, ref)
                except Exception as exc:
                    e, msg = float("nan"), f"{type(exc).__name__}: {str(exc)[:160]}"
                else:
                    msg = None
                n += 1
                if time.time() - t0 > 1.0:
                    res.setdefault("slow_first_launch", []).append([name, m, round(time.time() - t0, 2)])
                if not e <= inputs.TOLERANCE["bf16"]:
                    fails.append({"m": m, "config": cfg, "err": e, "msg": msg})
                else:
                    worst = max(worst, e)
        res["checks"][name] = {"checked": n, "of": 2 * len(kept[name]), "failed": len(fails), "worst_ok": worst,
                               "failures": fails[:10]}
        print(f"check {name}: {n} runs, {len(fails)} failed, worst rel. err {worst:.2e}", flush=True)
    save()

    # ---- 3. timings ---------------------------------------------------------------------------------
    quick = timing.TimerConfig(min_reps=5, max_reps=15, budget_s=0.02)
    fam, old = TritonFamily(), {}
    for name, (prob, epi, routed) in VARIANTS.items():
        if epi == "none":
            t = fam.default(prob, arch)
            old[name] = (t.params, fam.build(prob, t, DEV))
    ebytes = {p: p.n * (p.k // 2 + p.k // p.block) + 4 for p in (W13, W2)}
    for rname, skew in ROUTINGS.items():
        for m in BUCKETS:
            for name, (prob, epi, routed) in VARIANTS.items():
                over = time.time() - t_start > a.budget_s
                if over and (rname != "skewed" or epi != "none"):
                    continue
                routes = [routing(m, skew, 1000 * m + 17 * i) for i in range(MAX_SETS)]
                touched = statistics.mean(len(set(r[0].reshape(-1).tolist())) for r in routes)
                n_out = math.prod(out_shape(prob, epi, m))
                floor_b = touched * ebytes[prob] + m * prob.k * 2 + n_out * 2 + m * TOP_K * 8
                n_sets = max(2, min(MAX_SETS, math.ceil(2 * max(l2, 1) / max(1.0, touched * ebytes[prob]))))
                xs = [torch.randn(m, prob.k, generator=gen, device=DEV).to(torch.bfloat16) for _ in range(n_sets)]
                outs = [torch.empty(out_shape(prob, epi, m), dtype=torch.bfloat16, device=DEV) for _ in range(n_sets)]
                ws = pools[prob]

                def args(i):
                    ids, tw = routes[i]
                    return xs[i], ws[i], ids, (tw if routed else None)

                row = {"variant": name, "routing": rname, "m": m, "sets": n_sets, "touched": touched,
                       "floor_bytes": floor_b, "floor_us": floor_b / rate * 1e6, "configs": {}}
                if rname == "skewed" and epi == "none" and not over:
                    cands = kept[name]
                else:
                    # the 6 best of the base variant's skewed row at this bucket (the last one timed if over budget)
                    base = next((r for r in reversed(res["rows"]) if r["variant"] == BASE.get(name, name)
                                 and r["routing"] == "skewed" and (r["m"] == m or over)), None)
                    ranked = sorted(base["configs"].values(), key=lambda c: c["us"]) if base else []
                    cands = [c["config"] for c in ranked[:6]]
                    cands += [md.default(prob)] if md.default(prob) not in cands else []
                for cfg in cands:
                    try:
                        L = md.make_launcher(prob, cfg, epi)
                        tm = timing.time_calls(lambda i: L(*args(i), out=outs[i]), n_sets, DEV, quick)
                        row["configs"][json.dumps(cfg, sort_keys=True)] = {"config": cfg, "us": tm.median_us}
                    except Exception as exc:
                        row.setdefault("errors", []).append(f"{cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                if row["configs"]:
                    best = min(row["configs"].values(), key=lambda c: c["us"])
                    row["best_us"], row["best_config"] = best["us"], best["config"]
                d = row["configs"].get(json.dumps(md.default(prob), sort_keys=True))
                row["default_us"] = d["us"] if d else None
                if name in old:
                    kern = old[name][1]
                    try:
                        row["moe_w4a16_default_us"] = timing.time_calls(
                            lambda i: kern(*args(i), out=outs[i]), n_sets, DEV, quick).median_us
                    except Exception as exc:
                        row["moe_w4a16_error"] = f"{type(exc).__name__}: {str(exc)[:120]}"
                    if name == "w13":
                        al = Aligner(E, 16)
                        row["align_us"] = timing.time_calls(lambda i: al(routes[i][0]), n_sets, DEV, quick).median_us
                    wb = bf16[prob]
                    try:
                        row["grouped_mm_bf16_us"] = timing.time_calls(
                            lambda i: grouped_mm_call(xs[i], wb[i % len(wb)], routes[i][0], outs[i]), n_sets, DEV,
                            quick).median_us
                    except Exception as exc:
                        row["grouped_mm_error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                    nt = max(1, round(touched))
                    views = [wb[i % len(wb)][:nt].reshape(nt * prob.n, prob.k) for i in range(n_sets)]
                    xg = [x[:1] for x in xs]
                    row["gemv_bf16_us"] = timing.time_calls(lambda i: torch.matmul(xg[i], views[i].T), n_sets, DEV,
                                                           quick).median_us
                    row["gemv_bf16_bytes"] = nt * prob.n * prob.k * 2
                res["rows"].append(row)
                print(f"{rname:7s} {name:10s} M={m:5d} best {row.get('best_us', float('nan')):8.1f} us "
                      f"default {row['default_us'] or float('nan'):8.1f} old {row.get('moe_w4a16_default_us', float('nan')):8.1f} "
                      f"floor {row['floor_us']:7.1f} gmm {row.get('grouped_mm_bf16_us', float('nan')):8.1f} "
                      f"gemv {row.get('gemv_bf16_us', float('nan')):7.1f} align {row.get('align_us', float('nan')):5.1f}",
                      flush=True)
            save()
    res["elapsed_s"] = round(time.time() - t_start, 1)
    save()
    print(f"done in {res['elapsed_s']} s -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
