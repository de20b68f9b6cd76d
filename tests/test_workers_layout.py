"""The engine's Bench times a tactic on its family's own weight layout, packed once per weight of a
problem (as a bound layer packs at load; the weights are kept across the problem's buckets), so
packing never runs inside a timed call."""
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.worker import Bench

P = Problem.dense(64, 128)


def test_bench_packs_each_weight_once_per_problem(register_family, monkeypatch):
    from tests.families import packed_layout as mod
    monkeypatch.setattr(timing, "sets_for_cold_l2", lambda *a, **k: 3)   # a rotation, as on a GPU
    register_family("packedtorch", "tests.families.packed_layout:PackedTorch")
    mod.PACKS.clear()
    t = Tactic("packedtorch", dequant_dtype="fp32", chunk_n=0)
    b = Bench("cpu")
    b.setup(P.key, 3, 0)
    assert b.check(t)["rel_err"] < 1e-2            # the kernel refuses a plain FP4Weight: it got the pack
    n_sets = len(b._sets)
    assert n_sets == 3
    packs_after_check = len(mod.PACKS)
    r = b.time(t, timing.TimerConfig(max_reps=5, min_reps=5))
    assert r["reps"] == 5
    assert len(mod.PACKS) == n_sets and packs_after_check == 1          # once per set, not per call
    b.time(t, timing.TimerConfig(max_reps=5, min_reps=5))
    assert len(mod.PACKS) == n_sets                                     # reused within the bucket
    b.setup(P.key, 5, 0)
    b.check(t)
    b.time(t, timing.TimerConfig(max_reps=5, min_reps=5))
    assert len(b._sets) == n_sets and len(mod.PACKS) == n_sets          # a new bucket, same weights: no repack
    other = Problem.dense(64, 256)
    b.setup(other.key, 3, 0)
    b.check(t)
    assert len(mod.PACKS) == n_sets + 1                                 # a new problem's weights are packed
    b.time(t, timing.TimerConfig(max_reps=5, min_reps=5))
    assert len(mod.PACKS) == 2 * n_sets
    # a plain-layout family is handed the FP4Weight itself
    torch_t = Tactic("torch", dequant_dtype="fp32", chunk_n=0)
    assert b._args(torch_t, 0)[1] is b._sets[0].w
