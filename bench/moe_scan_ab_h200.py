"""A/B of moe_mma's direct-route id scan (fourteenth session, docs/moe-decode.md part 13): this tree's
kernel against another revision's text, config by config, on one H200 in one run.

    python3 bench/moe_scan_ab_h200.py --baseline DIR --cache CACHE [--out DIR]    # GPU
    python3 bench/moe_scan_ab_h200.py --plan [--cache CACHE]                       # CPU: what it would time

DIR holds the other revision's mma_common.cuh, moe_common.cuh and moe_mma.cu (e.g. `git show
f1b1cea:tactics/cuda/moe_mma.cu > DIR/moe_mma.cu`, and likewise the two headers). CACHE is a main
job's cache (.db or .db.xz): its moe_mma winner (else the family's default) at M = 16 and 64 for
GLM-5 TP8's routed (`e256:top8`) and folded (`e257:top9`, shared expert as each token's last slot)
w13:swiglu and w2:reduce, and for w2 also the one-warp config part 9's folded step served, are the
configs. Each runs the route the launcher picks (a
shared-slot call always the direct route — FP4MoE makes one only up to 256 pairs and concatenates and
aligns above, so the folded M = 64 rows time the scan at 576 pairs, not a served call; routed above 256
pairs the aligned route) and, where that is the aligned route, the direct route forced too. Routing is uniform (the search's draw). Per config:
both kernels' outputs on one input set compared bit for bit (the scan changes no row), then CUDA-graph
replays over a cold-L2 rotation, new and old interleaved three times, medians. Writes
DIR/moe_scan_ab.json; exit 1 if any output differs or any kernel fails.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("AUTOTUNE_PDL", "0")          # the search's trials time with PDL off

from autotune.core.problem import Problem  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402

E, TOP_K, H, I = 256, 8, 6144, 256
PROBLEMS = {"w13 routed": (Problem.moe(2 * I, H, E, TOP_K, epilogue="swiglu"), False),
            "w2 routed": (Problem.moe(H, I, E, TOP_K, epilogue="reduce"), False),
            "w13 folded": (Problem.moe(2 * I, H, E + 1, TOP_K + 1, epilogue="swiglu"), True),
            "w2 folded": (Problem.moe(H, I, E + 1, TOP_K + 1, epilogue="reduce"), True)}
MS = (16, 64)
#: w2's one-warp config the folded step served at M = 16 and 64 (part 9): its scan is the longest
W2_ONE_WARP = Tactic("cuda", kernel="moe_mma", warps_k=1, stages=2, tiles_n=4, m_tiles=1, split_k=1)
#: the same walking 4 N tiles per CTA (n_walk): its baseline is W2_ONE_WARP on this tree's text
W2_WALK = [Tactic("cuda", **{**W2_ONE_WARP.params, "n_walk": v}) for v in (2, 4, 8)]


def cache_tactics(path: Path | None) -> dict[tuple[str, int], Tactic]:
    """(problem key, bucket) → the cache's moe_mma winner there."""
    if path is None:
        return {}
    with tempfile.TemporaryDirectory() as d:
        db = path
        if path.suffix == ".xz":
            db = Path(d) / "c.db"
            db.write_bytes(lzma.decompress(path.read_bytes()))
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        rows = con.execute("select w.problem_key, w.bucket, t.params_json from winners w join tactics t "
                           "on t.id = w.tactic_id where w.family = 'cuda'").fetchall()
        con.close()
    out = {}
    for key, bucket, params in rows:
        t = Tactic.from_json(params)
        if t.params.get("kernel") == "moe_mma":
            out[(key, bucket)] = t
    return out


def jobs(won: dict) -> list[tuple[str, Problem, bool, int, Tactic]]:
    from autotune.core.arch import get_arch
    from autotune.tactics import registry
    fam, arch = registry.get("cuda"), get_arch("sm90")
    out = []
    for name, (prob, shared) in PROBLEMS.items():
        for m in MS:
            w = won.get((prob.key, m))
            ts = [w if w is not None else fam.default(prob, arch)]
            if prob.epilogue == "reduce" and W2_ONE_WARP not in ts:
                ts.append(W2_ONE_WARP)
            if prob.epilogue == "reduce":
                ts += W2_WALK
            out += [(name, prob, shared, m, t) for t in ts if t.params.get("kernel") == "moe_mma"]
    return out


def plan(won: dict) -> int:
    from autotune.tactics.cuda import moe as MOE
    for name, prob, shared, m, t in jobs(won):
        route = MOE.route(prob, MOE.config(prob, t), m, shared_slot=shared)[0]
        print(f"{name:10s} M={m:3d} {route:8s} {t.params}")
    return 0


def text_kernel(fam, prob: Problem, t: Tactic, txt: str):
    """The family's kernel for (prob, t), its function compiled from `txt` instead."""
    import cupy
    from autotune.tactics.cuda import build as B
    from autotune.tactics.cuda import pdl as P
    k = fam.build(prob, t, "cuda")
    run = k.launcher
    mod = cupy.RawModule(code=txt, options=("-default-device", *B.options(run.cfg)), name_expressions=None)
    fn = mod.get_function(B.kernel_name(run.cfg))
    run._fns[0] = fn
    r = P.runner(fn, txt, B.kernel_name(run.cfg), 0)
    n = len(P.signature(txt, B.kernel_name(run.cfg))) - 1
    # an older text may take fewer arguments (before the prefetch's four, appended last): pass its own
    run._runs[0] = lambda grid, block, args, stream: r(grid, block, args[:n], stream)
    return k


def run_gpu(out: Path, baseline: Path, won: dict) -> int:
    import torch
    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.tactics import registry
    from autotune.tactics.cuda import moe as MOE
    names = ["mma_common.cuh", "moe_common.cuh", "moe_mma.cu"]
    old_txt = "\n".join((baseline / n).read_text() for n in names)
    fam = registry.get("cuda")
    rows: list[dict] = []
    doc = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(),
           "torch": torch.__version__, "baseline": str(baseline), "routing": "uniform", "rows": rows}
    gen = torch.Generator().manual_seed(0)
    packs: dict = {}
    bad = 0
    for name, prob, shared, m, t in jobs(won):
        if prob.key not in packs:
            packs[prob.key] = [fam.pack("cuda-mma-a-frag-v1", inputs.seeded_weight(prob, "cuda", 60 + i)) for i in range(2)]
        cols = TOP_K                      # a folded call passes the routed ids only (shared_slot)
        lead = (m, TOP_K + 1 if shared else TOP_K) if prob.epilogue == "reduce" else (m,)
        per = prob.n * (prob.k // 2 + prob.k // prob.block)
        n = timing.sets_for_cold_l2(int(per * min(E, m * TOP_K)), "cuda", cap=24)
        sets = []
        for i in range(n):
            ids, tw = inputs.routing(m, E, cols, gen, skew=0.0)
            x = (torch.randn(*lead, prob.k, device="cuda") * 0.5).to(torch.bfloat16)
            sets.append((x, packs[prob.key][i % 2], ids.cuda(), tw.cuda() if prob.epilogue == "reduce" else None))
        kw = {"shared_slot": True} if shared else {}
        routes = [MOE.route(prob, MOE.config(prob, t), m, shared_slot=shared)[0]]
        if routes[0] == "aligned":
            routes.append("direct")
        for route in routes:
            row = {"variant": name, "m": m, "tactic": t.params, "route": route}
            saved = MOE.ALIGN_PAIRS
            try:
                if route == "direct" and not shared:
                    MOE.ALIGN_PAIRS = 1 << 20
                walk = t.params.get("n_walk", 1) > 1    # against one tile per CTA, this text
                base = Tactic("cuda", **{k: v for k, v in t.params.items() if k != "n_walk"})
                new = fam.build(prob, t, "cuda")
                old = fam.build(prob, base, "cuda") if walk else text_kernel(fam, prob, t, old_txt)
                row["baseline"] = "this text, n_walk 1" if walk else "the other revision's text"
                s0 = sets[0]
                a, b = new(s0[0], s0[1], s0[2], s0[3], **kw), old(s0[0], s0[1], s0[2], s0[3], **kw)
                torch.cuda.synchronize()
                row["bits_equal"] = bool(torch.equal(a, b))
                bad += not row["bits_equal"]
                cfg = timing.TimerConfig(min_reps=5, max_reps=20, budget_s=0.05)
                us = {"new": [], "old": []}
                for _ in range(3):
                    for lab, k in (("new", new), ("old", old)):
                        us[lab].append(timing.time_calls(lambda i, k=k: k(sets[i][0], sets[i][1], sets[i][2], sets[i][3], **kw),
                                                         n, "cuda", cfg).median_us)
                row["new_us"], row["old_us"] = statistics.median(us["new"]), statistics.median(us["old"])
            except Exception as exc:
                bad += 1
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            finally:
                MOE.ALIGN_PAIRS = saved
            rows.append(row)
            print(name, m, route, t.params, {k: v for k, v in row.items() if k.endswith("_us") or k in ("bits_equal", "error")},
                  flush=True)
            (out / "moe_scan_ab.json").write_text(json.dumps(doc, indent=1, default=str))
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="the other revision's texts (mma_common.cuh, moe_common.cuh, moe_mma.cu)")
    ap.add_argument("--cache", type=Path, help="a main job's cache (.db or .db.xz): its moe_mma winners")
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--plan", action="store_true", help="print the configs and routes (no GPU)")
    a = ap.parse_args()
    if a.cache is not None and not a.cache.is_file():
        print(f"moe_scan_ab: no cache {a.cache}", file=sys.stderr)
        return 1
    won = cache_tactics(a.cache)
    if a.plan:
        return plan(won)
    if a.baseline is None or not (a.baseline / "moe_mma.cu").is_file():
        print("moe_scan_ab: --baseline DIR with the other revision's moe_mma.cu and headers is required", file=sys.stderr)
        return 1
    a.out.mkdir(parents=True, exist_ok=True)
    return run_gpu(a.out, a.baseline, won)


if __name__ == "__main__":
    raise SystemExit(main())
