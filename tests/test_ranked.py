"""--strategy ranked: the model (features, LightGBM fit, JSON artifact, tree walk), the Ranker's
batches and adaptive stop, the search on the CPU with a model fitted on the CPU's own trials, the
fallback without a model, and the offline evaluation on the committed H200 cache."""
import json
import math
import sys
from pathlib import Path

import pytest
from helpers import keyed

from autotune import api
from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, batches as ranked
from autotune.engine.search import search
from autotune.cache import Store
from autotune.tactics import registry

ROOT = Path(__file__).resolve().parent.parent
CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
PROBLEMS = [Problem.dense(2048, 512), Problem.dense(1024, 256)]
TINY = ranked.Ranked(min_first=2, first_share=0.0, step=1, stop_margin=0.03, max_share=0.6)


def _search(store, **kw):
    return search(PROBLEMS, families=[registry.get("torch")], store=store, buckets=Buckets.of((1, 8, 32)),
                  timer=FAST, env=CPU, **kw)


def _plan(preds, cfg=TINY, extras=()):
    ts = [Tactic("t", i=i) for i in range(len(preds))]
    return ts, ranked.plan_for(ts, preds, [ts[i] for i in extras], cfg=cfg)


def test_ranker_measures_the_top_then_stops_when_the_rest_is_predicted_slower():
    ts, plan = _plan([0.0, 0.01, 0.02, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6], extras=(9,))
    stored = {t.id: 10.0 * 2 ** p for t, p in zip(ts, plan.pred)}      # the model is exactly right
    measured, win = ranked.simulate(plan, stored, ts[9].id)
    # first batch: the top 2 and the extra; then one at a time while within 3 % of the best
    assert measured == [plan.order[0].id, plan.order[1].id, ts[9].id, plan.order[2].id]
    assert win == min(plan.order[0].id, plan.order[1].id)      # within 1 % of each other: the smaller id


def test_ranker_measures_on_while_the_model_was_too_optimistic():
    ts, plan = _plan([0.0, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09])
    stored = {t.id: 100.0 - i for i, t in enumerate(plan.order)}    # the truth runs against the model
    measured, win = ranked.simulate(plan, stored, ts[0].id)
    assert len(measured) == 6 and measured == [t.id for t in plan.order[:6]]    # the cap: 60 % of 10
    assert win == plan.order[5].id


def test_a_resumed_job_walks_the_same_batches_and_measures_nothing_twice():
    """Resume = the fresh job's batches with the stored times: over random plans (sizes, knobs,
    extras, times), a job resumed from what a fresh run measured measures nothing and picks the
    same winner; resumed from half of it, it measures only what the fresh run measured."""
    import random
    for seed in range(3000):
        r = random.Random(seed)
        n = r.randint(1, 12)
        ts = [Tactic("t", i=i) for i in range(n)]
        preds = [r.uniform(0, 0.2) for _ in ts]
        cfg = ranked.Ranked(min_first=r.randint(1, 3), first_share=0.0, step=r.randint(1, 3),
                            stop_margin=r.choice([0.0, 0.03, 0.1]), max_share=r.choice([0.3, 0.6, 1.0]))
        extras = r.sample(ts, r.randint(0, min(2, n)))
        stored = {t.id: r.uniform(1, 2) for t in ts}
        fresh, win = ranked.simulate(ranked.plan_for(ts, preds, extras, cfg=cfg), stored, ts[0].id)
        again, win2 = ranked.simulate(ranked.plan_for(ts, preds, extras, {i: stored[i] for i in fresh}, cfg),
                                      stored, ts[0].id)
        assert (again, win2) == ([], win), seed
        half = fresh[:len(fresh) // 2]        # interrupted: the first half of the fresh run is stored
        rest, win3 = ranked.simulate(ranked.plan_for(ts, preds, extras, {i: stored[i] for i in half}, cfg),
                                     stored, ts[0].id)
        assert sorted(half + rest) == sorted(fresh) and win3 == win, seed


def test_model_json_roundtrip_tree_walk_matches_lightgbm(tmp_path):
    lgb = pytest.importorskip("lightgbm")
    rows = [{"a": float(i % 7), "b": float(i % 3), "p.kernel=x": float(i % 2)} for i in range(300)]
    y = [r["a"] * 0.3 - r["b"] + 0.5 * r["p.kernel=x"] for r in rows]
    m = rankmodel.fit(rows, y, {"arch": "cpu"}, rounds=30)
    path = rankmodel.save(m, tmp_path / "m.json")
    text = path.read_text()
    assert json.loads(text)["format"] == rankmodel.FORMAT            # JSON, never a pickle
    back = rankmodel.load(path)
    import numpy as np
    want = lgb.Booster(model_str=m.booster).predict(np.array([m.vector(r) for r in rows]))
    assert back.predict(rows) == pytest.approx(list(want), abs=1e-12)
    assert back.covers(ARCHS["cpu"]) and not back.covers(ARCHS["sm120"])
    (tmp_path / "bad.json").write_text(json.dumps({"format": rankmodel.FORMAT, "version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        rankmodel.load(tmp_path / "bad.json")


def test_features_come_from_the_tactic_and_its_family():
    p, t = Problem.dense(3072, 6144), Tactic("triton", kernel="w4a16_dequant", block_m=16, block_n=64, block_k=256,
                                             group_m=1, num_warps=4, num_stages=3, split_k=8)
    f = rankdata.row(p, t, 1, ARCHS["sm90"], 132, 40960)
    assert f["p.kernel=w4a16_dequant"] == 1.0 and f["p.split_k"] == 3.0 and f["family=triton"] == 1.0
    assert f["waves"] == pytest.approx(1 * 48 * 8 / 132)                # ceil(1/16) * 3072/64 * split 8
    assert f["occupancy"] == 5.0                                         # 233472 B per SM / 40 KiB
    other = rankdata.row(p, Tactic("torch", dequant_dtype="bf16", chunk_n=0), 1, ARCHS["sm90"], 132, None)
    assert "waves" not in other and other["p.dequant_dtype=bf16"] == 1.0


def test_ranked_search_on_the_cpu_measures_less_and_finds_every_winner(tmp_path):
    pytest.importorskip("lightgbm")
    first = Store(tmp_path / "halving.db")
    full = _search(first)
    [(path, model)] = api.fit_rank(first)
    assert path.endswith("halving.db.rank-cpu.json") and model.key["arch"] == "cpu"
    again = Store(tmp_path / "ranked.db")
    # one = the model's top, the default and the neighbours' winners: at most 3 of the 4 kept
    # tactics at m=1 and m=32 (one neighbour each), whatever the CPU's timings are
    one = ranked.Ranked(min_first=1, first_share=0.0, step=1, max_share=0.25)
    rep = _search(again, strategy="ranked", rank_model=path, ranked=one)
    assert any("--strategy ranked: rank model" in n for n in rep.notes)
    assert {(w.problem_key, w.bucket) for w in rep.winners} == {(w.problem_key, w.bucket) for w in full.winners}
    assert 0 < rep.measured < full.measured
    assert all(len(again.get_trials(p.key, b, CPU.device_key)) <= 3 for p in PROBLEMS for b in (1, 32))
    resumed = _search(again, strategy="ranked", rank_model=path, ranked=one)      # nothing new to measure
    assert resumed.measured == 0
    # the warm starts of a finished job changed (a neighbour's winner is now a tactic never timed
    # at m=1): the job is still finished, its winner stays
    from autotune.core.records import Winner
    lib = CPU.lib_key(("torch",))
    p = PROBLEMS[0]
    timed = {t.tactic_id for t in again.get_trials(p.key, 1, CPU.device_key)}
    # a kept tactic (with_neighbours ignores a rejected one: chunk_n=2048 here); p has 4 kept torch
    # tactics and `one` times at most 3 at m=1 (top 1, the default, one neighbour's winner)
    torch_ = registry.get("torch")
    kept = [t for t in torch_.enumerate(p, ARCHS["cpu"]) if torch_.verdict(p, t, ARCHS["cpu"]).ok is True]
    assert len(kept) == 4 and len(timed) <= 3
    other = next((t for t in kept if t.id not in timed), None)
    assert other is not None
    before = {(w.problem_key, w.bucket): w.tactic_id for w in again.winners(CPU.device_key)}
    again.put_winner(keyed(Winner(p.key, 8, CPU.device_key, other.id, "torch", other.to_json(), lib, 1.0, other.id,
                                  None, None)))
    resumed = _search(again, strategy="ranked", rank_model=path, ranked=one)
    assert resumed.measured == 0
    assert {(w.problem_key, w.bucket): w.tactic_id for w in resumed.winners} == before


def test_ranked_without_a_model_for_the_arch_halves_as_before(tmp_path):
    m = rankmodel.Model(["a"], "", {"arch": "sm90"})
    store = Store(tmp_path / "c.db")
    rep = _search(store, strategy="ranked", rank_model=m)
    assert any("no data for cpu" in n and "successive halving" in n for n in rep.notes)
    assert rep.measured == _search(Store(tmp_path / "d.db")).measured
    rep = _search(Store(tmp_path / "e.db"), strategy="ranked")      # nothing next to the cache
    assert any("no rank model" in n for n in rep.notes)


def test_offline_evaluation_on_the_committed_h200_cache(tmp_path):
    """bench/rank_eval.py on docs/data/2026-11-30-h200x2-full-search.db.xz. To stay near a minute on two
    busy cores: every leave-one-problem-out fold (6), leave-one-bucket-out on every 7th bucket
    (3 folds) and 150 boosting rounds instead of 300 (docs/search.md has the full run)."""
    pytest.importorskip("lightgbm")
    sys.path.insert(0, str(ROOT / "bench"))
    import rank_eval
    out = tmp_path / "eval.json"
    rc = rank_eval.main([str(ROOT / "docs/data/2026-11-30-h200x2-full-search.db.xz"), "--lobo-every", "7",
                         "--rounds", "150", "--json", str(out)])
    summary = json.loads(out.read_text())["summary"]
    assert summary["lopo"]["groups"] == 126 and summary["lobo"]["groups"] == 18
    for s in summary.values():
        assert s["share"] <= rank_eval.TARGET_SHARE and s["within"] >= rank_eval.TARGET_HITS
        assert not math.isnan(s["worst_gap"])
    assert rc == 0


def test_plans_warm_start_from_neighbours_and_measure_never_seen_members(tmp_path):
    from autotune.core.records import Winner
    from autotune.core.tactic import Verdict
    from autotune.engine.strategies.ranked import plans as strategy
    from autotune.engine.search import Planned, _Work
    pytest.importorskip("lightgbm")
    p, arch = Problem.dense(2048, 512), ARCHS["cpu"]
    seen = [Tactic("torch", dequant_dtype="fp32", chunk_n=c) for c in (0, 512)]
    new = [Tactic("torch", dequant_dtype="bf16", chunk_n=c) for c in (0, 512)]
    rows = [rankdata.row(p, t, m, arch, 2, None) for t in seen for m in (1, 8, 64)] * 10
    model = rankmodel.fit(rows, [0.5] * len(rows), {"arch": "cpu"}, rounds=5)
    work = [_Work(p, [Planned(p, t, Verdict.keep()) for t in seen + new], seen[0])]
    store = Store(tmp_path / "c.db")
    cfg = ranked.Ranked(min_first=2, first_share=0.0, step=1)     # up to 2 never-seen extras
    plans = strategy.plans(model, work, [1, 8, 64], arch, 2, store, CPU.device_key, cfg)
    plan = plans[(p.key, 8)]
    # the default, then both never-seen (bf16) tactics: the model has no feature for them
    assert plan.extras[0] == seen[0] and set(plan.extras[1:]) == set(new)
    # warm start: the winner stored for bucket 1 (a neighbour of 8) joins the extras, 64's too
    store.put_environment(CPU, ("torch",))
    lib = CPU.lib_key(("torch",))
    for b, t in ((1, seen[1]), (64, new[1])):     # measured by other code first: no warm start from it
        store.put_winner(Winner(p.key, b, CPU.device_key, t.id, "torch", t.to_json(), lib, 1.0, seen[0].id, None, None))
    assert strategy.with_neighbours(plan, store, p, 8, [1, 8, 64], CPU.device_key, {"torch": lib}).extras == plan.extras
    for b, t in ((1, seen[1]), (64, new[1])):
        store.put_winner(keyed(Winner(p.key, b, CPU.device_key, t.id, "torch", t.to_json(), lib, 1.0, seen[0].id,
                                      None, None)))
    warm = strategy.with_neighbours(plan, store, p, 8, [1, 8, 64], CPU.device_key, {"torch": lib})
    assert seen[1] in warm.extras and new[1] in warm.extras
    assert strategy.with_neighbours(plan, store, p, 8, [1, 8, 64], CPU.device_key, {"torch": "other"}).extras == plan.extras


def _jobs(store, path, cfg, **kw):
    """The jobs a ranked search would run on `store` (plan, static rejections, plans, jobs)."""
    from autotune.engine.search import SearchOptions, _Search
    s = _Search(PROBLEMS, [registry.get("torch")], store, Buckets.of((1, 8, 32)),
                SearchOptions(timer=FAST, env=CPU, strategy="ranked", rank_model=path, ranked=cfg, **kw))
    work = s.store_static(s.plan(), s.runnable())
    s.prepare(work)
    return s, {(j.problem.key, j.bucket): j for j in s.jobs(work)}


def test_retry_failed_reopens_a_finished_ranked_job_with_a_failure_outside_its_first_batch(tmp_path):
    pytest.importorskip("lightgbm")
    from autotune.engine.strategies.ranked import plans as strategy
    from autotune.engine.search import _trial
    first = Store(tmp_path / "halving.db")
    _search(first)
    [(path, _)] = api.fit_rank(first)
    store = Store(tmp_path / "ranked.db")
    one = ranked.Ranked(min_first=1, first_share=0.0, step=1, max_share=0.25)
    _search(store, strategy="ranked", rank_model=path, ranked=one)
    s, jobs = _jobs(store, path, one)
    p = PROBLEMS[0]
    job = jobs[(p.key, 1)]
    assert job.tactics == ()                   # finished: nothing to do without --retry-failed
    first_ids = set(strategy.first_ids(job.rank))
    bad = next(t for t in job.rank.order if t.id not in first_ids)
    store.put_trial(_trial(p, 1, bad, CPU, s.lib_keys, "failed", "boom"))
    assert _jobs(store, path, one)[1][(p.key, 1)].tactics == ()
    retry = _jobs(store, path, one, retry_failed=True)[1][(p.key, 1)].tactics
    assert bad.id in {t.id for t in retry}     # the failure is measured again


def test_with_neighbours_rereads_the_stored_times(tmp_path):
    """A job taken over from another search: the times that search stored after `plans` ran are in
    the plan the job starts with (its stop rule counts them), under this search's library keys."""
    from autotune.core.records import Trial
    from autotune.core.tactic import Verdict
    from autotune.engine.strategies.ranked import plans as strategy
    from autotune.engine.search import Planned, _Work
    pytest.importorskip("lightgbm")
    p, arch = Problem.dense(2048, 512), ARCHS["cpu"]
    ts = [Tactic("torch", dequant_dtype=d, chunk_n=c) for d in ("fp32", "bf16") for c in (0, 512)]
    rows = [rankdata.row(p, t, m, arch, 2, None) for t in ts for m in (1, 8)] * 10
    model = rankmodel.fit(rows, [0.5] * len(rows), {"arch": "cpu"}, rounds=5)
    work = [_Work(p, [Planned(p, t, Verdict.keep()) for t in ts], ts[0])]
    store = Store(tmp_path / "c.db")
    store.put_environment(CPU, ("torch",))
    lib = CPU.lib_key(("torch",))
    plan = strategy.plans(model, work, [1, 8], arch, 2, store, CPU.device_key, ranked.Ranked())[(p.key, 8)]
    assert plan.known == {}

    def put(t, status, us, lib_key=lib, key=keyed):
        store.put_trial(key(Trial(p.key, 8, t.id, "torch", t.to_json(), CPU.device_key, lib_key, status, "",
                                  median_us=us)))
    put(ts[1], "ok", 3.0)           # stored meanwhile by another search
    put(ts[2], "dropped", 5.0)
    put(ts[3], "failed", None)
    put(ts[0], "ok", 1.0, "other-libs")
    put(ts[0], "ok", 0.5, key=lambda t: t)      # no code key: measured by other code
    warm = strategy.with_neighbours(plan, store, p, 8, [1, 8], CPU.device_key, {"torch": lib})
    assert warm.known == {ts[1].id: 3.0, ts[2].id: 5.0}


def test_rank_eval_sklearn_learner_restores_rankmodel_fit(tmp_path, monkeypatch):
    """bench/rank_eval.py --learner sklearn swaps rankmodel.fit for its own call only (CI runs
    main() in-process): the LightGBM fit is back afterwards, also when the evaluation raises."""
    sys.path.insert(0, str(ROOT / "bench"))
    import rank_eval
    fit, seen = rankmodel.fit, []

    def boom(*a, **k):
        seen.append(rankmodel.fit)
        raise RuntimeError("boom")
    monkeypatch.setattr(rank_eval, "evaluate", boom)
    Store(tmp_path / "c.db").close()
    with pytest.raises(RuntimeError, match="boom"):
        rank_eval.main([str(tmp_path / "c.db"), "--learner", "sklearn"])
    assert seen == [rank_eval._Sklearn.fit] and rankmodel.fit is fit


def test_every_kernel_gets_its_best_predicted_tactic_into_the_first_batch():
    """The trees rank configs of one kernel better than kernels against each other (without this rule
    the main job of 2026-12-05 on an H200 never measured moe_mma on w2:reduce from M = 32 up): a kernel with no tactic in the first
    batch adds its best-predicted one; one already there, or in the extras, adds nothing."""
    from autotune.engine.strategies.ranked import plans as strategy
    a = [Tactic("cuda", kernel="moe_a", warps_k=w) for w in (1, 2, 4)]
    b = [Tactic("cuda", kernel="moe_b", warps_k=w) for w in (1, 2)]
    c = [Tactic("triton", block_m=m) for m in (16, 32)]
    order = (a[0], a[1], a[2], c[0], b[1], b[0], c[1])          # predicted order
    cfg = ranked.Ranked(min_first=2, first_share=0.0, step=1)
    plan = ranked.RankPlan(order, tuple(range(len(order))), (a[0],), {}, cfg)
    out = strategy.every_member(plan)
    assert ranked.Ranker(out).first == 2
    assert out.extras == (a[0], c[0], b[1])                       # triton's and moe_b's best predicted
    assert out.order == plan.order and out.pred == plan.pred
    assert strategy.every_member(ranked.RankPlan(order, plan.pred, (a[0], c[1], b[0]), {}, cfg)).extras == \
        (a[0], c[1], b[0])                                        # each kernel already in: nothing added
    off = ranked.RankPlan(order, plan.pred, (a[0],), {}, ranked.Ranked(min_first=2, first_share=0.0, step=1,
                                                                    every_kernel=False))
    assert strategy.every_member(off) is off                      # the knob turns it off
    first = next(iter(ranked.Ranker(out).batches({})))
    assert {strategy.kernel_of(t) for t in first} == {("cuda", "moe_a"), ("cuda", "moe_b"), ("triton", "")}


def test_the_torch_reference_gets_no_first_batch_slot_of_its_own_for_grouped_moe():
    """Its grouped MoE is a host loop over the experts (100-400x the grouped kernels on the H100):
    every_member leaves it out there, keeps it for dense (dequantize + cuBLAS, a prefill candidate),
    and a plan without its problem (older callers) is unchanged."""
    from autotune.core.problem import Problem
    from autotune.engine.strategies.ranked import plans as strategy
    a = [Tactic("cuda", kernel="moe_a", warps_k=w) for w in (1, 2)]
    t = [Tactic("torch", dequant_dtype="bf16", chunk_n=c) for c in (0, 512)]
    order = (a[0], a[1], t[1], t[0])
    cfg = ranked.Ranked(min_first=1, first_share=0.0, step=1)
    plan = ranked.RankPlan(order, tuple(range(len(order))), (), {}, cfg)
    moe, dense = Problem.moe(6144, 256, 257, 9), Problem.dense(6144, 1536)
    assert strategy.every_member(plan, moe).extras == ()
    assert strategy.every_member(plan, dense).extras == (t[1],)
    assert strategy.every_member(plan).extras == (t[1],)
