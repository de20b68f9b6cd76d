"""--strategy predict (issue 48 item 2) on the CPU: the rank model's first choice per (problem,
bucket), checked against float64, stored as a predicted winner and served on its own rung; a
measured search replaces it, a prediction never replaces a measured winner, exports leave it out
unless asked; without a model for the arch nothing is predicted and the notes name the defaults."""
import pytest
import torch
from helpers import keyed

from autotune.cache import Store
from autotune.core import inputs
from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel
from autotune.engine.search import search
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.table import LazyDefault, Table
from autotune.tactics import registry

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
P = Problem.dense(2048, 512)
BUCKETS = (1, 8, 32)
TORCH = registry.get("torch")


def _kept():
    return [t for t in TORCH.enumerate(P, ARCHS["cpu"]) if TORCH.verdict(P, t, ARCHS["cpu"]).ok is True]


def _model(best: Tactic):
    """A model that puts `best` first at every M (fitted on made-up targets: 0 for it, 1 for the rest)."""
    pytest.importorskip("lightgbm")
    kept = _kept()
    rows = [rankdata.row(P, t, m, ARCHS["cpu"], 2, None) for t in kept for m in (1, 8, 32, 64)] * 10
    y = [0.0 if t == best else 1.0 for t in kept for _ in (1, 8, 32, 64)] * 10
    return rankmodel.fit(rows, y, {"arch": "cpu"}, rounds=10)


def _search(store, **kw):
    return search([P], families=[TORCH], store=store, buckets=Buckets.of(BUCKETS), timer=FAST, env=CPU, **kw)


def test_predict_stores_checked_first_choices_served_on_their_rung_until_a_measured_search_replaces_them(tmp_path):
    best = next(t for t in _kept() if t != TORCH.default(P, ARCHS["cpu"]))
    store = Store(tmp_path / "c.db")
    rep = _search(store, strategy="predict", rank_model=_model(best))
    assert rep.measured == 0 and rep.predicted == len(BUCKETS)
    ws = store.winners(CPU.device_key)
    assert [(w.bucket, w.tactic_id, w.predicted) for w in ws] == [(b, best.id, True) for b in BUCKETS]
    assert all(w.replay_checked for w in ws)       # checked under (recorded-call) replay as served
    assert rep.stages.data["replay check"][0] == len(BUCKETS)
    assert not any(store.get_trials(P.key, b, CPU.device_key) for b in BUCKETS)     # nothing timed, nothing failed
    d = Dispatcher(store, env=CPU, record_misses=False, warn=False)
    assert d.rung_for(P, 8) == ("predicted", best)
    assert d.rung_for(P, 5)[0] == "default"          # nearest takes measured winners only
    s = inputs.make_inputs(P, 8, "cpu", seed=1)[0]
    y, ref = d((8, P.n, P.k))(s.x, s.w), inputs.reference(P, s)
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert d.stats["predicted"] == 1 and d.stats["hit"] == 1

    measured = _search(store, strategy="halving")
    assert measured.measured > 0
    assert not any(w.predicted for w in store.winners(CPU.device_key))
    d = Dispatcher(store, env=CPU, record_misses=False, warn=False)
    assert d.rung_for(P, 8)[0] == "exact" and d.rung_for(P, 5)[0] == "nearest"

    again = _search(store, strategy="predict", rank_model=_model(best))      # measured buckets are left alone
    assert again.predicted == 0
    before = store.winners(CPU.device_key)
    w = before[0]
    store.put_winner(Winner(w.problem_key, w.bucket, w.device_key, best.id, "torch", best.to_json(), w.lib_key, 1.0,
                            w.default_tactic_id, None, None, w.code_key, predicted=True))
    assert store.winners(CPU.device_key) == before     # a prediction never replaces a measured winner


def test_predict_never_stores_a_first_choice_wrong_only_under_replay(tmp_path, register_family):
    """A model that puts the stalecache family's `stale` member first (its eager check passes; it is
    wrong only when inputs change in place under fixed pointers): predict replay-checks it, stores it
    as a failed trial, "wrong under graph replay", and predicts nothing there."""
    pytest.importorskip("lightgbm")
    fam = register_family("stalecache", "tests.families.stalecache:StaleCacheFamily")
    p = Problem.dense(256, 512)
    stale, fresh = Tactic("stalecache", mode="stale"), Tactic("stalecache", mode="fresh")
    ts = (stale, fresh, TORCH.default(p, ARCHS["cpu"]))        # the designated default joins the plan
    rows = [rankdata.row(p, t, m, ARCHS["cpu"], 2, None) for t in ts for m in (1, 4, 16)] * 20
    model = rankmodel.fit(rows, [0.0 if t == stale else 1.0 for t in ts for _ in (1, 4, 16)] * 20,
                          {"arch": "cpu"}, rounds=10)
    store = Store(tmp_path / "c.db")
    rep = search([p], families=[fam], store=store, buckets=Buckets.of((1, 4)), timer=FAST, env=CPU,
                 strategy="predict", rank_model=model)
    assert rep.predicted == 0 and not store.winners()
    for b in (1, 4):
        [t] = store.get_trials(p.key, b, CPU.device_key)
        assert t.tactic_id == stale.id and t.status == "failed" and "wrong under graph replay" in t.reason
        assert t.rel_err is not None and t.rel_err < 1e-2                 # its eager check passed


def test_predict_plans_the_first_choice_a_ranked_plan_orders_first(tmp_path):
    """plans.firsts (predict's plan: one prediction, no stored times, no extras) gives each (problem,
    bucket) the tactic `plans.plans` orders first; the model's matrix and its feature-major tree walk
    give what its row vectors and the row-major walk give."""
    import numpy as np
    from autotune.engine.planning import Planned
    from autotune.engine.search import _Work
    from autotune.engine.strategies.ranked import batches, plans
    best = next(t for t in _kept() if t != TORCH.default(P, ARCHS["cpu"]))
    model = _model(best)
    dflt = TORCH.default(P, ARCHS["cpu"])
    work = [_Work(P, [Planned(P, t, TORCH.verdict(P, t, ARCHS["cpu"])) for t in _kept()], dflt)]
    got = plans.firsts(model, work, BUCKETS, ARCHS["cpu"], 2)
    full = plans.plans(model, work, BUCKETS, ARCHS["cpu"], 2, Store(tmp_path / "c.db"), CPU.device_key,
                       batches.Ranked())
    assert got == {k: plan.order[0] for k, plan in full.items()} and set(got.values()) == {best}
    rows = [rankdata.row(P, t, m, ARCHS["cpu"], 2, None) for t in _kept()[:20] for m in (1, 64)]
    X = np.array([model.vector(r) for r in rows])
    assert np.array_equal(model.matrix(rows), X)
    X0 = np.ascontiguousarray(np.where(np.isnan(X), 0.0, X))
    assert model.predict(rows) == sum(t.values(X, X0) for t in model._trees).tolist()


def test_export_leaves_predicted_winners_out_unless_asked(tmp_path):
    from autotune.integrations.portable import export_cache
    store = Store(tmp_path / "c.db")
    store.put_environment(CPU, ("torch",))
    lib = CPU.lib_key(("torch",))
    t = _kept()[0]
    for b, pred in ((1, False), (8, True)):
        store.put_winner(keyed(Winner(P.key, b, CPU.device_key, t.id, "torch", t.to_json(), lib, 5.0, t.id, None, None,
                                      predicted=pred)))
    rep = export_cache(store, tmp_path / "a.json", fmt="json")
    assert rep.written == 1 and rep.predicted_left == 1 and "1 predicted winners" in rep.line("a.json")
    rep = export_cache(store, tmp_path / "b.json", fmt="json", include_predicted=True)
    assert rep.written == 2 and rep.predicted_left == 0
    import json
    # the predicted marker raises the export's form: a reader of the older form refuses it, never drops it
    assert [json.loads((tmp_path / f).read_text())["schema"] for f in ("a.json", "b.json")] == [3, 5]
    fresh = Store(tmp_path / "fresh.db")
    from autotune.integrations.portable import import_cache
    import_cache(fresh, tmp_path / "b.json")
    assert sorted((w.bucket, w.predicted) for w in fresh.winners()) == [(1, False), (8, True)]


def test_without_a_model_for_the_arch_predict_names_the_defaults_it_serves(tmp_path):
    store = Store(tmp_path / "c.db")
    rep = _search(store, strategy="predict", rank_model=rankmodel.Model(["a"], "", {"arch": "sm90"}))
    [note] = [n for n in rep.notes if n.startswith("--strategy predict")]
    assert "no data for cpu" in note and f"{TORCH.default(P, ARCHS['cpu'])} for 1 problem" in note
    assert rep.measured == 0 and not store.winners()


def test_the_ladder_puts_predicted_between_exact_and_nearest():
    ts = [Tactic("torch", dequant_dtype="fp32", chunk_n=c) for c in (0, 512, 2048)]
    dflt = Tactic("torch", dequant_dtype="bf16", chunk_n=0)
    lazy = LazyDefault(lambda p, t: ("default", t), P, dflt, None)
    t = Table(P, (1, 4, 16), ("k1", "k4", "k16"), tuple(ts), lazy, dflt, (False, True, False))
    assert [t.rung_for(m) for m in (1, 4, 3, 20)] == [("exact", ts[0]), ("predicted", ts[1]), ("nearest", ts[2]),
                                                      ("nearest", ts[2])]
    assert [t(m) for m in (1, 4, 3, 20)] == ["k1", "k4", "k16", "k16"] and t.index(2) == 2
    assert t.counts == [0, 1, 1, 3, 0]
    only = Table(P, (4,), ("k4",), (ts[1],), lazy, dflt, (True,))
    assert only.rung_for(4)[0] == "predicted" and only.rung_for(2) == ("default", dflt)
    assert only(2) == ("default", dflt) and only.index(8) == -1 and only.counts[4] == 2


def test_show_explain_names_each_rung_and_why(tmp_path):
    """`show --explain` on a cache holding a measured, a predicted and an unservable winner for GLM-5's
    dense down_proj at TP8 (N 6144, K 1536): exact, predicted, nearest, default, each with its reason."""
    from autotune import api
    from autotune.report.text import explain_lines
    p = Problem.dense(6144, 1536)
    store = Store(tmp_path / "c.db")
    store.put_environment(CPU, ("torch",))
    lib = CPU.lib_key(("torch",))
    t = TORCH.default(p, ARCHS["cpu"])
    for b, pred in ((1, False), (2, True), (8, False)):
        store.put_winner(keyed(Winner(p.key, b, CPU.device_key, t.id, "torch", t.to_json(), lib, 50.0 * b, t.id,
                                      60.0 * b, 1.2, predicted=pred)))
    store.put_winner(keyed(Winner(p.key, 16, CPU.device_key, t.id, "torch", t.to_json(), "0" * 16, 5.0, t.id, None,
                                  None)))                             # other library versions: not served
    store.close()
    rows = [r for r in api.explain(tmp_path / "c.db", model="glm5", tp=8) if r.problem == p.key]
    got = {r.m: (r.rung, r.why) for r in rows}
    assert [got[m][0] for m in (1, 2, 8, 16)] == ["exact", "predicted", "exact", "nearest"]
    assert "1.20x the default" in got[1][1] and "not timed" in got[2][1]
    assert "library version differs" in got[16][1] and "bucket 8's measured winner" in got[16][1]
    others = [r for r in api.explain(tmp_path / "c.db", model="glm5", tp=8) if r.problem != p.key]
    assert others and all(r.rung == "default" and "the family default" in r.why for r in others)
    text = list(explain_lines(rows))
    assert text[0].startswith(p.key) and "mlp.down_proj" in text[0] and text[-1].startswith("rungs: exact 2")
