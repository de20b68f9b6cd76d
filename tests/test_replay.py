"""The replay check (autotune.engine.replay): a tactic run as an engine serves it, under graph
replay with inputs refreshed in place, before it may win. Its proof is the `stalecache` test family
(tests/families/stalecache.py), wrong only when inputs change in place under fixed pointers."""
from __future__ import annotations

import math

import pytest
import torch

from autotune.cache import Store
from autotune.core import inputs
from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import replay, timing
from autotune.engine.options import Runner
from autotune.engine.search import search
from autotune.engine.strategies.successive_halving import Halving
from autotune.engine.worker import Bench
from autotune.tactics import registry
from autotune.tactics.scratch import ScratchPool

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
DENSE = Problem.dense(256, 512)
MOE = Problem.moe(128, 256, experts=8, top_k=2)
STALE, FRESH = Tactic("stalecache", mode="stale"), Tactic("stalecache", mode="fresh")


@pytest.fixture
def stale(register_family):
    return register_family("stalecache", "tests.families.stalecache:StaleCacheFamily")


def _bound(fam, problem, tactic, device, weight):
    pool = ScratchPool()
    word = pool.word(device, tactic.id)
    launcher = fam.bind(problem, tactic, weight, device)
    launcher.attach(pool, word)
    return launcher, pool, word


def test_stale_member_passes_every_eager_use_and_fails_only_under_replay(stale):
    """Its eager check passes, two eager calls on different tensors are right, and the replay
    check (recorded-call capture on the CPU) fails it; the fresh member passes the same check."""
    sets = inputs.make_inputs(DENSE, 8, "cpu", seed=3, n_sets=2)
    refs = [inputs.reference(DENSE, s) for s in sets]
    kernel = stale.build(DENSE, STALE, "cpu")
    assert inputs.check(DENSE, kernel, sets[0], refs[0]) < 1e-2
    for s, ref in zip(sets, refs):                    # two eager calls, two tensors: both right
        y = kernel(s.x, s.w)
        assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    got = replay.draw(DENSE, 8, "cpu", 11, sets[0].w)
    launcher, pool, word = _bound(stale, DENSE, STALE, "cpu", sets[0].w)
    with pytest.raises(replay.ReplayFailed, match="replay 1 .*largest row relative error"):
        replay.check(DENSE, launcher, got, "cpu", pool, word)
    launcher, pool, word = _bound(stale, DENSE, FRESH, "cpu", sets[0].w)
    r = replay.check(DENSE, launcher, got, "cpu", pool, word)
    assert r.mode == "recorded" and r.replays == replay.RECORDED_REPLAYS == 2 and r.max_row_err < 1e-2


def test_a_known_set_stands_as_the_first_seed_and_the_stale_member_still_fails(stale):
    """The search's draw: the job's set 0 and the reference its eager check used are the first
    seed as they are (no second float64 reference of them); the drawn seed is new, with a -1 slot
    for a grouped problem; a known set on another weight is refused."""
    s0 = inputs.make_inputs(DENSE, 8, "cpu", seed=3)[0]
    ref0 = inputs.reference(DENSE, s0)
    got = replay.draw(DENSE, 8, "cpu", 11, s0.w, known=(s0, ref0))
    assert got.sets[0] is s0 and got.refs[0] is ref0
    assert not torch.equal(got.sets[1].x, s0.x)
    assert torch.equal(got.refs[1], inputs.reference(DENSE, got.sets[1]))
    launcher, pool, word = _bound(stale, DENSE, STALE, "cpu", s0.w)
    with pytest.raises(replay.ReplayFailed, match="replay 1 .*largest row relative error"):
        replay.check(DENSE, launcher, got, "cpu", pool, word)
    m0 = inputs.make_inputs(MOE, 4, "cpu", seed=5)[0]
    moe = replay.draw(MOE, 4, "cpu", 11, m0.w, known=(m0, inputs.reference(MOE, m0)))
    assert int(moe.sets[1].topk_ids[-1, -1]) == -1 and bool((m0.topk_ids >= 0).all())
    other = inputs.make_inputs(DENSE, 8, "cpu", seed=4)[0]
    with pytest.raises(ValueError, match="another weight"):
        replay.draw(DENSE, 8, "cpu", 11, other.w, known=(s0, ref0))


@pytest.mark.parametrize("problem", [DENSE, MOE, Problem.moe(128, 256, experts=8, top_k=2, epilogue="reduce")], ids=["dense", "moe", "moe-reduce"])
def test_the_served_torch_launchers_pass_with_a_minus_one_slot(problem):
    """The torch family's bound launchers (out=None, routing as FP4MoE passes it), refreshed in place
    with the job's set 0 and a drawn set of other experts with one -1 slot, pass; the bad-id word
    stays clear."""
    b = Bench("cpu")
    b.setup(problem.key, 4, 0)
    fam = registry.get("torch")
    t = fam.default(problem, ARCHS["cpu"])
    out = b.replay(t)
    assert out["mode"] == "recorded" and out["max_row_err"] < 1e-2 and out["replays"] == replay.RECORDED_REPLAYS
    refs = b._replay_refs
    if problem.kind == "grouped_moe":
        a, c = refs.sets
        assert a is b._sets[0] and int((c.topk_ids == -1).sum()) == 1
        assert not torch.equal(a.topk_ids, c.topk_ids)          # other experts in each set


@pytest.mark.parametrize("problem", [DENSE, MOE], ids=["dense", "moe"])
def test_setup_draws_the_replay_seed_with_set_0_in_one_pass(problem):
    """The job's setup makes set 0's reference (the eager check's) and the replay seed's in one pass
    (a grouped problem's experts dequantized once for both): each equals its reference made alone;
    every finalist's replay check then reads them, and their row references, without drawing."""
    b = Bench("cpu")
    b.setup(problem.key, 4, 0)
    refs = b._replay_refs
    assert refs.sets[0] is b._sets[0] and b._ref is refs.refs[0]
    for s, ref in zip(refs.sets, refs.refs):
        assert torch.equal(ref, inputs.reference(problem, s))
    if problem.kind == "grouped_moe":
        assert int((refs.sets[1].topk_ids == -1).sum()) == 1
    fam = registry.get("torch")
    for t in [fam.default(problem, ARCHS["cpu"]), *fam.enumerate(problem, ARCHS["cpu"])][:3]:
        assert b.replay(t)["max_row_err"] < 1e-2
        assert b._replay_refs is refs                       # drawn once for the (problem, bucket)


def test_the_shared_row_reference_judges_as_the_reference_does():
    """row_error against a RowRef (made once per (problem, bucket)) equals row_error against the
    float64 reference it was made from; a per-pair output's -1 row is left out, NaN or not."""
    ref = torch.randn(4, 2, 32, dtype=torch.float64)
    ids = torch.tensor([[0, 1], [2, -1], [1, 0], [3, 2]], dtype=torch.int32)
    out = ref.to(torch.bfloat16)
    out[2, 1] += 0.5
    rr = replay.row_ref(ref, ids)
    assert rr.rows.shape == (7, 32) and rr.keep.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert replay.row_error(MOE, out, rr) == replay.row_error(MOE, out, ref, ids) > 1e-2
    out[1, 1] = float("nan")                                # the -1 pair: nothing reads it
    assert math.isfinite(replay.row_error(MOE, out, rr))
    out[0, 0] = float("inf")
    assert replay.row_error(MOE, out, rr) == math.inf


def test_a_later_replay_that_fails_is_named():
    """Every replay's row error is read after the last one (one host wait): a launcher right on the
    first refreshed seed and wrong on the second replay fails naming replay 2."""
    s = inputs.make_inputs(DENSE, 4, "cpu", seed=5)[0]
    refs = replay.draw(DENSE, 4, "cpu", 1, s.w)
    fam = registry.get("torch")
    t = fam.default(DENSE, ARCHS["cpu"])
    launcher, pool, word = _bound(fam, DENSE, t, "cpu", s.w)
    calls = []

    def wrong_on_fourth(x, *a, **kw):
        calls.append(1)
        y = launcher(x, *a, **kw)
        return y * 2 if len(calls) == 4 else y           # plan, capture, replay 1, replay 2

    wrong_on_fourth.caps = launcher.caps
    with pytest.raises(replay.ReplayFailed, match="replay 2 .*largest row relative error"):
        replay.check(DENSE, wrong_on_fourth, refs, "cpu", pool, word)


def test_a_wrong_row_fails_and_names_the_row_error():
    """row_error: the largest row's relative error; one wrong row among many fails."""
    ref = torch.randn(16, 64, dtype=torch.float64)
    out = ref.clone().to(torch.bfloat16)
    assert replay.row_error(DENSE, out, ref, None) < 1e-2
    out[5] = 0
    assert replay.row_error(DENSE, out, ref, None) == pytest.approx(1.0)
    out[5] = float("nan")
    assert replay.row_error(DENSE, out, ref, None) == float("inf")


def test_a_counter_left_armed_fails_the_check(stale):
    """After the replays every arrival counter of the attached pool is back at zero."""
    s = inputs.make_inputs(DENSE, 4, "cpu", seed=5)[0]
    launcher, pool, word = _bound(stale, DENSE, FRESH, "cpu", s.w)
    lock = pool.get(0, "splitk.locks", 8, torch.int32, "cpu", zero=True)
    lock[3] = 1                                      # an arrival the last CTA never reset
    with pytest.raises(replay.ReplayFailed, match="arrival counters of splitk.locks"):
        replay.check(DENSE, launcher, replay.draw(DENSE, 4, "cpu", 1, s.w), "cpu", pool, word)


@pytest.mark.parametrize("isolate", [True, False], ids=["worker", "inline"])
def test_a_search_never_stores_a_replay_only_failure_as_winner(tmp_path, stale, isolate):
    store = Store(tmp_path / "c.db")
    # host_window=0: never count-bound, however loaded the machine (a count-bound job may drop a
    # tactic on its check call and replays only the contenders: tests/test_halving_host.py)
    rep = search([DENSE], families=[stale], store=store, buckets=Buckets.of((1, 4)), timer=FAST, env=CPU,
                 runner=Runner(isolate=isolate, timeout_s=60), halving=Halving(host_window=0))
    for b in (1, 4):
        trials = {t.tactic_id: t for t in store.get_trials(DENSE.key, b, CPU.device_key)}
        assert trials[STALE.id].status == "failed" and "wrong under graph replay" in trials[STALE.id].reason
        assert trials[STALE.id].rel_err is not None and trials[STALE.id].rel_err < 1e-2   # its eager check passed
        assert trials[FRESH.id].status == "ok" and trials[FRESH.id].replay_checked      # every finalist replayed
    # which passing tactic is fastest depends on the machine; none that failed under replay wins
    winners = store.winners()
    assert {w.bucket for w in winners} == {1, 4}
    assert all(w.replay_checked and w.tactic_id != STALE.id for w in winners)
    replayed = [t for t in store.trials() if t.replay_checked or "wrong under graph replay" in t.reason]
    assert rep.stages.data["replay check"][0] == len(replayed) >= 4    # its own stage: each replayed once


@pytest.mark.gpu
@pytest.mark.parametrize("room", [replay.ROOM_BYTES, 1 << 60], ids=["keeps-cache", "empties-cache"])
def test_a_real_cuda_graph_fails_the_stale_member_and_passes_the_fresh(stale, monkeypatch, room):
    """Both captures: begun directly (the allocator's cache kept) and, without room, torch.cuda.graph."""
    monkeypatch.setattr(replay, "ROOM_BYTES", room)
    s = inputs.make_inputs(DENSE, 8, "cuda", seed=3)[0]
    got = replay.draw(DENSE, 8, "cuda", 11, s.w)
    launcher, pool, word = _bound(stale, DENSE, STALE, "cuda", s.w)
    with pytest.raises(replay.ReplayFailed, match="largest row relative error"):
        replay.check(DENSE, launcher, got, "cuda", pool, word)
    launcher, pool, word = _bound(stale, DENSE, FRESH, "cuda", s.w)
    r = replay.check(DENSE, launcher, got, "cuda", pool, word)
    assert r.mode == "cuda graph" and r.max_row_err < 1e-2


@pytest.mark.gpu
def test_a_search_on_the_gpu_never_stores_the_stale_member(tmp_path, stale):
    store = Store(tmp_path / "c.db")
    search([DENSE], families=[stale], store=store, buckets=Buckets.of((4,)), timer=FAST)
    trials = {t.tactic_id: t for t in store.trials()}
    # the fastest in every eager timing, so a contender: replayed under a real graph and failed there
    assert trials[STALE.id].status == "failed" and "wrong under graph replay" in trials[STALE.id].reason
    winners = store.winners()      # FRESH (2 ms slower) or the GPU's designated default
    assert winners and all(w.replay_checked and w.tactic_id != STALE.id for w in winners)


@pytest.mark.parametrize("kw,epilogue", [({}, "none"), ({"split_k": 2, "tiles_n": 2}, "reduce")],
                         ids=["moe_mma", "moe_mma-splitk-reduce"])
def test_the_cuda_moe_launcher_passes_on_its_cpu_runner(register_family, kw, epilogue):
    """The cuda family's MoE launcher (its repeat path, scratch outputs, split-K counters and the
    per-token reduce), bound as the runtime binds it and run by its CPU runner: the replay check
    passes and its counters come back to rest."""
    register_family("cudamoecpu", "tests.families.cuda_moe_cpu:CudaMoeCpu")
    p = Problem.moe(64, 256, 6, 2, epilogue=epilogue)
    t = Tactic("cudamoecpu", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1)
    t = Tactic("cudamoecpu", **{**t.params, **kw})
    b = Bench("cpu")
    b.setup(p.key, 4, 0)
    b.check(t)
    out = b.replay(t)
    assert out["mode"] == "recorded" and out["max_row_err"] < 1e-2


_INTERPRETED = r"""
import json, sys
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine.worker import Bench
out = []
for kind, m, params in json.loads(sys.argv[1]):
    p = {"dense": Problem.dense(64, 512), "moe": Problem.moe(64, 512, 4, 2),
         "moe_reduce": Problem.moe(64, 512, 4, 2, epilogue="reduce")}[kind]
    b = Bench("cpu")
    b.setup(p.key, m, 0)
    t = Tactic("triton", params)
    b.check(t)
    r = b.replay(t)
    out.append([kind, r["mode"], r["max_row_err"]])
print(json.dumps(out))
"""


def test_triton_launchers_pass_under_the_interpreter():
    """The Triton family's bound launchers (split-K with its arrival counters, moe_decode's direct
    and aligned routes, the routing-reduce epilogue) under TRITON_INTERPRET=1 pass the replay check:
    called with out=None, replayed with inputs refreshed in place (a -1 slot included), counters at
    rest afterwards."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    dec = {"kernel": "moe_decode", "route": "direct", "block_m": 16, "block_n": 32, "block_k": 128, "split_k": 2,
           "num_warps": 4, "num_stages": 2}
    cases = [["dense", 3, {"kernel": "w4a16_dequant", "block_m": 16, "block_n": 32, "block_k": 128, "group_m": 1,
                           "num_warps": 4, "num_stages": 2, "split_k": 2}],
             ["moe", 2, dec], ["moe", 2, {**dec, "route": "aligned"}], ["moe_reduce", 2, dec]]
    env = {**os.environ, "TRITON_INTERPRET": "1", "TRITON_DEFAULT_FP_FUSION": "1",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run([sys.executable, "-c", _INTERPRETED, json.dumps(cases)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(got) == 4 and all(mode == "recorded" and err < 1e-2 for _, mode, err in got), got
