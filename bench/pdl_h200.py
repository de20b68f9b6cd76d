"""Programmatic dependent launch, measured with and without (issue #26 item 7).

    python3 bench/pdl_h200.py [--cache DB] [--layers 24] [--ms 1,4,16] [--json out.json]
    python3 bench/pdl_h200.py --plan          # the chain and the two forms, without a GPU

GLM-5 TP8's MoE layer as the cuda family runs it — routed w13:swiglu -> w2:reduce (moe_mma), the
shared expert's gate_up:swiglu -> down (w4a16_mma), one torch add — `--layers` times, each layer its
own random NVFP4 weights (≈ 0.9 GB a layer, so a replay finds nothing in the L2), an RMS norm between
layers (as a decoder's attention block sits there: it keeps the chain finite and breaks the PDL chain
as a real step does), captured as ONE CUDA graph per M and form. The two forms: PDL off / on
(AUTOTUNE_PDL, read when a launcher makes its first plan). (The 2026-12-03 run also timed moe_mma's
weight prologue before its rank scan, `EARLY`: 0-9 % slower, since taken out of the kernel; its
numbers are in docs/data/pdl-h200.json.) Tactics: the cache's winners per (problem, M) when --cache
is given, else the family's defaults. Per M: the median of 20 replays (uniform top-8 routing, fresh
before each replay, outside the timing), µs per layer, and the outputs of both forms checked equal
bit for bit.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autotune.core.problem import Problem  # noqa: E402

E, TOP_K, H, I = 256, 8, 6144, 256
PROBS = {"w13": Problem.moe(2 * I, H, E, TOP_K, epilogue="swiglu"), "w2": Problem.moe(H, I, E, TOP_K, epilogue="reduce"),
         "gate_up": Problem.dense(2 * I, H, epilogue="swiglu"), "down": Problem.dense(H, I)}
FORMS = (False, True)              # PDL off, on


def tactic_for(d, fam, arch, p, m):
    if d is not None:
        got = d.rung_for(p, m)
        if got is not None and got[1].family == "cuda":
            return got[1]
    return fam.default(p, arch)


def kernels(fam, tactics: dict, pdl: bool) -> dict:
    """name -> built kernel; PDL as the launchers' first plan finds AUTOTUNE_PDL."""
    os.environ["AUTOTUNE_PDL"] = "1" if pdl else "0"
    return {name: fam.build(p, tactics[name], "cuda") for name, p in PROBS.items()}


def layer(ks, w, x, ids, tw):
    r = ks["w2"](ks["w13"](x, w["w13"], ids, None), w["w2"], ids, tw)
    s = ks["down"](ks["gate_up"](x, w["gate_up"]), w["down"])
    return torch.nn.functional.rms_norm(r + s, (H,))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", help="a cache whose cuda winners serve (default: the family's defaults)")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--ms", default="1,4,16")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--json")
    ap.add_argument("--plan", action="store_true", help="print the chain and forms, run nothing")
    a = ap.parse_args()
    ms = [int(v) for v in a.ms.split(",")]
    if a.plan:
        print("per layer:", " -> ".join(p.key for p in PROBS.values()), "+ add + RMS norm")
        print("forms (pdl):", FORMS, "M:", ms, "layers:", a.layers)
        return 0
    import warnings

    from autotune.core import inputs
    from autotune.core.arch import detect
    from autotune.runtime.dispatch import Dispatcher
    from autotune.tactics import registry
    warnings.simplefilter("ignore")
    fam, arch = registry.get("cuda"), detect()
    d = Dispatcher(a.cache, record_misses=False, warn=False) if a.cache else None
    t0 = time.perf_counter()
    weights = [{n: fam.pack("cuda-mma-a-frag-v1", inputs.seeded_weight(p, "cuda", 100 * i + j))
                for j, (n, p) in enumerate(PROBS.items())} for i in range(a.layers)]
    torch.cuda.synchronize()
    doc = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "layers": a.layers,
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cache": a.cache,
           "pack_s": round(time.perf_counter() - t0, 1), "rows": []}
    gen = torch.Generator().manual_seed(0)
    for m in ms:
        tactics = {n: tactic_for(d, fam, arch, p, m) for n, p in PROBS.items()}
        x = (torch.randn(m, H, device="cuda") * 0.5).to(torch.bfloat16)
        ids = torch.empty(m, TOP_K, dtype=torch.int64, device="cuda")
        tw = torch.empty(m, TOP_K, dtype=torch.float32, device="cuda")
        outs, row = {}, {"m": m, "tactics": {n: t.id for n, t in tactics.items()}}
        for pdl in FORMS:
            ks = kernels(fam, tactics, pdl)

            def step():
                y = x
                for w in weights:
                    y = layer(ks, w, y, ids, tw)
                return y
            i0, w0 = inputs.routing(m, E, TOP_K, gen, skew=0.0)
            ids.copy_(i0), tw.copy_(w0)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                step()                                  # plans, scratch and cubins before capture
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                y = step()
            samples = []
            for _ in range(a.rounds):
                i0, w0 = inputs.routing(m, E, TOP_K, gen, skew=0.0)
                ids.copy_(i0), tw.copy_(w0)
                torch.cuda.synchronize()
                b0, b1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                b0.record()
                g.replay()
                b1.record()
                b1.synchronize()
                samples.append(b0.elapsed_time(b1) * 1e3)
            ids.copy_(inputs.routing(m, E, TOP_K, torch.Generator().manual_seed(m), skew=0.0)[0])
            tw.fill_(0.125)
            g.replay()
            outs[pdl] = y.clone()
            key = f"pdl={int(pdl)}"
            row[key] = {"step_us": statistics.median(samples), "per_layer_us": statistics.median(samples) / a.layers}
            print(m, key, f"{row[key]['step_us']:.1f} us, {row[key]['per_layer_us']:.2f} us/layer", flush=True)
            del g
            torch.cuda.synchronize()
        ref = outs[False]
        row["bitwise_equal"] = all(torch.equal(o, ref) for o in outs.values()) and bool(torch.isfinite(ref.float()).all())
        row["max_abs_diff"] = {f"pdl={int(k)}": float((o.float() - ref.float()).abs().max())
                               for k, o in outs.items()}
        print(m, "finite:", bool(torch.isfinite(ref.float()).all()), "max |diff| vs plain:", row["max_abs_diff"], flush=True)
        doc["rows"].append(row)
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1))
    print(f"| M | " + " | ".join(f"PDL {int(p)} µs/layer" for p in FORMS) + " | same bits |")
    print("|---:|" + "---:|" * len(FORMS) + "---|")
    for r in doc["rows"]:
        print(f"| {r['m']} | " + " | ".join(f"{r[f'pdl={int(p)}']['per_layer_us']:.2f}" for p in FORMS)
              + f" | {r['bitwise_equal']} |")
    return 0 if all(r["bitwise_equal"] for r in doc["rows"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
