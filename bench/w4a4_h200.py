"""W4A4 (`w4a4_dot_scaled`) timings on a CUDA GPU, issue #4 item 3: quantize + GEMM and GEMM alone.

    python3 bench/w4a4_h200.py run --out DIR                          # on the GPU machine
    python3 bench/w4a4_h200.py render DIR/w4a4.json docs/triton-w4a4-h200.md   # anywhere

For GLM-5's TP8 dense shapes as MXFP4 × MXFP4 problems (NVFP4 W4A4 does not compile on sm90 with
Triton 3.6: compat.py) and buckets 1 … 8192: every config of an evenly spaced sample of the
member's kept space (plus its default) is checked against the float64 reference (activations
quantized by the torch reference, NaN-poisoned output), then timed as a whole call (our
activation quantizer + the dot_scaled GEMM). The best ("tuned") and the default are then timed
three ways: whole call, GEMM alone on activations quantized beforehand, quantizer alone. Every
column uses autotune.engine.timing.time_calls (graph replay, input sets rotated past twice the L2).
For scale, the fused W4A16 default and cuBLAS bf16 on the same weights dequantized beforehand.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.core.problem import Problem  # noqa: E402

SHAPES = [(512, 6144), (3072, 6144), (6144, 256), (6144, 1536)]   # GLM-5 TP8 dense (n, k)
BUCKETS = [1, 16, 128, 1024, 4096, 8192]
SAMPLE = 12
#: W4A4_SMOKE=1: a tiny CPU run under TRITON_INTERPRET=1, to test this script without a GPU
SMOKE = os.environ.get("W4A4_SMOKE") == "1"
if SMOKE:
    SHAPES, BUCKETS, SAMPLE = [(64, 256)], [1, 8], 2
DEV = "cpu" if SMOKE else "cuda"


def run(out: Path) -> int:
    import torch

    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.tactics import registry
    from autotune.core.arch import detect
    from autotune.core.arch import ARCHS
    fam, arch = registry.get("triton"), (ARCHS["cpu"] if SMOKE else detect())
    timer = timing.TimerConfig(budget_s=0.05, max_reps=30)
    quick = timing.TimerConfig(budget_s=0.01, max_reps=10)
    res = {"gpu": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": __import__("triton").__version__, "arch": arch.name, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "rows": []}
    for n, k in SHAPES:
        p = Problem.dense(n, k, "mxfp4", a_fmt="mxfp4")
        w16 = Problem.dense(n, k, "mxfp4")
        kept = [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok]
        step = max(1, len(kept) // SAMPLE)
        cands = [fam.default(p, arch)] + [t for t in kept[::step] if t != fam.default(p, arch)][:SAMPLE]
        for m in BUCKETS:
            n_sets = timing.sets_for_cold_l2(inputs.set_bytes(p, m), DEV)
            sets = inputs.make_inputs(p, m, DEV, seed=m + n, n_sets=n_sets)
            ref = inputs.reference(p, sets[0])
            outs = [inputs.torch_empty_out(p, m, s) for s in sets]
            row = {"n": n, "k": k, "m": m, "sets": n_sets, "configs": {}, "errors": {}}
            kernels = {}
            for t in cands:
                try:
                    kern = fam.build(p, t, DEV)
                    err = inputs.check(p, kern, sets[0], ref)
                    tm = timing.time_calls(lambda i: kern(*sets[i].args(), out=outs[i]), n_sets, DEV, quick)
                    row["configs"][t.id] = {"params": t.params, "us": tm.median_us, "rel_err": err}
                    kernels[t.id] = kern
                except Exception as e:   # recorded, never a winner
                    row["errors"][t.id] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            best = min(row["configs"], key=lambda i: row["configs"][i]["us"])
            d = fam.default(p, arch).id
            for label, tid in (("tuned", best), ("default", d)):
                if tid not in kernels:
                    continue
                kern = kernels[tid]
                # pre-quantized activations per set (copies: the launcher reuses its buffers)
                pre = []
                for s in sets:
                    q, sc = kern.quantize(s.x, s.w)
                    pre.append((q.clone(), sc.clone()))
                whole = timing.time_calls(lambda i: kern(*sets[i].args(), out=outs[i]), n_sets, DEV, timer)
                gemm = timing.time_calls(lambda i: kern.gemm(pre[i][0], pre[i][1], sets[i].w, outs[i]), n_sets, DEV, timer)
                quant = timing.time_calls(lambda i: kern.quantize(sets[i].x, sets[i].w), n_sets, DEV, timer)
                row[label] = {"tactic": tid, "params": row["configs"][tid]["params"], "whole_us": whole.median_us,
                              "gemm_us": gemm.median_us, "quant_us": quant.median_us}
            # W4A16 fused default (bf16 activations, same weights) and cuBLAS bf16, for scale
            s16 = [inputs.InputSet(s.x, s.w) for s in sets]
            k16 = fam.build(w16, fam.default(w16, arch), DEV)
            inputs.check(w16, k16, s16[0], inputs.reference(w16, s16[0]))
            row["w4a16_default_us"] = timing.time_calls(lambda i: k16(*s16[i].args(), out=outs[i]), n_sets, DEV, timer).median_us
            wd = [s.w.dequantize(torch.bfloat16) for s in sets]
            row["cublas_bf16_us"] = timing.time_calls(lambda i: torch.matmul(sets[i].x, wd[i].T, out=outs[i]), n_sets, DEV,
                                                     timer).median_us
            res["rows"].append(row)
            print(f"n{n} k{k} m={m}: tuned {row['tuned']['whole_us']:.1f} us (gemm {row['tuned']['gemm_us']:.1f}, quant "
                  f"{row['tuned']['quant_us']:.1f}), default {row.get('default', {}).get('whole_us', float('nan')):.1f}, "
                  f"w4a16 {row['w4a16_default_us']:.1f}, cublas {row['cublas_bf16_us']:.1f}; {len(row['errors'])} errors",
                  flush=True)
            del sets, outs, ref, wd, s16, kernels
            if not SMOKE:
                torch.cuda.empty_cache()
    out.mkdir(parents=True, exist_ok=True)
    (out / "w4a4.json").write_text(json.dumps(res, indent=1))
    return 0


def render(src: str, dst: str) -> int:
    r = json.loads(Path(src).read_text())
    f = lambda x: f"{x:.1f}"  # noqa: E731
    lines = [
        "# W4A4 (`w4a4_dot_scaled`) on the H200: activation quantization + GEMM, and each alone",
        "",
        f"**Command:** `python3 bench/w4a4_h200.py run --out $OUT` (device call), rendered by "
        f"`python3 bench/w4a4_h200.py render`. **When:** {r['when']}. **Where:** {r['gpu']} ({r['arch']}), "
        f"torch {r['torch']}, Triton {r['triton']}.",
        "",
        "GLM-5 TP8 dense shapes as **MXFP4 × MXFP4** problems: NVFP4 W4A4 does not compile on sm90 with "
        "Triton 3.6 (`tactics/triton_fp4/compat.py`), so the H200 cannot time it. SM90 has no FP4 tensor "
        "cores: Triton lowers `tl.dot_scaled` there by upcasting both operands to bf16 (wgmma), so these "
        "numbers measure the emulated path, not the native `mxf4nvf4` MMA of SM100/SM120. *tuned* = the "
        f"fastest whole call among the default and an evenly spaced sample of {SAMPLE} kept configs, every "
        "one checked against float64 first; *whole* = quantize + GEMM (what a call of the member does and "
        "what the search times); *GEMM* = the dot_scaled kernel alone on activations quantized beforehand; "
        "*quant* = our activation quantizer alone. All times µs, `autotune.engine.timing.time_calls` (CUDA-graph "
        "replay, input sets rotated past twice the L2, median). For scale: the fused W4A16 default on the "
        "same weights with bf16 activations, and cuBLAS bf16 on the weights dequantized beforehand.",
        "",
        "| N | K | M | tuned whole | tuned GEMM | quant | default whole | W4A16 default | cuBLAS bf16 | tuned config |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in r["rows"]:
        t, d = row["tuned"], row.get("default", {})
        p = t["params"]
        cfg = f"{p['block_m']}×{p['block_n']}×{p['block_k']} w{p['num_warps']} s{p['num_stages']}"
        lines.append(f"| {row['n']} | {row['k']} | {row['m']} | {f(t['whole_us'])} | {f(t['gemm_us'])} | {f(t['quant_us'])} | "
                     f"{f(d['whole_us']) if d else '-'} | {f(row['w4a16_default_us'])} | {f(row['cublas_bf16_us'])} | {cfg} |")
    errs = sum(len(row["errors"]) for row in r["rows"])
    checked = sum(len(row["configs"]) + len(row["errors"]) for row in r["rows"])

    def span(xs):
        return f"{min(xs):.2f}–{max(xs):.2f}"
    rows = r["rows"]
    lines += ["", f"Over all rows: tuned whole call / W4A16 default {span([x['tuned']['whole_us'] / x['w4a16_default_us'] for x in rows])}×; "
              f"/ cuBLAS bf16 {span([x['tuned']['whole_us'] / x['cublas_bf16_us'] for x in rows])}×; quantizer share of the "
              f"tuned whole call {span([x['tuned']['quant_us'] / x['tuned']['whole_us'] for x in rows])}.",
              "", f"Configs that failed their check or build: {errs} of {checked}."]
    for row in r["rows"]:
        for tid, e in row["errors"].items():
            lines.append(f"* n{row['n']} k{row['k']} m={row['m']} {tid}: {e}")
    Path(dst).write_text("\n".join(lines) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", default=os.environ.get("OUT", "."))
    d = sub.add_parser("render")
    d.add_argument("src")
    d.add_argument("dst")
    a = ap.parse_args()
    return run(Path(a.out)) if a.cmd == "run" else render(a.src, a.dst)


if __name__ == "__main__":
    sys.exit(main())
