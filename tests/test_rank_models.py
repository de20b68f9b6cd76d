"""The rank models shipped inside the package and which model a search uses by default:
`--rank-model PATH`, else the cache's own `<cache>.rank-<arch>.json` (a user's `rank-fit`), else the
one shipped for the arch, else successive halving (said in the notes). CPU only, no LightGBM."""
import configparser
import fnmatch
import json
from pathlib import Path

from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.engine import timing
from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, batches as ranked, plans as strategy
from autotune.engine.search import SearchOptions, _Work, plan, search
from autotune.engine.strategies.successive_halving import Halving
from autotune.engine.workers import Runner
from autotune.cache import Store
from autotune.tactics import registry

ROOT = Path(__file__).resolve().parent.parent
SM90, CPU_ARCH = ARCHS["sm90"], ARCHS["cpu"]
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
FUSED = ("grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8:swiglu",
         "grouped_moe:bf16*nvfp4->bf16:n6144:k256:e256:top8:reduce")


def _tiny(arch: str, **libs) -> rankmodel.Model:
    """A model without trees (predicts 0): what the precedence rule reads is its key."""
    return rankmodel.Model(["n"], "", {"arch": arch, "gpu": "test", "libs": libs})


def test_the_shipped_sm90_model_loads_knows_the_cuda_family_moe_decode_and_the_fused_problems():
    path = strategy.shipped(SM90)
    assert path is not None and path.parent == strategy.SHIPPED
    assert path.stat().st_size < 400 * 1024                       # gzip'd JSON, no pickle
    m = rankmodel.load(path)
    assert m.covers(SM90) and not m.covers(CPU_ARCH) and strategy.shipped(CPU_ARCH) is None
    assert path.name == strategy.shipped_name(m)                   # named by its key
    assert {"family=cuda", "family=triton", "p.kernel=moe_decode", "p.kernel=moe_mma", "epilogue=swiglu",
            "epilogue=reduce"} <= set(m.names)
    assert set(FUSED) <= set(m.info["problems"]) and set(m.info["sources"]) == {
        "h200x2-glm5-tp8-full", "cuda-search-h200", "moe-search-h200", "main-job-h200", "moe-latency-h200-ab"}
    assert {"torch", "triton", "cupy"} <= set(m.key["libs"])


def test_the_shipped_model_sees_nothing_new_in_the_glm5_problems_on_sm90():
    """Every categorical feature of every kept cuda/triton/torch tactic of a dense and both fused
    GLM-5 TP8 problems is one the shipped model was fitted on, but moe_tok's (added after the fit): no
    other tactic enters as a never-seen extra (the model of docs/data, fitted before cuda and the fused
    problems, has them all as new)."""
    m = rankmodel.load(strategy.shipped(SM90))
    probs = [Problem.from_key("dense:bf16*nvfp4->bf16:n3072:k6144"), *map(Problem.from_key, FUSED)]
    fams = [registry.get(n) for n in ("cuda", "triton", "torch")]
    work = []
    for p, rows in plan(probs, fams, SM90).items():
        kept = [r for r in rows if _kept(r.verdict)]
        work.append(_Work(p, kept, kept[0].tactic))
    assert any(r.tactic.family == "cuda" for w in work for r in w.kept)
    plans = strategy.plans(m, work, [1, 64], SM90, 132, Store("sqlite://"), "dev", ranked.Ranked())
    for w in work:
        ids = {r.tactic.id for r in w.kept}
        for b in (1, 64):
            p = plans[(w.problem.key, b)]
            bests = tuple(i for i in m.bests(w.problem.key, b) if i in ids)
            assert bests                                            # the committed data timed every one of these jobs
            # the default, then the model's bests, then never-seen members: only moe_tok (added after the
            # fit, kernel=moe_tok a category the trees never saw), only on the reduce problem it runs
            seen = list(dict.fromkeys((w.default.id, *bests)))
            extras = [t.id for t in p.extras]
            assert extras[:len(seen)] == seen, (w.problem.key, b)
            # ... then each kernel's best-predicted tactic where its kernel is not in the first batch yet
            # (strategy._every_member): never a second tactic of one kernel, never a kernel already there
            first = ranked.Ranker(p).first
            head = {strategy.kernel_of(t) for t in p.order[:first]}
            rest = p.extras[len(seen):]
            tops = [t for t in rest if strategy.kernel_of(t) not in head and t.params.get("kernel") != "moe_tok"]
            assert len({strategy.kernel_of(t) for t in tops}) == len(tops), (w.problem.key, b)
            assert all(t == next(o for o in p.order if strategy.kernel_of(o) == strategy.kernel_of(t)) for t in tops)
            novel = [t for t in rest if t not in tops]
            assert all(t.params.get("kernel") == "moe_tok" for t in novel), (w.problem.key, b)
            assert any(t.params.get("kernel") == "moe_tok" for t in novel) == (w.problem.epilogue == "reduce"), \
                (w.problem.key, b)
            # every kernel is in the first batch, but the torch reference's grouped MoE (a host loop:
            # Family.first_batch_member) unless the trees put it there
            reference = {strategy.kernel_of(t) for t in p.order if not registry.first_batch_member(w.problem, t.family)}
            assert reference == ({("torch", "")} if w.problem.kind == "grouped_moe" else set())
            assert {strategy.kernel_of(t) for t in (*p.order[:first], *p.extras)} | reference == \
                {strategy.kernel_of(t) for t in p.order}
            assert len(p.order) == len(w.kept) and all(abs(x) < 10 for x in p.pred)


def _kept(v) -> bool:
    """Kept as a search sees it once the GPU tests have recorded the cuda kernels' texts (a verdict
    unknown only for want of that record counts: tactics/cuda/checked.py)."""
    from autotune.tactics.cuda.checked import awaiting_record
    return v.ok is True or awaiting_record(v)


def test_a_ranked_search_measures_first_what_the_moe_mma_sweep_found_fastest():
    """The 2026-12-03 sweep of moe_mma's new text (docs/data/2026-12-03-h200-moe-config-sweep.json) found configs the
    trees, fitted mostly on the older text, rank 21st and 44th (bench/rank_bests.py at f4cc350): the model's bests put them in the
    first batch, so the next main job on the H200 measures them."""
    sweep = json.loads((ROOT / "docs/data/2026-12-03-h200-moe-config-sweep.json").read_text())["sweep"]
    m = rankmodel.load(strategy.shipped(SM90))
    probs = [Problem.from_key(k) for k in FUSED]
    fam = registry.get("cuda")
    work = []
    for p, rows in plan(probs, [fam, registry.get("triton")], SM90).items():
        kept = [r for r in rows if _kept(r.verdict)]
        work.append(_Work(p, kept, fam.default(p, SM90)))
    plans = strategy.plans(m, work, [1, 4], SM90, 132, Store("sqlite://"), "dev", ranked.Ranked())
    for w in work:
        for b in (1, 4):
            timed = [r for r in sweep if r["problem"] == w.problem.key and r["m"] == b and "us" in r]
            fastest = min(timed, key=lambda r: r["us"])["tactic"]
            tid = next(r.tactic.id for r in w.kept if r.tactic.family == "cuda"
                       and all(r.tactic.params.get(k) == v for k, v in fastest.items()))
            p = plans[(w.problem.key, b)]
            assert tid in strategy.first_ids(p), (w.problem.key, b, fastest)
            assert tid in m.bests(w.problem.key, b)


def test_the_folded_problems_start_from_their_siblings_sweep():
    """GLM-5's shared expert folded in (e257:top9) is the same GEMM as the routed experts' (e256:top8)
    over one more expert and slot; the shipped model's data never timed it at M = 1, where the trees
    rank the sibling sweep's fastest 42nd (w13) and 15th (w2), past the first batch (bench/rank_bests.py at f4cc350).
    Its siblings' bests (Model.sibling_bests) put them in the first batch."""
    sweep = json.loads((ROOT / "docs/data/2026-12-03-h200-moe-config-sweep.json").read_text())["sweep"]
    m = rankmodel.load(strategy.shipped(SM90))
    fam = registry.get("cuda")
    work = []
    for p, rows in plan([Problem.from_key(k.replace("e256:top8", "e257:top9")) for k in FUSED],
                        [fam, registry.get("triton")], SM90).items():
        work.append(_Work(p, [r for r in rows if _kept(r.verdict)], fam.default(p, SM90)))
    plans = strategy.plans(m, work, [1, 4], SM90, 132, Store("sqlite://"), "dev", ranked.Ranked())
    for w in work:
        sib = w.problem.key.replace("e257:top9", "e256:top8")
        for b in (1, 4):
            assert m.bests(w.problem.key, b) == ()                 # no data of its own
            fastest = min((r for r in sweep if r["problem"] == sib and r["m"] == b and "us" in r),
                          key=lambda r: r["us"])["tactic"]
            tid = next(r.tactic.id for r in w.kept if r.tactic.family == "cuda"
                       and all(r.tactic.params.get(k) == v for k, v in fastest.items()))
            assert tid in m.sibling_bests(w.problem, b) and tid in strategy.first_ids(plans[(w.problem.key, b)])


def test_sibling_bests_are_one_expert_and_slot_away_on_the_same_gemm():
    base = "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top8:swiglu"
    table = {f"{base}@1": ["a", "b"], f"{base}@4": ["c"],
             "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e255:top7:swiglu@1": ["d"],           # one fewer of each
             "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e259:top11:swiglu@1": ["x"],          # two more: too far
             "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9@1": ["y"],                  # another epilogue
             "grouped_moe:bf16*mxfp4->bf16:n512:k6144:e257:top9:swiglu@1": ["z"],           # another format
             "grouped_moe:bf16*nvfp4->bf16:n1024:k6144:e257:top9:swiglu@1": ["w"],          # another N
             "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9:swiglu@1": ["own"],
             "not a key@1": ["v"], 7: ["u"], f"{base}@x": ["t"],
             "grouped_moe:bf16*nvfp4->bf16:n512:k6144:e256:top9:swiglu@1": [1, 2]}           # hostile entry: none
    m = rankmodel.Model(["n"], "", {"arch": "sm90"}, {"bests": table})
    fold = Problem.from_key("grouped_moe:bf16*nvfp4->bf16:n512:k6144:e257:top9:swiglu")
    assert m.sibling_bests(fold, 1) == ("a", "b") and m.sibling_bests(fold, 4) == ("c",)
    assert m.bests(fold.key, 1) == ("own",) and m.sibling_bests(fold, 2) == ()
    assert m.sibling_bests(Problem.from_key(base), 1) == ("d", "own")            # the reverse (equally near: by key)
    assert m.sibling_bests(Problem.from_key("dense:bf16*nvfp4->bf16:n512:k6144:swiglu"), 1) == ()
    assert rankmodel.Model(["n"], "", {"arch": "sm90"}, {"bests": ["a"]}).sibling_bests(fold, 1) == ()


def _group(pk, b, source, timed, ok=()):
    g = rankdata.Group(Problem.from_key(pk), b, "dev", source=source)
    g.timed.update(timed)
    g.ok.update(ok or timed)
    return g


def test_bests_newest_source_first_final_times_first_at_most_two_none_for_what_was_held_out():
    pk = "dense:bf16*nvfp4->bf16:n3072:k6144"
    gs = [_group(pk, 1, "old", {"a": 1.0, "b": 2.0}),
          _group(pk, 1, "mid", {"c": 0.5, "d": 0.9}, ok={"d"}),     # c only dropped early: d is its best
          _group(pk, 1, "new", {"e": 3.0, "a": 4.0}),
          _group(pk, 2, "old", {"b": 1.0, "a": 1.0})]               # a tie goes to the smaller id
    got = rankdata.bests(gs, ["old", "mid", "new"])
    assert got == {f"{pk}@1": ["e", "d"], f"{pk}@2": ["a"]}
    assert rankdata.bests(gs[3:], ["old", "mid", "new"]) == {f"{pk}@2": ["a"]}   # bucket 1 held out: none
    m = rankmodel.Model(["n"], "", {"arch": "sm90"}, {"bests": got})
    assert m.bests(pk, 1) == ("e", "d") and m.bests(pk, 4) == () and m.bests("other", 1) == ()
    for junk in ({f"{pk}@1": "e"}, {f"{pk}@1": [1, 2]}, ["e"], None):        # a hostile file: no bests, no error
        assert rankmodel.Model(["n"], "", {"arch": "sm90"}, {"bests": junk}).bests(pk, 1) == ()


def test_setup_cfg_ships_every_rank_model_in_the_wheel():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    globs = [g.strip() for g in cfg["options.package_data"]["autotune.engine.strategies.ranked"].split(",") if g.strip()]
    files = [p.relative_to(ROOT / "autotune" / "engine" / "strategies" / "ranked").as_posix()
             for p in strategy.SHIPPED.iterdir()]
    assert files and all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), (files, globs)
    assert "autotune" in cfg["options.packages.find"]["include"].split()


def test_precedence_rank_model_flag_then_the_caches_own_then_shipped_then_halving(tmp_path):
    store = Store(tmp_path / "c.db")
    m, note = strategy.default_model(store, SM90)                   # nothing next to the cache
    assert m is not None and m.key == rankmodel.load(strategy.shipped(SM90)).key
    assert f"shipped for sm90 ({strategy.shipped(SM90).name})" in note
    own = rankmodel.path_for(tmp_path / "c.db", SM90)
    rankmodel.save(_tiny("sm90"), own)                              # a user's rank-fit
    m, note = strategy.default_model(store, SM90)
    assert m.key["gpu"] == "test" and "the cache's own: it takes precedence over the shipped one" in note
    assert strategy.load_model(None, store, SM90)[0].key == m.key
    flag = rankmodel.save(_tiny("sm90", torch="9"), tmp_path / "flag.json")
    m, note = strategy.load_model(str(flag), store, SM90)           # --rank-model wins over both
    assert m.key["libs"] == {"torch": "9"} and str(flag) in note
    own.write_text("{not json")                                     # a damaged own file: said, shipped used
    m, note = strategy.default_model(store, SM90)
    assert m is not None and "unusable" in note and "shipped for sm90" in note
    rankmodel.save(_tiny("sm120"), own)                              # another arch's: said, shipped used
    m, note = strategy.default_model(store, SM90)
    assert m is not None and "no data for sm90" in note and "shipped for sm90" in note
    m, note = strategy.default_model(store, CPU_ARCH)               # nothing for the arch: halving
    assert m is None and "no rank model for cpu" in note
    assert strategy.load_model(str(tmp_path / "none.json"), store, SM90)[0] is None


def test_of_several_shipped_models_the_one_matching_the_installed_libraries(tmp_path, monkeypatch):
    monkeypatch.setattr(strategy, "SHIPPED", tmp_path)
    a, b = _tiny("sm90", torch="2.11.0", triton="3.6.0"), _tiny("sm90", torch="2.13.0", triton="3.6.0")
    for m in (a, b):
        rankmodel.save(m, tmp_path / strategy.shipped_name(m))
    assert strategy.shipped(SM90, {"torch": "2.13.0", "triton": "3.6.0"}).name == strategy.shipped_name(b)
    assert strategy.shipped(SM90, {"torch": "2.11.0", "triton": None}).name == strategy.shipped_name(a)
    assert strategy.shipped(ARCHS["sm120"]) is None
    m, note = strategy.default_model(Store("sqlite://"), SM90, {"torch": "2.11.0"})    # a store that is no file
    assert m.key == a.key and "shipped for sm90" in note


def test_gzip_model_files_round_trip_byte_identically(tmp_path):
    m = rankmodel.Model(["a", "p.k=x"], "tree text", {"arch": "sm90"}, {"rows": 1})
    one, two = rankmodel.save(m, tmp_path / "a.json.gz"), rankmodel.save(m, tmp_path / "b.json.gz")
    assert one.read_bytes() == two.read_bytes() and one.read_bytes()[:2] == b"\x1f\x8b"
    assert json.loads(rankmodel.load(one).to_json()) == json.loads(m.to_json())
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b broken")
    import pytest
    with pytest.raises(ValueError, match="damaged gzip"):
        rankmodel.load(tmp_path / "bad.json.gz")


def test_the_default_strategy_is_ranked_and_a_cpu_search_halves_and_says_so(tmp_path):
    assert SearchOptions().strategy == "ranked"
    probs = [Problem.dense(256, 128)]
    kw = dict(families=[registry.get("torch")], buckets=Buckets.of((1, 8)), timer=FAST, env=cpu(),
              runner=Runner(isolate=False), halving=Halving(budget_s=0.02, cycles=1))          # in-process: what is compared is the plan, not a worker
    rep = search(probs, store=Store(tmp_path / "a.db"), **kw)
    assert any("--strategy ranked: no rank model for cpu" in n and "measuring by successive halving" in n
               for n in rep.notes), rep.notes
    halved = search(probs, store=Store(tmp_path / "b.db"), strategy="halving", **kw)
    assert rep.measured == halved.measured > 0
    assert {(w.problem_key, w.bucket) for w in rep.winners} == {(p.key, b) for p in probs for b in (1, 8)}
