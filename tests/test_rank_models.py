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
    assert {"family=cuda", "family=triton", "family=torch", "p.kernel=moe_decode", "p.kernel=moe_mma",
            "p.kernel=moe_tok", "epilogue=swiglu", "epilogue=reduce"} <= set(m.names)
    folded = {k.replace("e256:top8", "e257:top9") for k in FUSED}
    assert set(FUSED) | folded <= set(m.info["problems"])
    # fitted on the main jobs of the final problem set (tools/fit_rank_models.py CACHES), H200 and H100
    assert set(m.info["sources"]) == {"main-job-h200-7a8be9d", "main-job-h100-961f0e7"}
    assert m.key["gpu"] == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"] and m.info["outside_space"] == 0
    assert {"torch", "triton", "cupy"} <= set(m.key["libs"])


def test_the_shipped_model_sees_nothing_new_in_the_glm5_problems_on_sm90():
    """Every categorical feature of every kept cuda/triton/torch tactic of a dense and both fused
    GLM-5 TP8 problems is one the shipped model was fitted on (moe_tok's included): no tactic enters
    as a never-seen extra. The extras are the default, the model's bests and its siblings' bests,
    then each kernel's best-predicted tactic where its kernel is not in the first batch yet."""
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
            sib = tuple(i for i in m.sibling_bests(w.problem, b) if i in ids)
            assert bool(sib) == (w.problem.kind == "grouped_moe")   # the folded problem's data
            seen = list(dict.fromkeys((w.default.id, *bests, *sib)))
            extras = [t.id for t in p.extras]
            assert extras[:len(seen)] == seen, (w.problem.key, b)
            # ... then each kernel's best-predicted tactic where its kernel is not in the first batch yet
            # (strategy.every_member): never a second tactic of one kernel, never a kernel already there;
            # nothing else (no never-seen member)
            first = ranked.Ranker(p).first
            head = {strategy.kernel_of(t) for t in (*p.order[:first], *(t for t in p.extras if t.id in seen))}
            rest = p.extras[len(seen):]
            assert all(strategy.kernel_of(t) not in head for t in rest), (w.problem.key, b)
            assert len({strategy.kernel_of(t) for t in rest}) == len(rest), (w.problem.key, b)
            assert all(t == next(o for o in p.order if strategy.kernel_of(o) == strategy.kernel_of(t)) for t in rest)
            # every kernel is in the first batch, but the torch reference's grouped MoE (a host loop:
            # Family.first_batch_member) unless the trees put it there
            reference = {strategy.kernel_of(t) for t in p.order if not registry.first_batch_member(w.problem, t.family)}
            assert reference == ({("torch", "")} if w.problem.kind == "grouped_moe" else set())
            assert {strategy.kernel_of(t) for t in (*p.order[:first], *p.extras)} | reference == \
                {strategy.kernel_of(t) for t in p.order}
            assert len(p.order) == len(w.kept) and all(abs(x) < 10 for x in p.pred)
            if b == 1 and w.problem.kind == "dense":                # the cuda family wins M = 1 on both main jobs
                assert p.order[0].family == "cuda"


def _kept(v) -> bool:
    """Kept as a search sees it once the GPU tests have recorded the cuda kernels' texts (a verdict
    unknown only for want of that record counts: tactics/cuda/checked.py)."""
    from autotune.tactics.cuda.checked import awaiting_record
    return v.ok is True or awaiting_record(v)


def _fastest(db_xz: str) -> dict[tuple[str, int], str]:
    """(problem key, bucket) -> the fastest tactic that reached a final round (status ok) in a
    committed cache, ties by id: what rows.bests takes from each source."""
    import lzma
    import sqlite3
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "c.db"
        db.write_bytes(lzma.decompress((ROOT / db_xz).read_bytes()))
        con = sqlite3.connect(db)
        rows = con.execute("SELECT problem_key, bucket, tactic_id, median_us FROM trials "
                           "WHERE status = 'ok' AND bucket > 0 AND median_us > 0").fetchall()
        con.close()
    out: dict = {}
    for pk, b, tid, us in sorted(rows, key=lambda r: (r[3], r[2])):
        out.setdefault((pk, b), tid)
    return out


def test_a_ranked_search_measures_first_what_the_newest_main_jobs_found_fastest():
    """The model's bests at a (problem, bucket) are the fastest tactics of its newest sources: the
    H100 main job at 961f0e7 first, then the H200 one at 7a8be9d; a ranked search's first batch holds
    them, on the routed problems and on the folded ones (the shared expert folded in) alike."""
    h100 = _fastest("docs/data/2026-12-07-h100-961f0e7-main-job.db.xz")
    h200 = _fastest("docs/data/2026-12-05-h200-7a8be9d-main-job.db.xz")
    m = rankmodel.load(strategy.shipped(SM90))
    probs = [Problem.from_key(k) for k in FUSED] + [Problem.from_key(k.replace("e256:top8", "e257:top9")) for k in FUSED]
    fam = registry.get("cuda")
    work = []
    for p, rows in plan(probs, [fam, registry.get("triton")], SM90).items():
        work.append(_Work(p, [r for r in rows if _kept(r.verdict)], fam.default(p, SM90)))
    plans = strategy.plans(m, work, [1, 4, 64], SM90, 132, Store("sqlite://"), "dev", ranked.Ranked())
    for w in work:
        for b in (1, 4, 64):
            want = tuple(dict.fromkeys((h100[(w.problem.key, b)], h200[(w.problem.key, b)])))
            assert m.bests(w.problem.key, b) == want, (w.problem.key, b)
            first = strategy.first_ids(plans[(w.problem.key, b)])
            assert all(i in first for i in want if i in {r.tactic.id for r in w.kept}), (w.problem.key, b)


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
    assert m is None and "no rank model for cpu" in note and "the package ships one for sm90 only" in note
    assert strategy.shipped_archs() == ["sm90"]
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


def test_rows_outside_the_current_space_are_left_out_of_training():
    """A stored tactic whose parameters the installed code no longer enumerates (a member or a
    parameter renamed, removed or narrowed) is left out of every group; a group left with no timed
    tactic is dropped (tools/fit_rank_models.py fits only on what remains)."""
    from autotune.core.tactic import Tactic
    p = Problem.from_key("dense:bf16*nvfp4->bf16:n3072:k6144")
    live = registry.get("triton").enumerate(p, SM90)[0]
    gone = Tactic("triton", **{**dict(live.params), "block_n": 24})     # no block_n of 24 in the space
    assert live.id in rankdata.space_ids(p, "triton", SM90) and gone.id not in rankdata.space_ids(p, "triton", SM90)
    assert rankdata.space_ids(p, "no-such-family", SM90) == frozenset()

    def group(bucket, timed, negative=()):
        g = rankdata.Group(p, bucket, "dev", source="s")
        for t, us in timed:
            g.tactics[t.id], g.timed[t.id], g.smem[t.id] = t, us, None
            g.ok.add(t.id)
        for t in negative:
            g.tactics[t.id], g.smem[t.id] = t, None
            g.negative.add(t.id)
            g.rejected.add(t.id)
        return g
    both = group(1, [(live, 2.0), (gone, 1.0)], negative=[])
    only_gone = group(2, [(gone, 1.0)])
    rejected_gone = group(4, [(live, 3.0)], negative=[gone])
    memo: dict = {}
    kept, dropped = rankdata.in_space([both, only_gone, rejected_gone], SM90, memo)
    assert dropped == 3 and [g.bucket for g in kept] == [1, 4]
    for g in kept:
        assert set(g.tactics) == set(g.timed) == g.ok == {live.id} and not g.negative and not g.rejected
        assert g.best_us == (2.0 if g.bucket == 1 else 3.0)        # the label's reference moved to what remains
    assert both.timed == {live.id: 2.0, gone.id: 1.0}                # the input groups are not changed
    assert (p.key, "triton", "sm90") in memo


def test_the_holdout_scoring_counts_first_choices_and_winner_places():
    """tools/fit_rank_models.py --holdout: which buckets are held out and how a held-out group's
    first choice is counted (same, within 3 %, slower, never timed) with the winner's place."""
    import sys
    sys.path.insert(0, str(ROOT))
    from tools import fit_rank_models as F
    gs = [rankdata.Group(Problem.from_key("dense:bf16*nvfp4->bf16:n512:k6144"), b, "dev") for b in (1, 2, 4, 8, 16)]
    assert F.held_buckets(gs, 2) == [1, 4, 16] and F.held_buckets(gs, 3) == [1, 8]
    # an unseen job (--unseen): every bucket of it scored, none fitted on; an evaluated cache's held-out
    # buckets scored; a cache outside both only fitted on
    src = {name: [rankdata.Group(gs[0].problem, b, "dev", source=name) for b in (1, 2, 4, 8, 16)]
           for name in ("fit", "eval", "later")}
    train, held = F.split([g for v in src.values() for g in v], [1, 8], ("eval",), {"later"})
    assert sorted((g.source, g.bucket) for g in train) == [(n, b) for n in ("eval", "fit") for b in (2, 4, 16)]
    assert sorted((g.source, g.bucket) for g in held) == [("eval", 1), ("eval", 8)] + [("later", b) for b in (1, 2, 4, 8, 16)]
    row = dict(source="s", problem="p", bucket=1, kept=9, timed=3, winner="w", first_family="cuda")
    rows = [{**row, "first": "w", "gap": 0.0, "timed_first_gap": 0.0, "winner_place": 1},
            {**row, "first": "a", "gap": 0.02, "timed_first_gap": 0.02, "winner_place": 4},
            {**row, "first": "b", "gap": 0.2, "timed_first_gap": 0.0, "winner_place": 20},
            {**row, "first": "c", "gap": None, "timed_first_gap": 0.5, "winner_place": None}]
    s = F.summary(rows)
    assert (s["groups"], s["same"], s["within"], s["slower"], s["untimed"]) == (4, 1, 2, 1, 1)
    assert (s["top1"], s["top6"], s["top15"], s["timed_first_within"]) == (1, 2, 2, 3)
    assert s["worst_known_gap"] == 0.2
