"""The measuring side's inputs (weights drawn once per problem, activations per bucket, sized
without being made) and bench/compare_winners.py's verdicts, on the CPU."""
import importlib.util
import sqlite3
from pathlib import Path

import pytest
import torch

from autotune.core import inputs
from autotune.core.problem import Problem
from autotune.engine.worker import Bench

DENSE = Problem.dense(256, 512)
MOE = Problem.moe(128, 256, experts=8, top_k=2)
W4A4 = Problem.dense(64, 256, "nvfp4", a_fmt="nvfp4")


@pytest.mark.parametrize("p", [DENSE, MOE, W4A4], ids=lambda p: p.kind + p.a_fmt)
@pytest.mark.parametrize("m", [1, 37])
def test_set_bytes_is_what_make_inputs_makes(p, m):
    assert inputs.set_bytes(p, m) == inputs.make_inputs(p, m, "cpu", seed=1)[0].nbytes()


@pytest.mark.parametrize("epilogue", ["none", "swiglu", "reduce"])
def test_the_grouped_reference_is_each_pairs_product_summed_as_the_epilogue_says(epilogue):
    """`inputs.references` (experts sorted once, each dequantized once for both sets) against the
    plain definition: every (token, slot) pair's x · W_e^T in float64, -1 pairs contributing nothing."""
    p = Problem.moe(64, 96, experts=6, top_k=3, epilogue=epilogue)
    w = inputs.seeded_weight(p, "cpu", 3)
    sets = [inputs.make_inputs(p, m, "cpu", seed=9 + m, weights=[w])[0] for m in (5, 7)]
    sets[1].topk_ids[2, 1] = -1
    sets[1].topk_ids[4, :] = -1
    got = inputs.references(p, sets)
    deq = [w.expert(e).dequantize(torch.float64) for e in range(p.experts)]
    for s, g in zip(sets, got):
        m = s.topk_ids.shape[0]
        pairs = torch.zeros(m, p.top_k, p.n, dtype=torch.float64)
        for t in range(m):
            for j in range(p.top_k):
                e = int(s.topk_ids[t, j])
                if e >= 0:
                    pairs[t, j] = (s.x[t, j] if s.x.ndim == 3 else s.x[t]).double() @ deq[e].T
        if epilogue == "swiglu":
            h = p.n // 2
            pairs = pairs[..., :h] * torch.sigmoid(pairs[..., :h]) * pairs[..., h:]
        want = pairs * s.topk_weights.double()[..., None]
        if epilogue == "reduce":
            want = want.sum(1)
        assert g.shape == want.shape and torch.allclose(g, want, rtol=1e-12, atol=1e-12)


def test_bench_draws_weights_once_per_problem_and_replays_the_same_inputs():
    a = Bench("cpu")
    a.setup(DENSE.key, 1, 0)
    w1, x1 = a._sets[0].w, a._sets[0].x
    a.setup(DENSE.key, 4, 0)
    assert a._sets[0].w is w1 and a._sets[0].x.shape == (4, DENSE.k)    # same weights, new activations
    a.setup(MOE.key, 4, 0)
    assert a._sets[0].w is not w1 and a._sets[0].topk_ids.shape == (4, 2)
    # a fresh worker (a restart replays the setup) draws exactly the same inputs
    b = Bench("cpu")
    b.setup(DENSE.key, 1, 0)
    assert torch.equal(b._sets[0].x, x1) and torch.equal(b._sets[0].w.packed, w1.packed)
    assert torch.equal(b._sets[0].w.scales.view(torch.uint8), w1.scales.view(torch.uint8))
    c = Bench("cpu")
    c.setup(DENSE.key, 1, 1)                                            # another seed, other inputs
    assert not torch.equal(c._sets[0].w.packed, w1.packed)


# -- bench/compare_winners.py -------------------------------------------------------------------

def _compare_module():
    spec = importlib.util.spec_from_file_location("compare_winners", Path(__file__).parents[1] / "bench" / "compare_winners.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _db(path, winners, trials=None):
    con = sqlite3.connect(path)
    con.execute("create table winners (problem_key, bucket, tactic_id, median_us)")
    con.executemany("insert into winners values (?, ?, ?, ?)", winners)
    if trials is not None:
        con.execute("create table trials (id integer primary key, problem_key, bucket, tactic_id, median_us, status)")
        con.executemany("insert into trials (problem_key, bucket, tactic_id, median_us, status) values (?, ?, ?, ?, ?)",
                        trials)
    con.commit()
    con.close()
    return str(path)


def test_compare_winners_tells_same_tied_different_and_missing(tmp_path):
    cw = _compare_module()
    a = _db(tmp_path / "a.db", [("p", 1, "t1", 10.0), ("p", 2, "t1", 10.0), ("p", 3, "t1", 10.0), ("p", 4, "t1", 1.0)],
            [("p", 2, "t2", 10.05, "ok"), ("p", 3, "t2", 12.0, "dropped")])
    b = _db(tmp_path / "b.db", [("p", 1, "t1", 10.0), ("p", 2, "t2", 10.0), ("p", 3, "t2", 10.0)],
            [("p", 2, "t1", 10.02, "ok"), ("p", 3, "t1", 10.5, "ok")])
    r = cw.compare(a, b)
    assert (r["pairs"], r["same"], r["tie"], r["differ"], r["missing"]) == (4, 1, 1, 1, 1)
    differ = next(row for row in r["rows"] if row.get("tie") is False)
    assert differ["bucket"] == 3 and differ["b_winner_in_a_status"] == "dropped"
    # an export holds winners only: a tie is judged by the cross timings that exist
    e = _db(tmp_path / "export.db", [("p", 2, "t2", 10.0)])
    assert cw.compare(a, e)["tie"] == 1


