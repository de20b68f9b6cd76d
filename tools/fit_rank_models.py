"""Refit the rank model shipped inside the package from the committed caches (no GPU; needs LightGBM).

    python3 -m tools.fit_rank_models            # writes autotune/engine/strategies/ranked/rank_models/sm90-<libs>.json.gz
    python3 -m tools.fit_rank_models --holdout 3 --compare OLD.json.gz --json out.json   # the hold-out figures

The committed caches are read from copies in a temporary folder (never opened in place), oldest
first (`CACHES`; the newest source's fastest tactics lead a (problem, bucket)'s bests): the two main
jobs of the final problem set, the H200 one at 7a8be9d (2026-12-05) and the H100 one at 961f0e7
(2026-12-07: torch, triton and cuda measured, moe_tok included). `--earlier` adds the five caches
the model shipped until 2026-12-07 was fitted on (`EARLIER`: the full H200 search, the cuda and MoE
searches, the 2026-12-02 main job, the moe_mma sweep). Every group keeps only the tactics whose
parameters the installed code's space still holds (rows.in_space; the count removed is printed and
kept in the model's info). One model is fitted on them together (rankdata.train_many: each cache's
groups keep their own labels). The file is named by arch and the library versions in the model's
key; an older shipped model of the same arch with other versions is left for the caller to remove
(listed).

`--holdout N` fits without every N-th bucket of the ladder (held out of every cache) and scores, on
each held-out (problem, bucket) of the main-job caches (`EVAL`), the model's first choice among the
tactics the search keeps there — what `--strategy predict` serves — against the stored winner: the
same tactic, within 3 % of its stored time, slower, or never timed by that run (unknown); the
winner's place in the model's order (top-1, top-6, top-15 coverage); and the first choice among the
tactics that run timed. `--compare MODEL` scores other model files on the same groups (a model
fitted on data that includes them is not held out: say so when reading its figures). `--unseen` adds
`LATER`'s jobs, never fitted on, and scores all of their groups: the one comparison where the shipped
model is held out too.
docs/search.md has the numbers.
"""
from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.core.arch import Arch  # noqa: E402
from autotune.core.tactic import Tactic  # noqa: E402
from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, plans as strategy  # noqa: E402
from autotune.cache.store import Store  # noqa: E402
from autotune.tactics import registry  # noqa: E402

#: (name in the model's info, committed cache): the main jobs of the final problem set, oldest first
CACHES = (# the newest H200 main job (ranked, 294 of 294 winners, 2026-12-05 at 7a8be9d): the final problem
          # set (the shared expert folded in); every parameter of its tactics still in the space
          ("main-job-h200-7a8be9d", "docs/data/2026-12-05-h200-7a8be9d-main-job.db.xz"),
          # the main job of the final code on one H100 (2026-12-07 at 961f0e7, 294 of 294 winners):
          # the cuda family winning 90 of 95 buckets at M <= 64, moe_tok timed
          ("main-job-h100-961f0e7", "docs/data/2026-12-07-h100-961f0e7-main-job.db.xz"))
#: the caches the model shipped until 2026-12-07 was fitted on (`--earlier` adds them before CACHES):
#: on the hold-out of 2026-12-07 a model with them scored below one without (docs/search.md)
EARLIER = (("h200x2-glm5-tp8-full", "docs/data/2026-11-30-h200x2-full-search.db.xz"),
           ("cuda-search-h200", "tests/data/2026-12-01-h200-cuda-search.db"),
           ("moe-search-h200", "tests/data/2026-12-01-h200-moe-search.db"),
           # the main job on one H200 (ranked, 2026-12-02): the first data of the cuda family's moe_mma and
           # dense split-K/SwiGLU forms
           ("main-job-h200", "docs/data/2026-12-02-h200-main-job.db.xz"),
           # every moe_mma config the verdicts keep (m_tiles 1) timed at M = 1 and 4 for w13:swiglu and
           # w2:reduce (bench/moe_latency_h200.py --store at f4cc350, 2026-12-03; the file rebuilt from the
           # run's committed JSON, no GPU: python3 tools/sweep_db_from_json.py)
           ("moe-latency-h200-ab", "docs/data/2026-12-03-h200-moe-config-sweep.db.xz"))
#: the caches whose held-out groups `--holdout` scores (main jobs of the final problem set)
EVAL = ("main-job-h200-7a8be9d", "main-job-h100-961f0e7")
#: later main jobs, never fitted on by default: `--unseen` scores every one of their groups (each bucket,
#: not only the held-out ones) with a model that saw none of them, the shipped one included; `--fit-later`
#: fits on them as on CACHES (their held-out buckets scored like EVAL's)
LATER = (# the main job at 13d6647 on one H100 (2026-12-07, `--measure-every 1`: every bucket measured in full,
         # the bucket cut's reference; 294 of 294 winners)
         ("main-job-h100-13d6647", "docs/data/2026-12-07-h100-13d6647-main-job-ref.db.xz"),)
#: winner's place in the model's order reported by `--holdout` (6: the ranked first batch's minimum)
TOPS = (1, 6, 15)
WITHIN = 0.03


def copy(src: Path, dst: Path) -> Path:
    """A private copy of a committed cache: .xz decompressed, SQLite through its backup API."""
    if src.suffix == ".xz":
        with lzma.open(src) as f, open(dst, "wb") as out:
            shutil.copyfileobj(f, out)
    else:
        a = sqlite3.connect(f"file:{src}?mode=ro", uri=True)
        b = sqlite3.connect(dst)
        a.backup(b)
        a.close()
        b.close()
    return dst


class Opened:
    """The caches copied into a temporary folder and opened, with their groups in the current space."""

    def __init__(self, caches=CACHES):
        self.caches = tuple(caches)

    def __enter__(self) -> "Opened":
        self._tmp = tempfile.TemporaryDirectory()
        tmp = Path(self._tmp.name)
        self.stores = []
        try:
            for name, path in self.caches:
                self.stores.append(Store(str(copy(ROOT / path, tmp / f"{name}.db"))))
            self.sources = [rankdata.Source(s, s.devices()[0]["device_key"], name)
                            for s, (name, _) in zip(self.stores, self.caches)]
            arch = {rankdata.device_arch(s.store, s.device_key)[0].name: rankdata.device_arch(s.store, s.device_key)[0]
                    for s in self.sources}
            if len(arch) != 1:
                raise ValueError(f"one rank model is for one arch; the caches hold {', '.join(sorted(arch))}")
            self.arch: Arch = next(iter(arch.values()))
            self.space: dict = {}
            self.groups, self.dropped = rankdata.in_space(rankdata.source_groups(self.sources), self.arch, self.space)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        for s in getattr(self, "stores", []):
            s.close()
        self._tmp.cleanup()


def fit(caches=CACHES, out_dir: Path = strategy.SHIPPED, rounds: int = rankmodel.ROUNDS) -> tuple[Path, int]:
    """(the model file written, the (group, tactic) rows left out as outside the current space)."""
    with Opened(caches) as o:
        model = rankdata.train_many(o.sources, o.groups, rounds=rounds)
        dropped = o.dropped
    model.info["caches"] = {name: path for name, path in caches}
    model.info["outside_space"] = dropped
    out_dir.mkdir(parents=True, exist_ok=True)
    return rankmodel.save(model, out_dir / strategy.shipped_name(model)), dropped


# -- hold-out ---------------------------------------------------------------------------------

def held_buckets(groups, every: int) -> list[int]:
    """Every `every`-th bucket of the ladder the groups hold, from the first (M = 1)."""
    return sorted({g.bucket for g in groups})[::every]


def candidates(o: Opened, g, default_id: str, families) -> list[tuple[str, Tactic, int | None]]:
    """(id, tactic, smem bytes) of what a search keeps at g's (problem, bucket) under the current
    space: every tactic of the families the cache measured for the problem, less those the run's
    device rejected statically (stored as rejected) and those their family calls useless at this M
    (the default always kept); smem from the stored trial, else the family's verdict."""
    out = []
    for fam_name in sorted(families):
        fam = registry.get(fam_name)
        if fam.supports(g.problem):
            continue
        for t in fam.enumerate(g.problem, o.arch):
            if t.id in g.rejected or (t.id != default_id and not registry.useful(g.problem, t, g.bucket)):
                continue
            smem = g.smem[t.id] if t.id in g.smem else fam.verdict(g.problem, t, o.arch).smem_bytes
            out.append((t.id, t, smem))
    return out


def score(models: dict, o: Opened, held: list, winners: dict, families: dict) -> dict[str, list[dict]]:
    """Per model name, a row per held-out group: its first choice and how it fares."""
    out = {name: [] for name in models}
    for g in held:
        w = winners.get((g.source, g.problem.key, g.bucket))
        if w is None or w.tactic_id not in g.timed:
            continue
        src = next(s for s in o.sources if s.name == g.source)
        sms = rankdata.device_arch(src.store, g.device_key)[1]
        cand = candidates(o, g, w.default_tactic_id, families[(g.source, g.problem.key)])
        feats = [rankdata.row(g.problem, t, g.bucket, o.arch, sms, smem) for _, t, smem in cand]
        best = g.timed[w.tactic_id]
        for name, m in models.items():
            pred = m.predict(feats)
            order = [i for _, i in sorted(zip(pred, (c[0] for c in cand)))]
            first = order[0]
            timed_first = min((i for i in order if i in g.timed), key=order.index)
            place = order.index(w.tactic_id) + 1 if w.tactic_id in order else None
            gap = g.timed[first] / best - 1 if first in g.timed else None
            out[name].append({"source": g.source, "problem": g.problem.key, "bucket": g.bucket, "kept": len(order),
                              "timed": sum(i in g.timed for i in order), "winner": w.tactic_id, "first": first,
                              "first_family": next(t.family for i, t, _ in cand if i == first),
                              "gap": gap, "timed_first_gap": g.timed[timed_first] / best - 1, "winner_place": place})
    return out


def summary(rows: list[dict]) -> dict:
    n = len(rows)
    known = [r for r in rows if r["gap"] is not None]
    return {"groups": n, "same": sum(r["first"] == r["winner"] for r in rows),
            "within": sum(r["gap"] is not None and r["gap"] <= WITHIN for r in rows),
            "slower": sum(r["gap"] is not None and r["gap"] > WITHIN for r in rows),
            "untimed": n - len(known),
            "worst_known_gap": max((r["gap"] for r in known), default=None),
            **{f"top{k}": sum(r["winner_place"] is not None and r["winner_place"] <= k for r in rows) for k in TOPS},
            "timed_first_within": sum(r["timed_first_gap"] <= WITHIN for r in rows)}


def split(groups, buckets: list[int], evaluated: tuple, away: set) -> tuple[list, list]:
    """(groups to fit on, groups to score): an unseen cache's (`away`) groups are all scored and none
    fitted on; the others are fitted on outside the held-out `buckets`, scored inside them where
    their cache is `evaluated`."""
    train = [g for g in groups if g.bucket not in buckets and g.source not in away]
    held = [g for g in groups if g.source in away or (g.bucket in buckets and g.source in evaluated)]
    return train, held


def holdout(every: int, compare: dict, caches=CACHES, rounds: int = rankmodel.ROUNDS,
            unseen: tuple = (), evaluated: tuple = EVAL) -> dict:
    """Fit without every `every`-th bucket (and without the `unseen` caches, (name, path) pairs) and
    score the result and the `compare` models on the held-out groups of the `evaluated` caches and
    every group of the unseen ones: {"held_buckets", "summary": {model: {cache: figures}}, "rows"}."""
    away = {name for name, _ in unseen}
    scored = (*evaluated, *(name for name, _ in unseen))
    with Opened((*caches, *unseen)) as o:
        buckets = held_buckets(o.groups, every)
        train, held = split(o.groups, buckets, evaluated, away)
        models = {"refit (held out)": rankdata.train_many(o.sources, train, rounds=rounds), **compare}
        winners = {(s.name, w.problem_key, w.bucket): w for s in o.sources if s.name in scored
                   for w in s.store.winners(s.device_key) if not w.predicted}
        families: dict = {}
        for g in o.groups:
            families.setdefault((g.source, g.problem.key), set()).update(t.family for t in g.tactics.values())
        rows = score(models, o, held, winners, families)
        out = {"held_buckets": buckets, "outside_space": o.dropped,
               "train_groups": len(train), "held_groups": len(held), "summary": {}, "rows": rows}
    for name, rs in rows.items():
        out["summary"][name] = {src: summary([r for r in rs if r["source"] == src]) for src in scored}
        out["summary"][name]["all"] = summary(rs)
    return out


def table(res: dict) -> str:
    lines = ["| model | cache | held-out (problem, bucket) | first choice = winner | within 3 % | slower | "
             "never timed | worst gap (timed) | " + " | ".join(f"winner in top {k}" for k in TOPS)
             + " | first of the timed within 3 % |",
             "|---|---|---:|---:|---:|---:|---:|---:|" + "---:|" * len(TOPS) + "---:|"]
    for name, by in res["summary"].items():
        for src, s in by.items():
            n = s["groups"] or 1
            worst = "—" if s["worst_known_gap"] is None else f"{s['worst_known_gap']:+.1%}"
            lines.append(f"| {name} | {src} | {s['groups']} | {s['same']} | {s['within']} ({s['within'] / n:.1%}) | "
                         f"{s['slower']} | {s['untimed']} | {worst} | "
                         + " | ".join(f"{s[f'top{k}']} ({s[f'top{k}'] / n:.0%})" for k in TOPS)
                         + f" | {s['timed_first_within']} ({s['timed_first_within'] / n:.1%}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=rankmodel.ROUNDS)
    ap.add_argument("--out-dir", type=Path, default=strategy.SHIPPED)
    ap.add_argument("--earlier", action="store_true", help="fit on EARLIER's caches too (before CACHES)")
    ap.add_argument("--only", default="", help="comma-separated cache names to fit on (default: all of CACHES)")
    ap.add_argument("--holdout", type=int, default=0, metavar="N",
                    help="no model written: fit without every N-th bucket and print the hold-out figures")
    ap.add_argument("--compare", type=Path, action="append", default=[], help="with --holdout: a model file to score too")
    ap.add_argument("--json", type=Path, help="with --holdout: write the figures and per-group rows here")
    ap.add_argument("--unseen", action="store_true", help="with --holdout: score every group of LATER's jobs, fitted on by no model")
    ap.add_argument("--fit-later", action="store_true", help="fit on LATER's jobs too (after CACHES)")
    a = ap.parse_args(argv)
    if a.unseen and (a.fit_later or not a.holdout):
        ap.error("--unseen needs --holdout N and excludes --fit-later")
    caches = (*EARLIER, *CACHES) if a.earlier else CACHES
    evaluated = EVAL
    if a.fit_later:
        caches, evaluated = (*caches, *LATER), (*EVAL, *(n for n, _ in LATER))
    if a.only:
        names = a.only.split(",")
        known = (*EARLIER, *CACHES)
        unknown = sorted(set(names) - {n for n, _ in known})
        if unknown:
            ap.error(f"--only: no cache named {', '.join(unknown)}; known: {', '.join(n for n, _ in known)}")
        caches = tuple(c for c in known if c[0] in names)
    if a.holdout:
        if a.holdout < 2:
            ap.error("--holdout N needs N >= 2")
        compare = {}
        for p in a.compare:
            try:
                compare[p.name] = rankmodel.load(p)
            except (OSError, ValueError, KeyError) as e:
                ap.error(f"--compare {p}: {e}")
        unseen = LATER if a.unseen else ()
        res = holdout(a.holdout, compare, caches, a.rounds, unseen, evaluated)
        print(f"held out buckets {res['held_buckets']}: {res['held_groups']} groups of "
              f"{', '.join((*evaluated, *(n for n, _ in unseen)))} scored; "
              f"trained on {res['train_groups']} groups; {res['outside_space']} (group, tactic) rows outside the space")
        print(table(res))
        if a.json:
            res["caches"], res["unseen"] = dict(caches), dict(unseen)
            a.json.write_text(json.dumps(res, sort_keys=True, separators=(",", ":")) + "\n")
        return 0
    path, dropped = fit(caches, out_dir=a.out_dir, rounds=a.rounds)
    m = rankmodel.load(path)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB): {m.key['arch']} {m.key['gpu']}, libs {m.key['libs']}, "
          f"{m.info['rows']} rows from {m.info['groups']} groups {m.info.get('sources')}; "
          f"{dropped} (group, tactic) rows left out: parameters no longer in the space")
    others = [p for p in a.out_dir.glob(f"{m.key['arch']}-*") if p != path]
    if others:
        print("other shipped models of this arch (remove them if this one replaces them): "
              + ", ".join(p.name for p in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
