"""--batch-invariant: tactics say themselves whether a row's result depends on the batch
(Family.batch_invariant); those that say so give bit-identical rows at batch 1 and batch 64 (the
Triton family under TRITON_INTERPRET=1 at a small shape); the search keeps only them and stores
one tactic per problem for every bucket."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.search import search
from autotune.cache import Store
from autotune.tactics import registry

ROOT = Path(__file__).resolve().parent.parent
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)


def _w4a16(bm, bn, bk, sk):
    return Tactic("triton", kernel="w4a16_dequant", block_m=bm, block_n=bn, block_k=bk, group_m=1, num_warps=4,
                  num_stages=2, split_k=sk)


def test_families_say_which_tactics_are_batch_invariant():
    fam, dense, moe = registry.get("triton"), Problem.dense(3072, 6144), Problem.moe(512, 6144, 256, 8)
    assert fam.batch_invariant(dense, _w4a16(64, 64, 128, 1))
    assert fam.batch_invariant(dense, _w4a16(16, 64, 256, 8))               # split-K: fixed split, M chunked
    assert not fam.batch_invariant(dense, Tactic("triton", kernel="dequant_cublas", block_n=32, block_k=256,
                                                 num_warps=4))               # cuBLAS picks per shape
    assert fam.batch_invariant(moe, Tactic("triton", kernel="moe_w4a16", block_m=32, block_n=64, block_k=128,
                                           num_warps=4, num_stages=3))
    torch_fam = registry.get("torch")                                        # torch.matmul picks per shape
    assert not any(torch_fam.batch_invariant(dense, t) for t in torch_fam.enumerate(dense, None))


_ROWS = textwrap.dedent("""
    import json, sys, torch
    from autotune.core import inputs
    from autotune.core.problem import Problem
    from autotune.core.tactic import Tactic
    from autotune.tactics.triton_fp4.family import TritonFamily
    from autotune.tactics.triton_fp4 import moe_decode, splitk
    fam, out, default_cap = TritonFamily(), [], splitk.MAX_WORKSPACE_BYTES
    kinds = {"dense": Problem.dense(64, 256), "dense_k1024": Problem.dense(64, 1024), "moe": Problem.moe(64, 256, 4, 2),
             "moe_k1024": Problem.moe(64, 1024, 4, 2), "moe_k1024_reduce": Problem.moe(64, 1024, 4, 2, epilogue="reduce")}
    for kind, params, cap in json.loads(sys.argv[1]):     # cap: the workspace cap (None: the default)
        cap = default_cap if cap is None else cap
        splitk.MAX_WORKSPACE_BYTES = moe_decode.MAX_WORKSPACE_BYTES = cap      # small: M=64 is cut into chunks
        p = kinds[kind]
        t = Tactic("triton", params)
        s = inputs.make_inputs(p, 64, "cpu", seed=3)[0]
        kern = fam.build(p, t, "cpu")
        many = kern(*s.args())
        same = True
        for i in (0, 17, 63):
            one = kern(s.x[i:i + 1], s.w) if p.kind == "dense" else kern(s.x[i:i + 1], s.w, s.topk_ids[i:i + 1],
                                                                          s.topk_weights[i:i + 1])
            same = same and torch.equal(one[0], many[i])
        splitk.MAX_WORKSPACE_BYTES = moe_decode.MAX_WORKSPACE_BYTES = 1 << 40        # one launch, whole split
        same = same and torch.equal(kern(*s.args()), many)
        splitk.MAX_WORKSPACE_BYTES = moe_decode.MAX_WORKSPACE_BYTES = cap
        ref = inputs.reference(p, s)
        err = float((many.double() - ref).norm() / ref.norm())
        rows = splitk.chunk_rows(params, p.n) if p.kind == "dense" else getattr(kern, "chunk_tokens", lambda: None)()
        out.append([params, fam.batch_invariant(p, t), bool(same), err, rows])
    print(json.dumps(out))
""")


#: the interpreter's cases of the tests below: (test, kind, params, workspace cap or None)
_MOE_DECODE = {"kernel": "moe_decode", "route": "direct", "block_m": 16, "block_n": 32, "block_k": 128, "split_k": 4,
               "num_warps": 4, "num_stages": 2}
_CASES = [("invariant", "dense", dict(_w4a16(16, 32, 128, 1).params), None),
          ("invariant", "dense", dict(_w4a16(32, 64, 64, 1).params), None),
          ("invariant", "moe", {"kernel": "moe_w4a16", "block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4,
                                "num_stages": 2}, None),
          # 4 x 2 N-tiles x 16x32 fp32 = 16 KiB per M tile: 32 rows per chunk at 32 KiB, 16 at the least cap
          ("split_k", "dense_k1024", dict(_w4a16(16, 32, 128, 4).params), 32768),
          ("split_k", "dense_k1024", dict(_w4a16(16, 32, 128, 4).params), 1),
          # split x top_k x N x 4 B per token: 16 tokens per chunk
          *[("moe_decode", kind, params, 16 * 4 * 2 * 64 * 4) for kind, params in (
              ("moe_k1024", _MOE_DECODE), ("moe_k1024", {**_MOE_DECODE, "route": "aligned"}),
              ("moe_k1024_reduce", _MOE_DECODE))]]


@pytest.fixture(scope="module")
def interpreted():
    """test -> [(cap, params, says, same, err, rows)] for _CASES: every case run by _ROWS in one
    process (TRITON_INTERPRET=1), each with its own workspace cap, so torch and Triton load once."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cases = [[kind, params, cap] for _, kind, params, cap in _CASES]
    r = subprocess.run([sys.executable, "-c", _ROWS, json.dumps(cases)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(rows) == len(_CASES)
    out: dict[str, list] = {}
    for (test, _, _, cap), row in zip(_CASES, rows):
        out.setdefault(test, []).append((cap, *row))
    return out


def test_invariant_triton_tactics_give_bit_identical_rows_at_batch_1_and_64(interpreted):
    rows = interpreted["invariant"]
    assert len(rows) == 3
    for _, params, says, same, err, _ in rows:
        assert says and same and err < 1e-2, params       # same: rows 0, 17, 63 alone, and one launch


def test_split_k_cut_into_row_chunks_gives_the_same_rows_at_every_m(interpreted):
    """A split-K tactic keeps its split at every M: where the workspace cap would be passed
    (made small here) the call is cut into row chunks, each with the whole split. Rows at batch 64
    (2 and 4 chunks) are bit-identical to batch 1 and to one launch with the whole split, and within
    NVFP4 error of float64. K = 1024 is
    8 K-steps: a different split sums them in another order and is not bit-identical in the
    interpreter (checked: split 1 vs 4 differ by 1e-6), so a launcher that lowered the split for
    large M, as before 2026-12-01, fails here."""
    rows = interpreted["split_k"]
    assert [(cap, n) for cap, _, _, _, _, n in rows] == [(32768, 32), (1, 16)]      # 2 and 4 chunks
    for cap, params, says, same, err, n in rows:
        assert says and same and err < 1e-2, (cap, n, same, err)


def test_moe_decode_split_k_cut_into_token_chunks_gives_the_same_rows_at_every_m(interpreted):
    """moe_decode keeps its split at every M too: a 64-token batch cut into 16-token chunks (each
    aligned on its own) gives rows bit-identical to the tokens alone, for the direct and the
    aligned route and the routing-reduce epilogue, and the whole batch bit-identical to one launch
    with the whole split. K = 1024 (8 K-steps, split 4): the old launcher lowered the split to 1
    here, and at this seed split 1 gives other bits than split 4 (checked), so it would fail."""
    rows = interpreted["moe_decode"]
    assert len(rows) == 3
    for cap, params, says, same, err, n in rows:
        assert n == 16 and says and same and err < 1e-2, (cap, params, n, same, err)


def test_batch_invariant_search_keeps_only_invariant_tactics_and_one_per_problem(tmp_path, register_family):
    fam = register_family("rowwise", "tests.families.rowwise:RowwiseFamily")
    store, p = Store(tmp_path / "c.db"), Problem.dense(1024, 256)
    rep = search([p], families=[fam, registry.get("torch")], store=store, buckets=Buckets.of((1, 4, 16)),
                 timer=FAST, env=cpu(), batch_invariant=True)
    winners = store.winners()
    assert sorted(w.bucket for w in winners) == [1, 4, 16] and len({w.tactic_id for w in winners}) == 1
    assert winners[0].family == "rowwise"
    timed = [t for t in store.trials() if t.status in ("ok", "dropped")]
    assert timed and all(t.family == "rowwise" for t in timed)       # torch's tactics never measured
    assert any("--batch-invariant: torch" not in n and "--batch-invariant: rowwise[" in n for n in rep.notes)
    assert [(w.bucket, w.tactic_id) for w in rep.winners] == [(w.bucket, w.tactic_id) for w in winners]


def test_one_per_problem_scores_by_the_geometric_mean_over_buckets():
    from autotune.core.records import Trial
    from autotune.engine.invariant import one_per_problem

    def tr(tid, b, us):
        return Trial("p", b, tid, "f", "{}", "d", "l", "ok", median_us=us)
    # a is best at M=1 only; b is 5 % off at M=1 and best elsewhere: b is the one tactic
    trials = [tr("a", 1, 10.0), tr("a", 8, 30.0), tr("b", 1, 10.5), tr("b", 8, 20.0), tr("c", 1, 9.0)]
    pick, cost = one_per_problem(trials, [1, 8], "none")
    assert pick.tactic_id == "b" and cost == pytest.approx(((10.5 / 9.0) * 1.0) ** 0.5)   # c has no M=8 time


@pytest.mark.gpu
def test_invariant_triton_tactics_give_bit_identical_rows_on_the_gpu(monkeypatch):
    """The same check compiled for the GPU, at GLM-5 TP8 shapes (gate_up 3072 x 6144, MoE w13),
    with a split-K tactic whose batch of 64 is cut into 4 row chunks (a small workspace cap): M = 1
    takes the bound launcher's direct route, M = 64 the chunked launch; and a split-8 moe_decode
    tactic whose 64 tokens are cut into 4 chunks of 16 (128 pairs each: the direct route, where the
    whole batch's 512 pairs would take the aligned one)."""
    import torch

    from autotune.core import inputs
    from autotune.tactics.triton_fp4 import moe_decode, splitk
    from autotune.tactics.triton_fp4.family import TritonFamily
    fam = TritonFamily()
    split = _w4a16(16, 64, 256, 8)
    monkeypatch.setattr(splitk, "MAX_WORKSPACE_BYTES", 8 * 48 * 16 * 64 * 4)      # 16 rows per launch at N = 3072
    monkeypatch.setattr(moe_decode, "MAX_WORKSPACE_BYTES", 8 * 8 * 512 * 4 * 16)  # 16 tokens per launch
    assert splitk.chunk_rows(split.params, 3072) == 16
    md_split = Tactic("triton", kernel="moe_decode", route="direct", block_m=16, block_n=64, block_k=128, split_k=8,
                      num_warps=4, num_stages=3)
    cases = [(Problem.dense(3072, 6144), _w4a16(16, 64, 128, 1)), (Problem.dense(3072, 6144), _w4a16(64, 128, 128, 1)),
             (Problem.dense(3072, 6144), split),
             (Problem.moe(512, 6144, 256, 8), Tactic("triton", kernel="moe_w4a16", block_m=16, block_n=64,
                                                     block_k=128, num_warps=4, num_stages=3)),
             (Problem.moe(512, 6144, 256, 8), md_split)]
    for p, t in cases:
        assert fam.batch_invariant(p, t)
        s = inputs.make_inputs(p, 64, "cuda", seed=3)[0]
        kern = fam.build(p, t, "cuda")
        many = kern(*s.args()).clone()
        for i in (0, 17, 63):
            one = kern(s.x[i:i + 1], s.w) if p.kind == "dense" else kern(s.x[i:i + 1], s.w, s.topk_ids[i:i + 1],
                                                                         s.topk_weights[i:i + 1])
            assert torch.equal(one[0], many[i]), (str(t), i)


def test_moe_decode_chunk_rule_has_one_home():
    """moe_decode's token chunk (split-K workspace cap) is autotune.tactics.triton_fp4.moe_decode.chunk_tokens:
    the launcher uses it."""
    from autotune.tactics.triton_fp4 import moe_decode
    p = Problem.moe(512, 6144, 256, 8)
    for sk in (1, 2, 8):
        params = {**moe_decode.default(p), "split_k": sk}
        tokens = moe_decode.chunk_tokens(params, p)
        assert moe_decode.MoEDecodeLauncher(p, params, "none").chunk_tokens() == tokens
        assert (tokens is None) == (sk == 1)
        if tokens:
            assert tokens * sk * p.top_k * p.n * 4 <= moe_decode.MAX_WORKSPACE_BYTES
