"""A search with layer problems (`--moe-layers`, autotune.engine.layers) on the CPU: the layer jobs run
after their pair problems, each bucket's pair competitor is made from the pair problems' stored
winners, a checked layer winner is stored and dispatch returns it; exports leave layer winners out."""
from __future__ import annotations

import json

import pytest

from autotune.api.args import model_problems, with_layers
from autotune.cache import Store
from autotune.cache.exportfile import collect
from autotune.core.buckets import Buckets
from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.layer import KIND, LayerProblem
from autotune.core.tactic import Tactic
from autotune.engine import layers, timing
from autotune.engine.search import search
from autotune.engine.workers import Runner
from autotune.integrations.portable import export_cache, import_cache
from autotune.runtime.dispatch import Dispatcher
from autotune.tactics import registry

L = LayerProblem.of(128, 64, 8, 2)
CPU = cpu()
CPU_ARCH = ARCHS["cpu"]
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
BUCKETS = (1, 4)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One search of the layer with its two pair problems, given layer first (the engine orders it
    last), under the default strategy (the layer pass is halving's)."""
    path = tmp_path_factory.mktemp("layer") / "c.db"
    store = Store(path)
    with pytest.MonkeyPatch.context() as mp:      # module-scoped: set up before conftest's per-test cache
        mp.setenv("AUTOTUNE_CACHE", str(path.parent / "default.db"))
        mp.setenv("XDG_CACHE_HOME", str(path.parent / "xdg"))
        rep = search([L, L.w13, L.w2], families=[registry.get("torch")], store=store, buckets=Buckets.of(BUCKETS),
                     timer=FAST, env=CPU, runner=Runner(isolate=False))
    return path, store, rep


def _winner(store, key, bucket):
    return next(w for w in store.winners(CPU.device_key) if w.problem_key == key and w.bucket == bucket)


def test_the_layer_winner_is_checked_stored_and_dispatched(searched):
    path, store, rep = searched
    assert not rep.job_failures
    d = Dispatcher(path, env=CPU, record_misses=False)
    for b in BUCKETS:
        w = _winner(store, L.key, b)
        assert w.family == "layer" and w.replay_checked and w.median_us > 0
        trials = {t.tactic_id: t for t in store.get_trials(L.key, b, CPU.device_key)}
        assert trials[w.tactic_id].status == "ok" and trials[w.tactic_id].rel_err < 1e-2
        rung, t = d.tactic_for(L, b)
        assert rung == "winner" and t.id == w.tactic_id


def test_each_bucket_measures_the_pair_of_its_stored_pair_winners(searched):
    _, store, _ = searched
    for b in BUCKETS:
        w13, w2 = (Tactic.from_json(_winner(store, p.key, b).params_json) for p in L.pair)
        pair = registry.pair_tactic(w13, w2)
        got = {t.tactic_id: t for t in store.get_trials(L.key, b, CPU.device_key)}
        assert pair.id in got and got[pair.id].status in ("ok", "dropped")
        assert json.loads(got[pair.id].params_json)["params"]["via"] == "pair"
        vias = {json.loads(t.params_json)["params"]["via"] for t in got.values() if t.status in ("ok", "dropped")}
        assert vias == {"torch", "pair"}


def test_no_pair_competitor_without_both_pair_winners(searched):
    _, store, _ = searched
    lib = {"torch": CPU.lib_key(("torch",)), "layer": CPU.lib_key(("torch",))}
    assert len(layers.pair_competitor(store, L, 4, CPU.device_key, lib)) == 1
    assert layers.pair_competitor(store, L, 2, CPU.device_key, lib) == []           # bucket never searched
    assert layers.pair_competitor(store, L.w13, 4, CPU.device_key, lib) == []       # not a layer
    assert layers.pair_competitor(store, L, 4, CPU.device_key, {"layer": lib["layer"]}) == []   # torch's not fresh


def test_exports_leave_layer_winners_out(searched, tmp_path):
    _, store, _ = searched
    keys = {w["problem_key"] for w in collect(store)["winners"]}
    assert keys == {L.w13.key, L.w2.key}
    out = tmp_path / "x.json"
    export_cache(store, out)
    fresh = Store(tmp_path / "y.db")
    import_cache(fresh, out)
    assert {w.problem_key for w in fresh.winners()} == {L.w13.key, L.w2.key}


def test_moe_layers_is_an_opt_in_on_the_model_problem_set():
    uses = model_problems("glm5", fused_moe=True, fold_shared=True, fused_mlp=True)
    assert not any(u.problem.kind == KIND for u in uses)
    more = with_layers(uses)
    added = [u.problem for u in more[len(uses):]]
    assert more[:len(uses)] == uses and added
    keys = {u.problem.key for u in uses}
    for p in added:
        assert p.kind == KIND and p.w13.key in keys and p.w2.key in keys
    assert len({p.key for p in added}) == len(added)


def test_a_search_without_layer_problems_leaves_the_layer_family_out(tmp_path, capsys):
    """Every registered family by default: the layer family runs layers only, so a search of other
    problems plans, announces and reports what it did before the family existed."""
    from autotune.api.args import parse_families
    from autotune.core.problem import Problem
    fams = parse_families(None)
    assert "layer" in {f.name for f in fams}
    rep = search([Problem.dense(256, 512)], families=fams, store=Store(tmp_path / "c.db"), buckets=Buckets.of((1,)),
                 timer=FAST, env=CPU, runner=Runner(isolate=False), progress=True)
    err = capsys.readouterr().err
    assert "families measured on cpu: torch;" in err and "layer" not in err
    assert all(fp.family != "layer" for fps in rep.plans.values() for fp in fps)
    assert rep.winners and all(w.family == "torch" for w in rep.winners)


LK = LayerProblem.of(256, 128, 8, 2)          # the layer kernel's tiling needs H and I multiples of 128
KBUCKETS = (1, 4, 160)                        # 160 · top_k 2 = 320 pairs: past the layer kernel's scope


@pytest.fixture(scope="module")
def with_kernel(tmp_path_factory):
    """A layer search whose families include one that runs the kind (`Family.kinds`): the cuda layer
    kernel (its CPU port, tests/families/cuda_layer_cpu.py) beside the layer family's tactics."""
    from tests.families import cuda_layer_cpu
    path = tmp_path_factory.mktemp("layerk") / "c.db"
    store = Store(path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOTUNE_CACHE", str(path.parent / "default.db"))
        mp.setenv("XDG_CACHE_HOME", str(path.parent / "xdg"))
        mp.setitem(registry.FAMILIES, "cudalayercpu", "tests.families.cuda_layer_cpu:CudaLayerCpu")
        registry.get.cache_clear()
        cuda_layer_cpu.CALLS.clear()
        try:
            fams = [registry.get("torch"), registry.get("cudalayercpu")]
            rep = search([LK, LK.w13, LK.w2], families=fams, store=store, buckets=Buckets.of(KBUCKETS),
                         timer=FAST, env=CPU, runner=Runner(isolate=False))
            yield store, rep, list(cuda_layer_cpu.CALLS)
        finally:
            registry.get.cache_clear()


def test_a_family_that_runs_layers_competes_in_the_layer_search(with_kernel):
    """The layer kernel's kept tactics are measured (checked against float64, replay-checked) at the
    buckets in its scope, beside the torch compositions and the pair; not past its scope; the pair
    problems never see it."""
    store, rep, calls = with_kernel
    assert not rep.job_failures
    kept = [t for t in registry.get("cudalayercpu").enumerate(LK, CPU_ARCH)]
    assert kept and all(t["kernel"] == "moe_layer" for t in kept)
    for b in KBUCKETS:
        trials = store.get_trials(LK.key, b, CPU.device_key)
        fams = {t.family for t in trials if t.status in ("ok", "dropped")}
        assert ("cudalayercpu" in fams) == (b * LK.top_k <= 256), (b, fams)
        assert "layer" in fams
        assert not [t.reason for t in trials if t.status == "failed"]
        for t in trials:
            if t.family == "cudalayercpu" and t.status == "ok":
                assert t.rel_err < 1e-2
        assert _winner(store, LK.key, b).replay_checked
    for p in LK.pair:
        assert all(t.family != "cudalayercpu" or t.status == "rejected" for b in KBUCKETS
                   for t in store.get_trials(p.key, b, CPU.device_key))
    assert calls and max(calls) <= 256 // LK.top_k


def test_other_families_refuse_layer_problems_by_kind():
    """A family that does not declare the kind rejects a layer whatever its own `supports` says."""
    for name in ("torch", "cutlass"):
        fam = registry.get(name)
        assert "moe_layer" not in fam.kinds
        v = fam.verdict(LK, Tactic(name, dequant_dtype="bf16", chunk_n=0) if name == "torch" else fam.default(LK.w13, CPU_ARCH), CPU_ARCH)
        assert v.rejected and "not moe_layer" in v.reason
