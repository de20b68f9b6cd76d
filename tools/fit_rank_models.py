"""Refit the rank model shipped inside the package from the committed caches (no GPU; needs LightGBM).

    python3 -m tools.fit_rank_models            # writes autotune/engine/strategies/ranked/rank_models/sm90-<libs>.json

The committed H200 caches are read from copies in a temporary folder (never opened in place): the
full GLM-5 TP8 search (triton, torch; dense and grouped MoE), the cuda family's search (dense, M <= 64)
the MoE search (moe_decode, the fused :swiglu / :reduce problems) and the ranked main job of
2026-12-02 (moe_mma, the dense split-K / SwiGLU / MXFP4 forms, FP4MLP's SwiGLU problems) and the moe_mma
config sweep of bench/moe_latency_h200.py (2026-12-03; the script is at commit f4cc350). One model is fitted on the five together (rankdata.train_many: each cache's groups keep their own labels). The file is named
by arch and the library versions in the model's key; an older shipped model of the same arch with
other versions is left for the caller to remove (listed). Check it with
`python3 bench/rank_eval.py <the same caches>` (docs/search.md has the numbers).
"""
from __future__ import annotations

import argparse
import lzma
import shutil
import sqlite3
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, plans as strategy  # noqa: E402
from autotune.cache.store import Store  # noqa: E402

#: (name in the model's info, committed cache)
CACHES = (("h200x2-glm5-tp8-full", "docs/data/2026-11-30-h200x2-full-search.db.xz"),
          ("cuda-search-h200", "tests/data/2026-12-01-h200-cuda-search.db"),
          ("moe-search-h200", "tests/data/2026-12-01-h200-moe-search.db"),
          # the main job on one H200 (ranked, 2026-12-02): the first data of the cuda family's moe_mma and
          # dense split-K/SwiGLU forms, which the three above predate (they entered every job as novel extras)
          ("main-job-h200", "docs/data/2026-12-02-h200-main-job.db.xz"),
          # every moe_mma config the verdicts keep (m_tiles 1) timed at M = 1 and 4 for w13:swiglu and
          # w2:reduce (bench/moe_latency_h200.py --store at f4cc350, 2026-12-03): the ranked main job had measured
          # 6 of them per bucket and missed the best at both
          # (the file rebuilt from the run's committed JSON, no GPU: python3 tools/sweep_db_from_json.py)
          ("moe-latency-h200-ab", "docs/data/2026-12-03-h200-moe-config-sweep.db.xz"))


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


def fit(caches=CACHES, out_dir: Path = strategy.SHIPPED, rounds: int = rankmodel.ROUNDS) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        stores = [Store(str(copy(ROOT / path, Path(tmp) / f"{name}.db"))) for name, path in caches]
        try:
            sources = [rankdata.Source(s, s.devices()[0]["device_key"], name) for s, (name, _) in zip(stores, caches)]
            model = rankdata.train_many(sources, rounds=rounds)
        finally:
            for s in stores:
                s.close()
    model.info["caches"] = {name: path for name, path in caches}
    out_dir.mkdir(parents=True, exist_ok=True)
    return rankmodel.save(model, out_dir / strategy.shipped_name(model))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=rankmodel.ROUNDS)
    ap.add_argument("--out-dir", type=Path, default=strategy.SHIPPED)
    a = ap.parse_args(argv)
    path = fit(out_dir=a.out_dir, rounds=a.rounds)
    m = rankmodel.load(path)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB): {m.key['arch']} {m.key['gpu']}, libs {m.key['libs']}, "
          f"{m.info['rows']} rows from {m.info['groups']} groups {m.info.get('sources')}")
    others = [p for p in a.out_dir.glob(f"{m.key['arch']}-*") if p != path]
    if others:
        print("other shipped models of this arch (remove them if this one replaces them): "
              + ", ".join(p.name for p in others))
    return 0


if __name__ == "__main__":
    sys.exit(main())
