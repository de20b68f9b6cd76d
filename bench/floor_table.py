"""Each served kernel of the GLM-5 MLP step against its byte floor, from a main job's cache (no GPU).

    python3 bench/floor_table.py CACHE [--model glm5 --tp 8] [--m 1,4,16,64] [--rate BPS | --step-json F] [--json OUT]

CACHE is a main job's cache (.db, or .db.xz as committed under docs/data/). For each problem the
step serves — the folded form (dense SwiGLU MLPs, routed + shared experts as `e257:top9`) and the
apart form (`e256:top8` routed, the shared expert as dense problems) — and each M, it prints the
winner's worker time (cold L2, CUDA-graph replay, as the search timed it), the time its bytes take at
the copy rate, and the ratio. Bytes are autotune.report.traffic's (the report's): FP4 weight and scale
bytes of the experts the batch is expected to touch under the routing draw the cache was measured
with (its meta row; caches from before the draw was recorded were Zipf 1.2, autotune.core.measure)
and the bf16 rows in and out. The rate is the graph-replayed copy rate measured in a step run
(--step-json reads its `copy_Bps`; default: the 2026-12-05 H200 step run's) or --rate.

Below the kernels, each form's sum of parts over the step's layers against the same bytes: what the
step would take if its kernels ran back to back at their worker times, under the worker's routing
draw (bench/mlp_step_graph.py measures the real thing).
"""
from __future__ import annotations

import json
import lzma
import sqlite3
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autotune.core import measure  # noqa: E402
from bench import harness  # noqa: E402
from autotune.core.problem import Problem  # noqa: E402
from autotune.report.traffic import call_bytes, experts_touched  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEP_JSON = ROOT / "docs" / "data" / "2026-12-05-h200-7a8be9d-mlp-step-fold.json"


def step_problems(model: str, tp: int) -> dict[str, dict[str, tuple[Problem, int]]]:
    """form → kind → (the problem the step's layers serve, how many layers) for both forms: the step
    bench's layer kinds (bench/mlp_step_graph.plan), each form's problems as FP4MoE serves them."""
    from bench.mlp_step_graph import plan
    by: dict[str, tuple[Problem, int]] = plan(model, tp)
    (w13, n_moe), (w2, _) = by["w13"], by["w2"]
    dense = {"gate_up": (by["gate_up"][0].variant("swiglu"), by["gate_up"][1]), "down": by["down"]}
    # the shared expert as one expert and one slot more (autotune.models.layers' fold_shared)
    folded = {"w13": replace(w13, experts=w13.experts + 1, top_k=w13.top_k + 1).variant("swiglu"),
              "w2": replace(w2, experts=w2.experts + 1, top_k=w2.top_k + 1).variant("reduce")}
    return {
        "fold": {**dense, "w13": (folded["w13"], n_moe), "w2": (folded["w2"], n_moe)},
        "apart": {**dense, "shared_gate_up": (by["shared_gate_up"][0].variant("swiglu"), n_moe),
                  "shared_down": by["shared_down"], "w13": (w13.variant("swiglu"), n_moe),
                  "w2": (w2.variant("reduce"), n_moe)},
    }


def open_cache(path: Path, tmp: str) -> sqlite3.Connection:
    if path.suffix == ".xz":
        out = Path(tmp) / path.with_suffix("").name
        out.write_bytes(lzma.decompress(path.read_bytes()))
        path = out
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def winners(con: sqlite3.Connection, device: str | None) -> dict[tuple[str, int], tuple[str, str, float]]:
    devs = [d for (d,) in con.execute("select distinct device_key from winners")]
    if device is None and len(devs) != 1:
        raise SystemExit(f"floor_table: the cache holds winners of {len(devs)} devices {devs}: name one (--device-key)")
    dev = device or devs[0]
    return {(p, b): (f, t, us) for p, b, f, t, us in con.execute(
        "select problem_key, bucket, family, tactic_id, median_us from winners where device_key = ?", (dev,))}


def table(won: dict, forms: dict, ms: list[int], rate: float, skew: float) -> dict:
    kernels, sums = [], []
    for form, kinds in forms.items():
        for m in ms:
            part = floor = 0.0
            missing = []
            for kind, (p, layers) in kinds.items():
                w = won.get((p.key, m))
                fl = call_bytes(p, m, skew) / rate * 1e6
                floor += layers * fl
                if w is None:
                    missing.append(p.key)
                    continue
                part += layers * w[2]
                kernels.append({"form": form, "kind": kind, "problem": p.key, "m": m, "layers": layers,
                                "touched": round(experts_touched(p.experts, p.top_k, m, skew), 1), "floor_us": fl, "us": w[2],
                                "x_floor": w[2] / fl, "family": w[0], "tactic": w[1]})
            sums.append({"form": form, "m": m, "parts_us": part if not missing else None, "floor_us": floor,
                         "x_floor": part / floor if not missing else None, "missing": missing})
    return {"kernels": kernels, "sums": sums}


def render(t: dict) -> str:
    out = ["| form | kernel | M | experts touched | bytes time | worker time | × floor | family |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
    seen = set()
    for r in t["kernels"]:
        key = (r["problem"], r["m"])
        if key in seen:                              # the dense MLPs serve both forms: once
            continue
        seen.add(key)
        out.append(f"| {r['form']} | {r['kind']} | {r['m']} | {r['touched']} | {r['floor_us']:.1f} µs | "
                   f"{r['us']:.1f} µs | {r['x_floor']:.2f} | {r['family']} |")
    out += ["", "| form | M | sum of parts (layers × worker time) | its bytes' time | × floor |", "|---|---:|---:|---:|---:|"]
    for s in t["sums"]:
        parts = f"{s['parts_us'] / 1e3:.3f} ms" if s["parts_us"] is not None else "missing: " + ", ".join(s["missing"])
        x = f"{s['x_floor']:.2f}" if s["x_floor"] is not None else "—"
        out.append(f"| {s['form']} | {s['m']} | {parts} | {s['floor_us'] / 1e3:.3f} ms | {x} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("cache", type=harness.existing)
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--m", default="1,4,16,64", help="token counts (each must be a bucket of the cache)")
    ap.add_argument("--rate", type=float, help="copy rate in bytes/s (default: the --step-json run's)")
    ap.add_argument("--step-json", type=Path, default=STEP_JSON, help="a step run's JSON with its copy_Bps")
    ap.add_argument("--device-key", help="whose winners, where the cache holds several devices'")
    ap.add_argument("--skew", type=float, help="the routing draw's Zipf exponent (default: the cache's meta row)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    a.cache = Path(a.cache)
    try:
        ms = [int(x) for x in a.m.split(",")]
    except ValueError:
        print(f"floor_table: --m takes comma-separated integers, got {a.m!r}", file=sys.stderr)
        return 1
    rate, source = a.rate, "--rate"
    if rate is None:
        rate = json.loads(a.step_json.read_text())["copy_Bps"]
        source = str(a.step_json.resolve().relative_to(ROOT)) if a.step_json.resolve().is_relative_to(ROOT) else str(a.step_json)
    if not rate or rate <= 0:
        print(f"floor_table: the copy rate must be positive, got {rate}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        con = open_cache(a.cache, tmp)
        try:
            won = winners(con, a.device_key)
            meta = dict(con.execute("select key, value from meta").fetchall())
        finally:
            con.close()
    skew = a.skew if a.skew is not None else measure.skew_of(meta)
    t = table(won, step_problems(a.model, a.tp), ms, rate, skew)
    t.update(cache=str(a.cache), rate_Bps=rate, rate_from=source, model=a.model, tp=a.tp, routing_skew=skew)
    print(f"{a.model} TP{a.tp}, winners of {a.cache}, bytes at {rate / 1e12:.2f} TB/s ({source}), "
          f"routing drawn with Zipf exponent {skew:g}" + (" (uniform)" if skew == 0 else ""))
    print(render(t))
    if a.json:
        a.json.write_text(json.dumps(t, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
