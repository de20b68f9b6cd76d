"""What a rank model's bests add to a ranked search, without a GPU (docs/search.md, docs/moe-decode.md part 8).

    python3 bench/rank_bests.py [--model glm5] [--tp 8] [--arch sm90] [--rank-model PATH] [--json out.json]

For the model's problems as the main job tunes them (fused MoE and FP4MLP forms included) on the
arch's kept tactics of the cuda, triton and torch families, at the decode and prefill buckets up to
8192: per job the first batch the trees alone give (their top, the default, novel members) and how
many of the model's bests are not in it (what the bests add); what `every_kernel` adds (each kept
kernel's best-predicted tactic, strategy.every_member), per kernel, with how much slower than the
job's top the trees predicted those tactics. Then, for the moe_mma sweep committed
in docs/data/moe-latency-h200-ab, where the trees alone rank each (problem, M)'s fastest config,
and whether the first batch with bests holds it.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SWEEP = ROOT / "docs/data/moe-latency-h200-ab/moe_latency.json"
BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--arch", default="sm90")
    ap.add_argument("--sms", type=int, default=132, help="SM count the plans are made for (the H200's 132)")
    ap.add_argument("--rank-model", help="a model file (default: the one shipped for the arch)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    from autotune.cache import Store
    from autotune.core.arch import ARCHS
    from autotune.core.problem import Problem
    from autotune.engine import rankmodel, ranked, strategy
    from autotune.engine.search import _Work, plan
    from autotune.models import problems_for
    from autotune.tactics import registry
    from autotune.tactics.cuda import checked as CK
    arch = ARCHS[a.arch]
    path = Path(a.rank_model) if a.rank_model else strategy.shipped(arch)
    if path is None:
        raise SystemExit(f"no rank model shipped for {arch.name}: give --rank-model")
    m = rankmodel.load(path)
    uses = problems_for(a.model, tp=a.tp, fused_moe=True, fused_mlp=True, fold_shared=True)   # as the main job (--fold-shared)
    probs = list({u.problem.key: u.problem for u in uses}.values())
    fams = [registry.get(n) for n in ("cuda", "triton", "torch")]
    work = []
    for p, rows in plan(probs, fams, arch).items():
        # as the main job sees them once the GPU tests have recorded the cuda kernels' texts
        # (tactics/cuda/gpu_checked.json): a tactic unknown only for want of that record counts as kept
        kept = [r for r in rows if r.verdict.ok is True or CK.awaiting_record(r.verdict)]
        if kept:
            work.append(_Work(p, kept, registry.designated_default(p, arch, "cuda")))   # as the search does
    plans = strategy.plans(m, work, BUCKETS, arch, a.sms, Store(), "dev", ranked.Ranked())
    probs_by_key = {p.key: p for p in probs}
    first_n = added = 0
    for (pk, b), pl in plans.items():
        trees = {t.id for t in pl.order[:ranked.Ranker(pl).first]}
        own = set(m.bests(pk, b)) | set(m.sibling_bests(probs_by_key[pk], b))
        trees |= {t.id for t in pl.extras if t.id not in own}
        first_n += len(trees)
        added += len(set(strategy.first_ids(pl)) - trees)
    found: list[dict] = []
    # the same plans without every_kernel: what the rule adds, per kernel, and the trees' view of it
    bare = strategy.plans(m, work, BUCKETS, arch, a.sms, Store(), "dev", ranked.Ranked(every_kernel=False))
    by_kernel: dict[str, dict] = {}
    for key, pl in plans.items():
        pos = {t.id: i for i, t in enumerate(pl.order)}
        for t in pl.extras[len(bare[key].extras):]:
            k = by_kernel.setdefault("/".join(filter(None, strategy.kernel_of(t))), {"added": 0, "max_log2_slower": 0.0})
            k["added"] += 1
            k["max_log2_slower"] = max(k["max_log2_slower"], round(pl.pred[pos[t.id]] - pl.pred[0], 2))
    doc = {"rank_model": path.name, "jobs": len(plans), "first_batch_without_bests": first_n,
           "added_by_bests": added, "added_by_every_kernel": by_kernel, "sweep": found}
    print(f"{a.model} TP{a.tp} on {arch.name}, {path.name}: {len(plans)} jobs, first batches without bests "
          f"{first_n} measurements, bests add {added}")
    print("every_kernel adds " + ", ".join(f"{k} {v['added']} (predicted up to 2^{v['max_log2_slower']} x the top)"
                                          for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1]["added"])))
    sweep = json.loads(SWEEP.read_text())["sweep"]
    for w in work:
        for b in (1, 4):
            timed = [r for r in sweep if r["problem"] == w.problem.key and r["m"] == b and "us" in r]
            of = w.problem.key
            if not timed:        # the shared expert folded in (e257:top9): its sibling's sweep (e256:top8)
                sib = [r for r in sweep if r["m"] == b and "us" in r and rankmodel.sibling_distance(w.problem, Problem.from_key(r["problem"])) is not None]
                if not sib:
                    continue
                timed, of = sib, sib[0]["problem"]
            fast = min(timed, key=lambda r: r["us"])
            pl = plans[(w.problem.key, b)]
            tid = next(t.id for t in pl.order if t.family == "cuda"
                       and all(t.params.get(k) == v for k, v in fast["tactic"].items()))
            row = {"problem": w.problem.key, "swept": of, "m": b, "us": fast["us"], "tree_rank": pl.order.index(
                next(t for t in pl.order if t.id == tid)) + 1, "kept": len(pl.order),
                   "first_batch": ranked.Ranker(pl).first, "measured_first": tid in strategy.first_ids(pl)}
            found.append(row)
            via = "" if of == w.problem.key else " (swept as its sibling " + of.split(":")[-3] + ":" + of.split(":")[-2] + ")"
            print(f"{w.problem.key} M={b}{via}: the sweep's fastest ({fast['us']:.2f} us) ranks {row['tree_rank']} of "
                  f"{row['kept']} by the trees (first batch {row['first_batch']}); measured first: {row['measured_first']}")
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
