"""After `autotune search ... --families cuda,...`: FP4Linear layers read the winners from the cache
and run them; prints, per GLM-5 TP8 dense problem and M, the family and tactic the bound table
launched, the layouts it packed, their extra bytes, and the float64 check of the layer's output.

    AUTOTUNE_CACHE=DIR/search.db python3 bench/cuda_dispatch.py --out DIR
    AUTOTUNE_CACHE=c.db python3 bench/cuda_dispatch.py --out DIR --model M --tp 1 --device cpu --m 1,4   # smoke
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import parser  # noqa: E402


def main() -> int:
    import torch

    from autotune.core import inputs
    from autotune.runtime.nn import FP4Linear
    from autotune.models import problems_for
    ap = parser(__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="glm5")
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--m", default="1,2,8,16,64", help="comma-separated M values")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    rows = []
    for u in problems_for(a.model, a.tp):
        p = u.problem
        if p.kind != "dense":
            continue
        w = inputs.random_weight(p, a.device, torch.Generator().manual_seed(1))
        layer = FP4Linear(w)
        for m in map(int, a.m.split(",")):
            x = torch.randn(m, p.k, device=a.device).to(torch.bfloat16)
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
