"""GLM-5 TP8 on the H200: the searched MoE winners checked against float64 through
dispatch and FP4MoE, and the MLP decode step — every FP4 GEMM of the 78 layers — beside bf16.

    python3 bench/moe_mlp_step_h200.py --moe-cache MOE.db --dense-cache DENSE.db[.xz] --out DIR
    python3 bench/moe_mlp_step_h200.py --render docs/data/moe-mlp-step-h200.json   # docs tables
    MOE_STEP_SMOKE=1 python3 bench/moe_mlp_step_h200.py --out DIR                   # CPU smoke test

1. Dispatch check: each routed problem of `autotune search --model glm5 --tp 8 --only grouped_moe
   --fused-moe` (w13, w13+swiglu, w2, w2+reduce) at every bucket 1 … 1024: the dispatched launcher
   (Dispatcher.bind) on fresh inputs against float64 (core.inputs.check: NaN-poisoned output).
2. FP4MoE check: the whole block (fused and unfused), NVFP4 experts with separate gate and up
   global scales, an expert_map of 288 global ids of which 32 are not on this rank (-1), skewed
   routing over the global ids, against a float64 block built from the unfolded weights; and the
   number of moe_align launches per forward (one per layer at most).
3. The MLP decode step at M = 1, 4, 16, 64 (autotune.engine.timing.time_calls: CUDA-graph replay,
   one call per input set, sets with distinct weights rotated past ≥ 2× the L2, medians):
   3 dense layers (gate_up N=3072 K=6144, down N=6144 K=1536) + 75 MoE layers (shared gate_up
   N=512 K=6144, shared down N=6144 K=256, and the routed block: FP4MoE fused, alignment inside).
   FP4 columns use the dispatched winners (dense ones from DENSE.db, the full search's cache);
   bf16: torch.matmul, and for the routed block torch `_grouped_mm` with the routing sorted by
   torch ops, SiLU·up and the weighted top_k sum; the floor: FP4 weight + scale bytes of what is
   touched (the experts hit, averaged over the sets) + activations + outputs, at the copy rate
   measured in the same run. Shared-expert SiLU is not a GEMM and is in no column.
4. In the same run: the shared expert folded into the routed calls (FP4MoE(shared=...), the
   `e257:top9` problems of `--fold-shared`) against routed + shared gate_up + shared down, and
   the fused block under uniform routing beside bf16 and its floor. The folded
   forwards are also checked against float64 (routed block + the shared MLP).
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import existing  # noqa: E402

from autotune.core.problem import Problem  # noqa: E402

SMOKE = os.environ.get("MOE_STEP_SMOKE") == "1"
DEV = "cpu" if SMOKE else "cuda"
E, TOP_K, H, I = (256, 8, 6144, 256) if not SMOKE else (6, 2, 128, 64)
E_GLOBAL = E + (32 if not SMOKE else 2)
DENSE = {"gate_up": Problem.dense(3072, 6144), "down": Problem.dense(6144, 1536),
         "shared_gate_up": Problem.dense(512, 6144), "shared_down": Problem.dense(6144, 256)} if not SMOKE else \
    {"gate_up": Problem.dense(128, 128), "down": Problem.dense(128, 64), "shared_gate_up": Problem.dense(128, 128),
     "shared_down": Problem.dense(128, 64)}
W13, W2 = Problem.moe(2 * I, H, E, TOP_K), Problem.moe(H, I, E, TOP_K)
MOE = {"w13": W13, "w13_swiglu": W13.variant("swiglu"), "w2": W2, "w2_reduce": W2.variant("reduce")}
BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 768, 1024] if not SMOKE else [1, 3]
STEP_M = [1, 4, 16, 64] if not SMOKE else [1, 3]
LAYERS = {"dense": 3, "moe": 75}
SKEW = 1.2


def _dispatcher(path):
    from autotune.runtime.dispatch import Dispatcher
    return Dispatcher(path, record_misses=False, warn=False)


def _rung(d, p, m) -> dict:
    rung, t = d.rung_for(p, m)
    return {"rung": rung, "family": t.family, "params": t.params}


def check_dispatch(d) -> list[dict]:
    import torch
    from autotune.core import inputs
    rows = []
    for name, p in MOE.items():
        w = inputs.seeded_weight(p, DEV, seed=11)
        bound = d.bind(p, w)
        for m in BUCKETS:
            s = inputs.make_inputs(p, m, DEV, seed=100 + m, weights=[w])[0]
            launch = bound.launcher(m)
            try:
                err = inputs.check(p, lambda x, w_, ids, tw, out: launch(x, ids, tw, out=out), s,
                                   inputs.reference(p, s))
                rows.append(dict(problem=name, m=m, err=err, **_rung(d, p, m)))
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                rows.append(dict(problem=name, m=m, err=None, error=f"{type(e).__name__}: {e}"[:300], **_rung(d, p, m)))
            del s
        del bound, w
        if DEV == "cuda":
            torch.cuda.empty_cache()
    return rows


def random_block(seed: int):
    """(gate, up, down) FP4 weights with random codes and scales; gate and up global scales differ."""
    import torch
    from autotune.core import inputs
    from autotune.core.formats import FP4Weight
    g = torch.Generator(device=DEV).manual_seed(seed)
    gate = inputs.random_weight(Problem.moe(I, H, E, TOP_K), DEV, g)
    up = inputs.random_weight(Problem.moe(I, H, E, TOP_K), DEV, g)
    down = inputs.random_weight(W2, DEV, g)
    us = (torch.rand(E, generator=g, device=DEV) * 3 + 0.5) / 64          # up ≠ gate (1/64)
    ds = (torch.rand(E, generator=g, device=DEV) + 0.5) / 64
    return gate, FP4Weight(up.packed, up.scales, us.float(), "nvfp4"), FP4Weight(down.packed, down.scales, ds.float(), "nvfp4")


def random_shared(seed: int):
    """The shared expert as 2-D FP4 weights gate [I, H], up [I, H], down [H, I]; up's scale ≠ gate's."""
    import torch
    from autotune.core import inputs
    from autotune.core.formats import FP4Weight
    g = torch.Generator(device=DEV).manual_seed(seed)
    gate, up = (inputs.random_weight(Problem.dense(I, H), DEV, g) for _ in range(2))
    down = inputs.random_weight(Problem.dense(H, I), DEV, g)
    return gate, FP4Weight(up.packed, up.scales, up.global_scale * 2.5, "nvfp4"), down


def make_block(gate, up, down, d, fused: bool, expert_map=None, shared=None):
    from autotune.runtime.moe import FP4MoE, _stack13
    fold = None if shared is None else (_stack13(shared[0], shared[1]), shared[2], shared[1].global_scale)
    return FP4MoE(_stack13(gate, up), down, TOP_K, up_scale=up.global_scale, expert_map=expert_map,
                  fused=fused, dispatcher=d, shared=fold, fold_shared=fold is not None)


def shared_reference(x, gate, up, down):
    import torch
    xd = x.double()
    h = torch.nn.functional.silu(xd @ gate.dequantize(torch.float64).T) * (xd @ up.dequantize(torch.float64).T)
    return h @ down.dequantize(torch.float64).T


def block_reference(x, ids_local, tw, gate, up, down):
    import torch
    xd = x.double()
    y = torch.zeros(x.shape[0], H, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids_local).tolist():
        if e < 0:
            continue
        rows, slots = torch.nonzero(ids_local == e, as_tuple=True)
        hg = xd[rows] @ gate.expert(e).dequantize(torch.float64).T
        hu = xd[rows] @ up.expert(e).dequantize(torch.float64).T
        h = torch.nn.functional.silu(hg) * hu
        y.index_add_(0, rows, (h @ down.expert(e).dequantize(torch.float64).T) * tw[rows, slots, None].double())
    return y


def routing(m, experts, seed, skew=SKEW):
    import torch
    from autotune.core.inputs import routing as draw
    ids, tw = draw(m, experts, TOP_K, torch.Generator().manual_seed(seed), skew=skew)
    return ids.to(DEV), tw.to(DEV)


def check_block(d) -> list[dict]:
    import torch
    from autotune.tactics.triton_fp4 import moe_align
    gate, up, down = random_block(7)
    perm = torch.randperm(E_GLOBAL, generator=torch.Generator().manual_seed(3))
    emap = torch.full((E_GLOBAL,), -1, dtype=torch.int32)
    emap[perm[:E]] = torch.arange(E, dtype=torch.int32)
    calls = []
    real = moe_align.Aligner.__call__
    moe_align.Aligner.__call__ = lambda self, ids: (calls.append(1), real(self, ids))[1]
    rows = []
    shared = random_shared(8)
    try:
        for fused, folded in ((True, False), (False, False), (True, True)):
            blk = make_block(gate, up, down, d, fused, emap.to(DEV), shared if folded else None)
            for m in BUCKETS:
                ids, tw = routing(m, E_GLOBAL, 500 + m)
                x = torch.randn(m, H, device=DEV).to(torch.bfloat16)
                calls.clear()
                y = blk(x, ids, tw)
                aligns = len(calls)
                local = blk.local_ids(ids)
                ref = block_reference(x, local, tw, gate, up, down)
                if folded:
                    ref += shared_reference(x, *shared)
                err = float((y.double() - ref).norm() / ref.norm())
                rows.append(dict(fused=fused, folded=folded, m=m, err=err, aligns=aligns,
                                 off_rank=int((local < 0).sum()),
                                 nan=int(torch.isnan(y).sum()), w13=_rung(d, blk.problem13, m),
                                 w2=_rung(d, blk.problem2, m)))
            del blk
    finally:
        moe_align.Aligner.__call__ = real
    return rows


def copy_rate() -> float:
    if SMOKE:
        return 1e10
    from moe_decode_h200 import copy_rate as rate      # the same measurement as the kernel bench
    return rate()


def fp4_bytes(p: Problem, experts: float = 1.0) -> float:
    return experts * p.n * (p.k // 2 + p.k // p.block)


def step(dd, dm, rate: float) -> list[dict]:
    """Per M: one layer of each kind (FP4 winners, bf16, floor) in µs, and the 78-layer sum."""
    import torch
    from autotune.core import inputs
    from autotune.engine.timing import TimerConfig, sets_for_cold_l2, time_calls
    cfg = TimerConfig(budget_s=0.3 if not SMOKE else 0.01)
    rows = []
    dense_w = {k: [inputs.seeded_weight(p, DEV, seed=20 + i) for i in range(sets_for_cold_l2(int(fp4_bytes(p)), DEV, 64))]
               for k, p in DENSE.items()}
    dense_b = {k: [dd.bind(DENSE[k], w) for w in ws] for k, ws in dense_w.items()}
    weights = [random_block(40 + i) for i in range(6 if not SMOKE else 1)]     # ≥ 2× L2 of touched experts at M = 1
    blocks = [make_block(g, u, dn, dm, True) for g, u, dn in weights]
    unfused = [make_block(g, u, dn, dm, False) for g, u, dn in weights]
    folded = [make_block(g, u, dn, dm, True, shared=random_shared(60 + i)) for i, (g, u, dn) in enumerate(weights)]
    bf = [(b.w13.dequantize(torch.bfloat16), b.w2.dequantize(torch.bfloat16)) for b in blocks[:3]]
    for m in STEP_M:
        r = {"m": m}
        for k, p in DENSE.items():
            ws = dense_w[k]
            bts = dense_b[k]
            xs = [torch.randn(m, p.k, device=DEV).to(torch.bfloat16) for _ in ws]
            outs = [torch.empty(m, p.n, dtype=torch.bfloat16, device=DEV) for _ in ws]
            r[f"{k}_fp4"] = time_calls(lambda i: bts[i](xs[i], out=outs[i]), len(ws), DEV, cfg).median_us
            r[f"{k}_tactic"] = _rung(dd, p, m)
            wb = [w.dequantize(torch.bfloat16) for w in ws[:max(1, sets_for_cold_l2(p.n * p.k * 2, DEV, 64))]]
            r[f"{k}_bf16"] = time_calls(lambda i: torch.matmul(xs[i], wb[i % len(wb)].T, out=outs[i]), len(ws), DEV,
                                        cfg).median_us
            r[f"{k}_floor"] = (fp4_bytes(p) + 2 * m * (p.k + p.n)) / rate * 1e6
            del wb
        n_sets = 12
        rt = [routing(m, E, 900 + 31 * m + i) for i in range(n_sets)]
        xs = [torch.randn(m, H, device=DEV).to(torch.bfloat16) for _ in range(n_sets)]
        for b in blocks + unfused + folded:
            b.warmup([m])
        r["routed_fp4"] = time_calls(lambda i: blocks[i % len(blocks)](xs[i], *rt[i]), n_sets, DEV, cfg).median_us
        r["routed_fp4_unfused"] = time_calls(lambda i: unfused[i % len(unfused)](xs[i], *rt[i]), n_sets, DEV,
                                             cfg).median_us
        r["routed_fp4_folded"] = time_calls(lambda i: folded[i % len(folded)](xs[i], *rt[i]), n_sets, DEV,
                                            cfg).median_us
        r["routed_tactics"] = {"w13": _rung(dm, blocks[0].problem13, m), "w2": _rung(dm, blocks[0].problem2, m),
                               "w13_unfused": _rung(dm, unfused[0].problem13, m),
                               "w2_unfused": _rung(dm, unfused[0].problem2, m),
                               "w13_folded": _rung(dm, folded[0].problem13, m),
                               "w2_folded": _rung(dm, folded[0].problem2, m)}
        ru = [routing(m, E, 1900 + 31 * m + i, skew=0.0) for i in range(n_sets)]     # uniform over the experts
        r["routed_fp4_uniform"] = time_calls(lambda i: blocks[i % len(blocks)](xs[i], *ru[i]), n_sets, DEV,
                                             cfg).median_us
        r["routed_bf16_uniform"] = time_calls(lambda i: bf16_block(xs[i], *bf[i % len(bf)], *ru[i]), n_sets, DEV,
                                              cfg).median_us
        touched_u = sum(len(torch.unique(ids)) for ids, _ in ru) / n_sets
        r["experts_touched_uniform"] = touched_u
        r["routed_floor_uniform"] = (fp4_bytes(W13, touched_u) + fp4_bytes(W2, touched_u) + 2 * m * 2 * H) / rate * 1e6
        r["routed_bf16"] = time_calls(lambda i: bf16_block(xs[i], *bf[i % len(bf)], *rt[i]), n_sets, DEV, cfg).median_us
        touched = sum(len(torch.unique(ids)) for ids, _ in rt) / n_sets
        r["experts_touched"] = touched
        r["routed_floor"] = (fp4_bytes(W13, touched) + fp4_bytes(W2, touched) + 2 * m * 2 * H) / rate * 1e6
        for col in ("fp4", "bf16", "floor"):
            r[f"step_{col}_us"] = (LAYERS["dense"] * (r[f"gate_up_{col}"] + r[f"down_{col}"])
                                   + LAYERS["moe"] * (r[f"shared_gate_up_{col}"] + r[f"shared_down_{col}"]
                                                      + r[f"routed_{col}"]))
        r["step_fp4_folded_us"] = r["step_fp4_us"] + LAYERS["moe"] * (
            r["routed_fp4_folded"] - r["routed_fp4"] - r["shared_gate_up_fp4"] - r["shared_down_fp4"])
        rows.append(r)
        print(json.dumps({k: v for k, v in r.items() if not k.endswith("tactic") and k != "routed_tactics"}), flush=True)
    return rows


def bf16_block(x, w13, w2, ids, tw):
    """torch bf16 MoE: pairs sorted by expert with torch ops, _grouped_mm, SiLU·up, _grouped_mm, weighted sum."""
    import torch
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(E, dtype=torch.int32, device=x.device).scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    if SMOKE:       # no _grouped_mm on the CPU: the same sums per pair
        y13 = torch.einsum("pk,pnk->pn", x[order // TOP_K].float(), w13[flat[order]].float()).to(torch.bfloat16)
    else:
        y13 = torch._grouped_mm(x[order // TOP_K], w13.transpose(1, 2), offs=offs)
    h = torch.nn.functional.silu(y13[:, :I]) * y13[:, I:]
    if SMOKE:
        y2 = torch.einsum("pk,pnk->pn", h.float(), w2[flat[order]].float()).to(torch.bfloat16)
    else:
        y2 = torch._grouped_mm(h, w2.transpose(1, 2), offs=offs)
    y = torch.zeros(ids.numel(), H, dtype=torch.float32, device=x.device)
    y.index_copy_(0, order, y2.float() * tw.reshape(-1)[order, None])
    return y.view(-1, TOP_K, H).sum(1).to(torch.bfloat16)


def render(path: Path) -> str:
    r = json.loads(path.read_text())
    out = [f"{r['gpu']}, torch {r['torch']}, Triton {r['triton']}, {r['when']}; copy rate "
           f"{r['copy_Bps'] / 1e12:.2f} TB/s (read + write).", ""]
    bad = [x for x in r["dispatch"] if x["err"] is None or x["err"] > 1e-2]
    errs = [x["err"] for x in r["dispatch"] if x["err"] is not None]
    kinds = sorted({f"{x['family']}/{x['params'].get('kernel', '-')}" for x in r["dispatch"]})
    out.append(f"**Dispatch vs float64**: {len(r['dispatch'])} (problem, M) launches, {len(bad)} failed, "
               f"relative error {min(errs):.2e}–{max(errs):.2e}; rungs: "
               + ", ".join(f"{k} {sum(x['rung'] == k for x in r['dispatch'])}" for k in ("exact", "nearest", "default"))
               + f"; kernels: {', '.join(kinds)}.")
    b = r["block"]
    bad = [x for x in b if x["err"] > 1e-2 or x["nan"]]
    out.append(f"**FP4MoE vs float64** (expert_map {E_GLOBAL} → {E}, gate ≠ up scales): {len(b)} forwards "
               f"({'fused, unfused and shared folded' if any(x.get('folded') for x in b) else 'fused and unfused'}, "
               f"M = {BUCKETS[0]}…{BUCKETS[-1]}), {len(bad)} failed, relative error "
               f"{min(x['err'] for x in b):.2e}–{max(x['err'] for x in b):.2e}; moe_align launches per forward: "
               f"{sorted({x['aligns'] for x in b})}; off-rank slots per forward up to {max(x['off_rank'] for x in b)}.")
    out += ["", "| M | dense gate_up | dense down | shared gate_up | shared down | routed FP4MoE (fused) | "
            "routed unfused | **step FP4** | **step bf16** | **step floor** | FP4 ÷ floor | bf16 ÷ FP4 |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in r["step"]:
        out.append(f"| {x['m']} | {x['gate_up_fp4']:.1f} | {x['down_fp4']:.1f} | {x['shared_gate_up_fp4']:.1f} | "
                   f"{x['shared_down_fp4']:.1f} | {x['routed_fp4']:.1f} | {x['routed_fp4_unfused']:.1f} | "
                   f"**{x['step_fp4_us'] / 1e3:.2f} ms** | {x['step_bf16_us'] / 1e3:.2f} ms | "
                   f"{x['step_floor_us'] / 1e3:.2f} ms | {x['step_fp4_us'] / x['step_floor_us']:.1f}× | "
                   f"{x['step_bf16_us'] / x['step_fp4_us']:.2f}× |")
    out += ["", "Per layer, bf16 (µs): " + "; ".join(
        f"M = {x['m']}: gate_up {x['gate_up_bf16']:.1f}, down {x['down_bf16']:.1f}, shared gate_up "
        f"{x['shared_gate_up_bf16']:.1f}, shared down {x['shared_down_bf16']:.1f}, routed {x['routed_bf16']:.1f} "
        f"(floor {x['routed_floor']:.1f}, {x['experts_touched']:.1f} experts)" for x in r["step"])]
    if "routed_fp4_folded" in r["step"][0]:
        out += ["", "| M | routed + shared gate_up + shared down | routed, shared folded in | **step FP4** | "
                "**step FP4, folded** | routed FP4, uniform routing | bf16, uniform | floor, uniform (experts) |",
                "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for x in r["step"]:
            apart = x["routed_fp4"] + x["shared_gate_up_fp4"] + x["shared_down_fp4"]
            out.append(f"| {x['m']} | {apart:.1f} | {x['routed_fp4_folded']:.1f} | {x['step_fp4_us'] / 1e3:.2f} ms | "
                       f"{x['step_fp4_folded_us'] / 1e3:.2f} ms | {x['routed_fp4_uniform']:.1f} | "
                       f"{x['routed_bf16_uniform']:.1f} | {x['routed_floor_uniform']:.1f} "
                       f"({x['experts_touched_uniform']:.1f}) |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--moe-cache")
    ap.add_argument("--dense-cache")
    ap.add_argument("--out")
    ap.add_argument("--render", type=existing, help="print the markdown tables of a result JSON and exit")
    a = ap.parse_args()
    if a.render:
        print(render(Path(a.render)))
        return 0
    import torch
    import triton
    tmp = tempfile.mkdtemp()
    dense = a.dense_cache
    if dense and dense.endswith(".xz"):
        dense = os.path.join(tmp, "dense.db")
        with lzma.open(a.dense_cache) as f, open(dense, "wb") as g:
            shutil.copyfileobj(f, g)
    moe = a.moe_cache or os.path.join(tmp, "none.db")
    dm, dd = _dispatcher(moe), _dispatcher(dense or moe)
    t0 = time.time()
    res = {"gpu": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__,
           "triton": triton.__version__, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "copy_Bps": copy_rate()}
    res["dispatch"] = check_dispatch(dm)
    print(f"dispatch checked in {time.time() - t0:.0f} s", flush=True)
    res["block"] = check_block(dm)
    print(f"block checked in {time.time() - t0:.0f} s", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe-mlp-step.json").write_text(json.dumps(res, indent=1))
    res["step"] = step(dd, dm, res["copy_Bps"])
    (out / "moe-mlp-step.json").write_text(json.dumps(res, indent=1))
    print(f"done in {time.time() - t0:.0f} s", flush=True)
    print(render(out / "moe-mlp-step.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
