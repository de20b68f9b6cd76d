"""bench/bucket_cut_eval.py's core on the committed H200 full search (the data tests/test_ranked.py
runs bench/rank_eval.py on): one held-out problem, a small model (20 boosting rounds). every = 1
measures every bucket and is rank_eval's no-cut lopo replay with the same model; a cut measures
fewer tactics and each verified bucket picks among its candidates (the model's first choice, the
default, the picks at the nearest decided buckets below and above); split = tactic measures in full
instead each one whose nearest measured buckets' picks differ."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs/data/2026-11-30-h200x2-full-search.db.xz"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(store, rows of every=1 and every=3 (each split), the model fitted for the fold, the memo of feature rows)."""
    pytest.importorskip("lightgbm")
    sys.path.insert(0, str(ROOT / "bench"))
    import bucket_cut_eval as bce
    import rank_eval
    from autotune.engine.strategies.ranked import batches as ranked, rows as rankdata
    store = rank_eval.open_store(str(DATA), str(tmp_path_factory.mktemp("cut")))
    fitted, train_many = [], rankdata.train_many

    def keep(*a, **k):
        fitted.append((train_many(*a, **k), a[3] if len(a) > 3 else k["memo"]))
        return fitted[-1][0]
    rankdata.train_many = keep
    try:
        rows = bce.evaluate([store], 20, [(1, 0.0, "none"), *((3, 0.0, x) for x in bce.SPLIT)], ranked.Ranked(),
                            limit=1)
    finally:
        rankdata.train_many = train_many
    yield store, rows, fitted
    store.close()


def _by(rows, every, split="none"):
    return {r["bucket"]: r for r in rows if r["every"] == every and r["split"] == split}


def test_every_one_measures_every_bucket_and_is_the_no_cut_replay(run):
    import rank_eval
    from autotune.engine.strategies.ranked import batches as ranked, rows as rankdata
    store, rows, fitted = run
    [(model, memo)] = fitted                    # one fold: one model
    base = _by(rows, 1)
    problem = next(iter(base.values()))["problem"]
    src = rank_eval.sources([store])[0]
    groups = {g.bucket: g for g in rankdata.source_groups([src]) if g.problem.key == problem}
    win = {w.bucket: w for w in store.winners(src.device_key) if w.problem_key == problem}
    assert sorted(base) == sorted(win) == sorted(groups) and len(base) == 21
    assert all(r["full"] for r in base.values())
    prev = []
    for b in sorted(base):                      # rank_eval's lopo: warm-started by the pick one bucket below
        n, m, pick = rank_eval.replay(model, groups[b], memo, win[b].default_tactic_id, prev, ranked.Ranked())
        prev = [pick]
        assert (base[b]["kept"], base[b]["measured"], base[b]["winner"]) == (n, m, pick), b


def test_a_cut_measures_fewer_tactics_and_verifies_among_its_candidates(run):
    _, rows, _ = run
    base, cut3 = _by(rows, 1), _by(rows, 3)
    assert sorted(cut3) == sorted(base)
    ladder = sorted(cut3)
    full = sorted(b for b, r in cut3.items() if r["full"])
    assert {ladder[0], ladder[-1], *ladder[::3]} <= set(full) and len(full) < len(ladder)
    assert sum(r["measured"] for r in cut3.values()) < sum(r["measured"] for r in base.values())
    for b in full:                              # the ranked replay: no verify candidates
        assert cut3[b]["measured"] >= 1 and "candidates" not in cut3[b]
    for b, r in cut3.items():
        if r["full"]:
            continue
        below = max(x for x in ladder if x < b)     # every bucket below is decided when b is verified
        above = min((x for x in full if x > b), default=None)
        near = {cut3[x]["winner"] for x in (below, above) if x is not None} - {None}
        assert near <= set(r["candidates"]), (b, near, r["candidates"])
        assert len(r["candidates"]) <= 4 and r["measured"] <= len(r["candidates"])
        assert r["winner"] in r["candidates"]
        assert r["gap"] is not None             # every kept tactic is timed in a full search


def test_summary_counts_and_recommendation(run):
    import bucket_cut_eval as bce
    _, rows, _ = run
    s = bce.summarize(rows)
    base, cut3 = s["every=1 (no cut)"], s["every=3 unsure=0 split=none"]
    assert base["full_share"] == 1 and base["share_of_baseline"] == 1 and base["groups"] == cut3["groups"] == 21
    assert cut3["full"] < 21 and cut3["share_of_baseline"] < 1
    assert cut3["within1"] <= cut3["within3"] <= cut3["groups"]
    ok = bce.recommend(s)
    assert ok and all(s[k]["within3_share"] >= bce.TARGET_HITS for k in ok)
    assert [s[k]["measured"] for k in ok] == sorted(s[k]["measured"] for k in ok)
    assert "| every=3 unsure=0 split=none |" in bce.table(s)


def test_split_measures_in_full_where_the_nearest_measured_picks_differ(run):
    _, rows, _ = run
    none, tactic = _by(rows, 3), _by(rows, 3, "tactic")
    assert not any(r.get("promoted") for r in none.values()) and any(r.get("promoted") for r in tactic.values())
    full = {b for b, r in none.items() if r["full"]}
    assert full <= {b for b, r in tactic.items() if r["full"]}
    assert all(tactic[b] == {**none[b], "split": "tactic"} for b in full)   # the measured replay is unchanged
    for split in ("kernel", "tactic"):
        assert sum(r["full"] for r in _by(rows, 3, split).values()) >= len(full)
    for b, r in tactic.items():
        if b in full:
            continue
        have = sorted(x for x, q in tactic.items() if q["full"] and (x in full or x < b))   # measured at b's turn
        below, above = max(x for x in have if x < b), min(x for x in have if x > b)
        assert r["full"] == r.get("promoted", False) == (tactic[below]["winner"] != tactic[above]["winner"]), b
