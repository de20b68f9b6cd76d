"""Do the folded problems' winners depend on how the search draws their routing? (issue #26, part 13's
item 4; docs/moe-decode.md part 16)

The search times a folded problem (`e257:top9`: GLM-5's 256 routed experts + the shared one as expert
256) with 9 of 257 experts drawn at random per token; FP4MoE serves it as 8 of the 256 routed ones plus
expert 256 in every token's last slot (weight 1) — one expert hot, with M tokens. This bench takes a
cache's best-timed tactics per (folded problem, M) and times each under both routings, interleaved in
one process (the same weights and activations, CUDA-graph replays, cold L2 rotation, medians of
`--rounds`), and says where the ranking changes. If it never does, the search's draw is good enough;
if it does, the folded problems need the served routing (a Problem field: a key change).

    OUT=DIR python3 bench/fold_routing_ab_h200.py --cache docs/data/main-job-h100-sixteenth.db.xz
    python3 bench/fold_routing_ab_h200.py --plan --cache ...     # what it would time (no GPU)
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
#: the folded problems' signature: GLM-5's 256 routed experts + the shared one, top-8 + 1
FOLDED = ":e257:top9"


def open_store(path: str, tmp: str):
    from autotune.cache import Store
    if path.endswith(".xz"):
        out = Path(tmp) / "cache.db"
        with lzma.open(path) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        return Store(str(out))
    return Store(path, readonly=True)


def candidates(store, ms: list[int], top: int) -> dict[tuple[str, int], list]:
    """(folded problem key, M) → the `top` fastest stored tactics there (status ok, best first)."""
    from autotune.core.tactic import Tactic
    dev = store.devices()[0]["device_key"]
    keys = sorted({w.problem_key for w in store.winners(dev) if FOLDED in w.problem_key})
    out = {}
    for k in keys:
        for m in ms:
            rows = sorted((t for t in store.get_trials(k, m, dev) if t.status == "ok" and t.median_us),
                          key=lambda t: t.median_us)
            seen, picked = set(), []
            for t in rows:
                if t.tactic_id not in seen:
                    seen.add(t.tactic_id)
                    picked.append((Tactic.from_json(t.params_json), t.median_us))
            if picked:
                out[(k, m)] = picked[:top]
    return out


def served_routing(sets, m: int, experts: int, top_k: int, seed: int):
    """The same sets with FP4MoE's folded routing: top_k - 1 of the experts - 1 routed ones (uniform),
    then expert experts - 1 with weight 1 in every token's last slot."""
    import torch
    from autotune.core import inputs
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in sets:
        ids, tw = inputs.routing(m, experts - 1, top_k - 1, gen, 0.0)
        ids = torch.cat([ids, torch.full((m, 1), experts - 1, dtype=ids.dtype)], 1)
        tw = torch.cat([tw, torch.ones(m, 1, dtype=tw.dtype)], 1)
        out.append(inputs.InputSet(s.x, s.w, ids.to(s.x.device), tw.to(s.x.device)))
    return out


def time_pair(p, m: int, picked: list, rounds: int, budget_s: float) -> list[dict]:
    import torch
    from autotune.core import inputs
    from autotune.engine import timing
    from autotune.tactics import registry
    from autotune.tactics.base import PLAIN_LAYOUT
    n_sets = timing.sets_for_cold_l2(inputs.set_bytes(p, m), "cuda")
    weights = [inputs.seeded_weight(p, "cuda", 1000 + i) for i in range(n_sets)]
    draws = {"search": inputs.make_inputs(p, m, "cuda", 7, n_sets, weights=weights)}
    draws["served"] = served_routing(draws["search"], m, p.experts, p.top_k, 8)
    refs = {d: inputs.reference(p, s[0]) for d, s in draws.items()}
    outs = [inputs.torch_empty_out(p, m, s) for s in draws["search"]]
    cfg = timing.TimerConfig(budget_s=budget_s)
    rows = []
    for t, stored in picked:
        fam = registry.get(t.family)
        kernel, lay = fam.build(p, t, "cuda"), fam.layout(t)
        packs = [w if lay == PLAIN_LAYOUT else fam.pack(lay, w) for w in weights]
        got: dict[str, list[float]] = {"search": [], "served": []}
        err = {d: inputs.check(p, lambda x, w, *r, out=None: kernel(x, packs[0], *r, out=out), s[0], refs[d])
               for d, s in draws.items()}
        for _ in range(rounds):              # interleaved: one draw, then the other, per round
            for d, sets in draws.items():
                args = [(s.x, packs[i], s.topk_ids, s.topk_weights) for i, s in enumerate(sets)]
                got[d].append(timing.time_calls(lambda i: kernel(*args[i], out=outs[i]), n_sets, "cuda", cfg,
                                                {}).median_us)
        release = getattr(kernel, "release", None)
        if callable(release):
            release()
        rows.append({"tactic": t.to_json(), "stored_us": stored, "rel_err": err,
                     **{f"{d}_us": statistics.median(v) for d, v in got.items()}})
        torch.cuda.empty_cache()
    for d in ("search", "served"):
        for rank, r in enumerate(sorted(rows, key=lambda r: r[f"{d}_us"]), 1):
            r[f"{d}_rank"] = rank
    return rows


def render(res: dict) -> str:
    out = [f"{res['gpu']}, {res['when']}, cache {res['cache']}: the stored best tactics of each folded "
           f"(problem, M) timed under the search's routing draw and FP4MoE's served one (µs, medians of "
           f"{res['rounds']} interleaved rounds)", "",
           "| problem | M | tactic | search draw | served | rank search → served |", "|---|---:|---|---:|---:|---|"]
    changed = 0
    for g in res["groups"]:
        first = {r["search_rank"]: r for r in g["rows"]}.get(1)
        if first is not None and first["served_rank"] != 1:
            changed += 1
        for r in g["rows"]:
            t = json.loads(r["tactic"])          # the tactic's own JSON, as stored
            out.append(f"| {g['problem'].split(':', 2)[-1]} | {g['m']} | {t['family']} {t['params']} | "
                       f"{r['search_us']:.1f} | {r['served_us']:.1f} | {r['search_rank']} → {r['served_rank']} |")
    out += ["", f"the search draw's fastest is not the served routing's fastest in {changed} of {len(res['groups'])} "
            "(problem, M)"]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(ROOT / "docs/data/main-job-h100-sixteenth.db.xz"))
    ap.add_argument("--ms", default="1,4,16,64")
    ap.add_argument("--top", type=int, default=4, help="stored best tactics per (problem, M)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=0.05, help="per timing")
    ap.add_argument("--plan", action="store_true", help="print what it would time and exit (no GPU)")
    ap.add_argument("--render", help="print the table of a result JSON and exit")
    a = ap.parse_args(argv)
    if a.render:
        print(render(json.loads(Path(a.render).read_text())))
        return 0
    ms = [int(v) for v in a.ms.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(a.cache, tmp)
        cands = candidates(store, ms, a.top)
        store.close()
    if not cands:
        print(f"{a.cache}: no folded ({FOLDED}) problem has timed tactics at M in {ms}", file=sys.stderr)
        return 2
    if a.plan:
        for (k, m), picked in cands.items():
            print(f"{k} M={m}: " + ", ".join(f"{t.family} {dict(t.params)} ({us:.1f} us stored)" for t, us in picked))
        return 0
    import torch
    from autotune.core.problem import Problem
    if not torch.cuda.is_available():
        print("fold_routing_ab_h200.py times on a GPU (--plan lists what it would time)", file=sys.stderr)
        return 2
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cache": a.cache, "rounds": a.rounds,
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "groups": []}
    out = Path(os.environ.get("OUT", ".")) / "fold-routing-ab.json"
    for (k, m), picked in cands.items():
        rows = time_pair(Problem.from_key(k), m, picked, a.rounds, a.budget_s)
        res["groups"].append({"problem": k, "m": m, "rows": rows})
        out.write_text(json.dumps(res, indent=1))
        print(json.dumps({"problem": k, "m": m, **{json.loads(r["tactic"])["family"] + str(i): (round(r["search_us"], 1),
                                                                                   round(r["served_us"], 1))
                                                    for i, r in enumerate(rows)}}), flush=True)
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
