"""After `autotune search ... --families cuda,...`: FP4Linear layers read the winners from the cache
and run them; prints, per GLM-5 TP8 dense problem and M, the family and tactic the bound table
launched, the layouts it packed, their extra bytes, and the float64 check of the layer's output.

    AUTOTUNE_CACHE=DIR/search.db python3 bench/cuda_dispatch.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    import torch

    from autotune.core import inputs
    from autotune.runtime.nn import FP4Linear
    from autotune.models import problems_for
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rows = []
    for u in problems_for("glm5", 8):
        p = u.problem
        if p.kind != "dense":
            continue
        w = inputs.random_weight(p, "cuda", torch.Generator().manual_seed(1))
        layer = FP4Linear(w)
        for m in (1, 2, 8, 16, 64):
            x = torch.randn(m, p.k, device="cuda").to(torch.bfloat16)
            i = layer.table.index(m)
            t = layer.table.tactics[i] if i >= 0 else None
            y = layer(x)
            ref = x.double() @ w.dequantize(torch.float64).T
            err = float((y.double() - ref).norm() / ref.norm())
            rows.append({"problem": p.key, "m": m, "family": t.family if t else f"slot {i}",
                         "tactic": t.params if t else None, "err": err})
        rows.append({"problem": p.key, "layouts": list(layer.bound.packs), "extra_bytes": layer.prepacked_extra_bytes,
                     "weight_bytes": w.nbytes})
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "cuda_dispatch.json").write_text(json.dumps(rows, indent=1, default=str))
    for r in rows:
        print(r)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
