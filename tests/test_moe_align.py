"""moe_align: the device routing alignment against a plain-Python reference (TRITON_INTERPRET=1)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.tactics.triton_fp4.moe_align import chunk_for, max_blocks, reference

ROOT = Path(__file__).resolve().parents[1]

# (name, M, top_k, E, BLOCK_M, how the ids are drawn)
CASES = [
    ("decode_m1", 1, 8, 256, 16, "random"),
    ("empty_experts", 5, 2, 40, 16, "random"),            # most of the 40 experts get nothing
    ("one_expert_one_chunk", 9, 4, 8, 16, "one"),         # 36 pairs on expert 3: 3 blocks, the last part padding
    ("one_expert_two_launches", 50, 4, 8, 32, "one"),     # 200 pairs > one chunk: count + scatter
    ("minus_one", 12, 4, 10, 16, "minus"),                # ~1/3 of the ids are -1
    ("not_multiple", 37, 3, 6, 16, "random"),             # P = 111: no multiple of the block, 2 chunks
    ("many_chunks", 300, 8, 64, 64, "random"),            # P = 2400: 38 chunks
    ("all_minus_one", 4, 2, 5, 16, "all_minus"),
]

_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from autotune.tactics.triton_fp4.moe_align import Aligner
    out = {}
    for name, m, k, e, bm, how in json.loads(sys.argv[1]):
        g = torch.Generator().manual_seed(len(name) * 7 + m)
        if how == "one":
            ids = torch.full((m, k), 3, dtype=torch.int32)
        elif how == "all_minus":
            ids = torch.full((m, k), -1, dtype=torch.int64)
        else:
            ids = torch.randint(-1 if how == "minus" else 0, e, (m, k), generator=g, dtype=torch.int32)
            if how == "minus":
                ids[torch.rand(m, k, generator=g) < 0.2] = -1
        al = Aligner(e, bm)
        a = al(ids)
        b = al(ids)                                        # same buffers, same answer: deterministic
        out[name] = dict(ids=ids.tolist(), sorted=a.sorted_ids.tolist(), experts=a.expert_ids.tolist(),
                         npad=int(a.npad), launches=a.launches, bad=int(a.bad),
                         same=bool(torch.equal(a.sorted_ids, b.sorted_ids) and torch.equal(a.expert_ids, b.expert_ids)))
    # an id >= E and an id < -1: dropped, the sticky flag set, raise_if_bad refuses once and clears it
    al = Aligner(6, 16)
    ids = torch.tensor([[0, 6], [2, -3]], dtype=torch.int32)
    a = al(ids)
    flagged = int(a.bad)
    try:
        a.raise_if_bad()
        msg = None
    except ValueError as exc:
        msg = str(exc)
    out["bad"] = dict(flag=flagged, msg=msg, after=int(a.bad), npad=int(a.npad), sorted=a.sorted_ids[:int(a.npad)].tolist())
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def runs():
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(CASES)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_alignment_matches_python_reference(runs, case):
    import torch
    name, m, k, e, bm, how = case
    got = runs[name]
    ids = torch.tensor(got["ids"])
    ref_sorted, ref_blocks, npad = reference(ids, e, bm)
    p = m * k
    mb = max_blocks(p, e, bm)
    assert got["npad"] == npad and npad % bm == 0 and npad <= mb * bm
    assert len(got["sorted"]) == mb * bm and len(got["experts"]) == mb
    assert got["sorted"][:npad] == ref_sorted                  # stable order, sentinel P in the padding
    assert got["experts"][:npad // bm] == ref_blocks
    assert all(v == -1 for v in got["experts"][npad // bm:])  # blocks past the padded total
    placed = [v for v in got["sorted"][:npad] if v < p]
    flat = ids.reshape(-1).tolist()
    assert sorted(placed) == [i for i, v in enumerate(flat) if 0 <= v < e]   # each routed pair once, -1 never
    assert got["same"] and got["bad"] == 0
    assert got["launches"] == (1 if p <= chunk_for(p) else 2)


def test_special_shapes_seen(runs):
    # the cases exercise what they say: one expert only, -1 ids, P not a multiple of the block, two launches
    one = runs["one_expert_two_launches"]
    assert one["npad"] == 224 and set(one["experts"][:7]) == {3} and one["launches"] == 2
    assert runs["all_minus_one"]["npad"] == 0 and set(runs["all_minus_one"]["experts"]) == {-1}
    assert any(v == -1 for row in runs["minus_one"]["ids"] for v in row)
    assert (37 * 3) % 16 and runs["not_multiple"]["launches"] == 2
    assert runs["many_chunks"]["launches"] == 2 and runs["decode_m1"]["launches"] == 1


def test_bad_ids_flagged_and_refused(runs):
    b = runs["bad"]
    assert b["flag"] == 1 and b["after"] == 0
    assert b["msg"] == "topk_ids holds expert ids outside [-1, E) (ids >= E or < -1 are refused)"
    assert b["npad"] == 32 and [v for v in b["sorted"] if v < 4] == [0, 2]   # only the valid ids are placed
