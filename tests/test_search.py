"""The search loop end to end on the CPU: real SQLite, real torch kernels, real checks."""
import sqlite3
import warnings

import pytest
import torch

from autotune.core import inputs
from autotune.engine import timing
from autotune.core.arch import ARCHS
from autotune.core.buckets import Buckets
from autotune.runtime.dispatch import Dispatcher
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.engine.search import search
from autotune.cache import Store
from autotune.tactics import registry
from tests.helpers import temp_caches

CPU = cpu()   # these tests tune on the CPU even where a GPU is present
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
CPU_ARCH = ARCHS["cpu"]
DENSE = Problem.dense(256, 512)
MOE = Problem.moe(128, 256, experts=8, top_k=2)


@pytest.fixture
def faulty(register_family):
    return register_family("faulty", "tests.families.faulty:FaultyFamily")


def _run(store, problems=(DENSE, MOE), families=("torch",), buckets=(1, 4), **kw):
    return search(list(problems), families=[registry.get(f) for f in families], store=store,
                  buckets=Buckets.of(buckets), timer=FAST, env=CPU, **kw)


@pytest.fixture(scope="module")
def searched(tmp_path_factory, _user_cache_home):
    """(cache path, report) of one search of DENSE and MOE at buckets 1 and 4, run once per module;
    a test that reads or adds to it works on its own copy (_copy). Its processes see temporary
    caches, as every test's do."""
    d = tmp_path_factory.mktemp("searched")
    with temp_caches(d, _user_cache_home):
        with Store(d / "c.db") as store:
            return d / "c.db", _run(store)


def _copy(searched, tmp_path) -> Store:
    """A Store on a copy of the shared search's cache, in this test's directory."""
    src, dst = sqlite3.connect(searched[0]), sqlite3.connect(tmp_path / "c.db")
    src.backup(dst)
    src.close(), dst.close()
    return Store(tmp_path / "c.db")


def test_search_stores_every_trial_and_a_winner_per_bucket(searched):
    store, rep = Store(searched[0]), searched[1]
    assert rep.failed == 0 and rep.measured > 0
    assert {(w.problem_key, w.bucket) for w in store.winners()} == {(p.key, b) for p in (DENSE, MOE) for b in (1, 4)}
    # chunk_n 512 and 2048 are >= N=256: rejected statically, stored once for all buckets (bucket 0)
    rejected = [t for t in store.get_trials(DENSE.key, 0, rep.winners[0].device_key) if t.status == "rejected"]
    assert len(rejected) == 4 and all("same as no chunking" in t.reason for t in rejected)
    ok = store.get_trials(DENSE.key, 4, rep.winners[0].device_key)
    assert ok and all(t.status == "ok" and t.rel_err < 1e-2 and t.median_us > 0 and t.reps >= 2 for t in ok)
    assert "no GPU" in " ".join(rep.notes)


def test_rerun_resumes_without_measuring(tmp_path, searched):
    store, first = _copy(searched, tmp_path), searched[1]
    again = _run(store)
    assert again.measured == 0 and again.resumed == first.measured
    assert [(w.problem_key, w.bucket, w.tactic_id) for w in again.winners] == \
        [(w.problem_key, w.bucket, w.tactic_id) for w in first.winners]
    more = _run(store, buckets=(1, 4, 16))            # only the new bucket is measured
    assert more.measured == first.measured // 2
    con = sqlite3.connect(tmp_path / "c.db")
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_wrong_or_crashing_tactics_never_win(tmp_path, faulty):
    store = Store(tmp_path / "c.db")
    rep = _run(store, problems=(DENSE,), families=("faulty", "torch"), buckets=(4,))
    trials = {t.params_json: t for t in store.get_trials(DENSE.key, 4, rep.winners[0].device_key)}
    by_mode = {eval_mode(k): t for k, t in trials.items() if '"faulty"' in k}
    assert by_mode["zeros"].status == "failed" and "relative error" in by_mode["zeros"].reason
    assert by_mode["scaled"].status == "failed" and "relative error" in by_mode["scaled"].reason
    assert by_mode["skip_half"].status == "failed" and "not written" in by_mode["skip_half"].reason
    assert by_mode["raise"].status == "failed" and "deliberate failure" in by_mode["raise"].reason
    assert by_mode["good"].status == "ok"
    (w,) = rep.winners
    assert '"good"' in w.params_json or w.family == "torch"
    # failures are not retried unless asked
    assert _run(store, problems=(DENSE,), families=("faulty", "torch"), buckets=(4,)).measured == 0
    assert _run(store, problems=(DENSE,), families=("faulty", "torch"), buckets=(4,), retry_failed=True).failed == 4
    # a later run with fewer families reads the others' stored trials without tripping over them
    assert _run(store, problems=(DENSE,), families=("torch",), buckets=(4,)).measured == 0


def eval_mode(params_json):
    import json
    return json.loads(params_json)["params"]["mode"]


def test_dispatch_serves_the_winners(tmp_path, searched):
    store = _copy(searched, tmp_path)          # DENSE (and MOE) searched at buckets 1 and 4
    d = Dispatcher(store, env=CPU, record_misses=False)
    w = inputs.make_inputs(DENSE, 3, "cpu", seed=7)[0]
    kernel = d((3, DENSE.n, DENSE.k))
    ref = inputs.reference(DENSE, w)
    y = kernel(w.x, w.w)
    assert y.shape == (3, 256) and y.dtype == torch.bfloat16
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2
    assert d.stats["hit"] == 1 and d.tactic_for(DENSE, 3)[0] == "winner"
    assert d((1000, DENSE.n, DENSE.k)) is d((4, DENSE.n, DENSE.k))     # clamped to the largest bucket


def test_dispatch_miss_returns_default_warns_once_and_records(tmp_path):
    path = tmp_path / "c.db"
    Store(path).close()
    d = Dispatcher(path, env=CPU)
    p = Problem.dense(64, 128)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k1 = d((5, 64, 128))
        k2 = d((5, 64, 128))
        d((9, 64, 128))
    assert k1 is k2 and sum("no tuned tactic" in str(c.message) for c in caught) == 1
    s = inputs.make_inputs(p, 5, "cpu", seed=1)[0]
    assert float((k1(s.x, s.w).double() - inputs.reference(p, s)).norm() / inputs.reference(p, s).norm()) < 1e-2
    d.flush_misses()
    misses = {(m.problem_key, m.m): m.count for m in Store(path).misses()}
    assert misses == {(p.key, 5): 2, (p.key, 9): 1}


def test_winner_from_other_library_version_is_a_miss(tmp_path, searched):
    import dataclasses
    store = _copy(searched, tmp_path)          # DENSE's winner at bucket 4 stored under this torch
    env = CPU
    other = dataclasses.replace(env, libs=tuple((k, "0.0-other" if k == "torch" else v) for k, v in env.libs))
    d = Dispatcher(store, env=other, record_misses=False)
    with pytest.warns(UserWarning, match="no tuned tactic"):
        d((4, DENSE.n, DENSE.k))
    assert d.stats["miss"] == 1 and d.skipped


def test_dispatch_rejects_bad_m_naming_the_value(tmp_path):
    d = Dispatcher(tmp_path / "c.db", env=CPU, record_misses=False)
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"M must be a positive integer, got {bad}"):
            d((bad, 256, 512))
        with pytest.raises(ValueError, match=f"M must be a positive integer, got {bad}"):
            d(DENSE, bad)
    with pytest.raises(ValueError, match="K=100 is not a multiple"):
        d((4, 256, 100))


def test_a_family_skipped_on_this_device_counts_as_show_counts(tmp_path, monkeypatch):
    """A family that cannot run on this device counts as skipped, not kept, in the search's report,
    exactly as `show` (which counts the stored trials) counts it."""
    from autotune.report import collect
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    store = Store(tmp_path / "c.db")
    fams = [registry.get("triton"), registry.get("torch")]
    assert not fams[0].available("cpu")[0]
    rep = search([DENSE], families=fams, store=store, buckets=Buckets.of((1,)), timer=FAST, env=CPU)
    plans = {fp.family: fp for fp in rep.plans[DENSE.key]}
    assert plans["triton"].kept == 0 and plans["triton"].skipped > 0 and plans["triton"].rejected > 0
    assert "not measured (family skipped on this device)" in plans["triton"].line()
    (dev,) = collect(store).devices
    shown = {v.family: v for v in dev.verdicts}
    for fam in ("triton", "torch"):
        assert (shown[fam].kept, shown[fam].rejected) == (plans[fam].kept, plans[fam].rejected), fam


class _Job:
    def __init__(self, key, n):
        self.problem = Problem.from_key(key)
        self.tactics = (None,) * n


def test_plain_progress_prints_per_problem_and_every_few_seconds_of_an_injected_clock():
    from autotune.engine.progress import Progress
    now, lines = [0.0], []
    p = Progress(lines.append, every_s=10.0, clock=lambda: now[0])
    a1, a2, b1 = _Job(DENSE.key, 3), _Job(DENSE.key, 3), _Job(MOE.key, 2)
    p.start([a1, a2, b1], resumed=4)
    p.advance(1, a1)
    assert lines == []                                  # under 10 s of the clock: nothing yet
    now[0] = 10.0
    p.advance(1, a1)
    assert lines == ["progress: 6 trials, 0/3 (problem, bucket) jobs"]      # no job finished: no time left yet
    p.job_done(a1)
    assert len(lines) == 1                              # the problem still has a bucket running
    p.advance(3, a2)
    p.job_done(a2)
    assert lines[-1] == f"progress: 9 trials, 2/3 (problem, bucket) jobs; about 0:00:05 left; {DENSE.key} done: no winner"
    p.advance(2, b1)
    p.job_done(b1)
    assert lines[-1] == f"progress: 11 trials, 3/3 (problem, bucket) jobs; {MOE.key} done: no winner" \
        and len(lines) == 3


def test_progress_says_the_time_left_from_each_problems_cost_per_job_and_each_verdict_as_it_finishes():
    """#48 item 4: the time left counts a problem's unfinished jobs at that problem's measured time per
    finished job (a dense job 2 s, a MoE job 12 s here), the mean per job for a problem with none
    finished, however many tactics a job keeps (a ranked job decides a few of them); nothing once every
    job is done; a problem's line names its winners as it finishes."""
    from autotune.core.records import Winner
    from autotune.engine.progress import Progress
    now, lines = [0.0], []
    p = Progress(lines.append, every_s=1e9, clock=lambda: now[0])
    d1, d2, d3, m1, m2 = (_Job(DENSE.key, 200), _Job(DENSE.key, 200), _Job(DENSE.key, 200), _Job(MOE.key, 300),
                          _Job(MOE.key, 300))
    d1.bucket, d2.bucket, d3.bucket, m1.bucket, m2.bucket = 1, 8, 64, 1, 8
    p.start([d1, d2, d3, m1, m2], resumed=0)
    assert p.left_s() is None                           # no job finished: no figure
    for _ in range(2):
        now[0] += 1.0
        p.advance(1, d1)
    assert p.left_s() is None
    w = Winner(DENSE.key, 1, "d", "t", "torch", '{"family": "torch", "params": {"chunk_n": 0}}', "l", 12.5, "t",
               None, None)
    p.job_done(d1, w)
    assert p.left_s() == 2 * 2.0 + 2 * 2.0              # the MoE problem has no finished job: the mean so far
    now[0] += 12.0
    p.advance(3, m1)
    p.job_done(m1, None)
    assert p.left_s() == 2 * 2.0 + 1 * 12.0
    now[0] += 2.0
    p.advance(2, d2)
    p.job_done(d2, None)
    assert p.left_s() == 1 * 2.0 + 1 * 12.0
    assert lines == []                                  # no problem finished, the clock's interval not reached
    now[0] += 2.0
    p.advance(2, d3)
    p.job_done(d3, None)
    assert lines[-1] == ("progress: 9 trials, 4/5 (problem, bucket) jobs; about 0:00:12 left; "
                         f"{DENSE.key} done: 1 bucket won — M=1 torch[chunk_n=0] 12.5 us")
    now[0] += 12.0
    p.advance(3, m2)
    p.job_done(m2, None)
    assert p.left_s() == 0 and lines[-1] == f"progress: 12 trials, 5/5 (problem, bucket) jobs; {MOE.key} done: no winner"


def test_search_options_and_keywords_are_the_same_search(tmp_path):
    from autotune.engine.search import SearchOptions
    fams = [registry.get("torch")]
    a = search([DENSE], families=fams, store=None, buckets=Buckets.of((1,)), dry_run=True, env=CPU)
    b = search([DENSE], families=fams, store=None, buckets=Buckets.of((1,)),
               options=SearchOptions(dry_run=True, env=CPU))
    assert [fp.line() for fp in a.plans[DENSE.key]] == [fp.line() for fp in b.plans[DENSE.key]]
    with pytest.raises(TypeError):
        search([DENSE], families=fams, store=None, buckets=Buckets.of((1,)), no_such_option=1)


def test_max_tactics_counts_as_show_counts(tmp_path):
    """Tactics outside the --max-tactics sample are not stored; the search says so apart instead
    of counting them kept, so its counts and `show`'s agree."""
    from autotune.report import collect
    store = Store(tmp_path / "c.db")
    p = Problem.dense(4096, 256)                      # every torch member kept (chunk_n < N)
    rep = search([p], families=[registry.get("torch")], store=store, buckets=Buckets.of((1,)), timer=FAST, env=CPU,
                 max_tactics=2)
    (fp,) = rep.plans[p.key]
    assert fp.kept + fp.unsampled == 6 and fp.unsampled in (3, 4)     # 2 sampled, + the default unless sampled
    assert "not measured (outside the --max-tactics sample)" in fp.line()
    (dev,) = collect(store).devices
    (v,) = dev.verdicts
    assert (v.kept, v.rejected) == (fp.kept, fp.rejected)


def test_unchecked_verdicts_are_not_measured_unless_asked(tmp_path, register_family):
    """A tactic whose verdict is unknown because no checked rule covers it is stored as planned but
    never measured, unless measure_unknown (the CLI's --measure-unknown) is given."""
    fam = register_family("unknowns", "tests.families.unknowns:UnknownsFamily")
    unchecked = [t for t in fam.enumerate(DENSE, CPU_ARCH) if fam.verdict(DENSE, t, CPU_ARCH).unchecked]
    assert len(unchecked) == 4                          # chunk_n 512 / 2048 × two dtypes
    with Store(tmp_path / "a.db") as s:
        rep = search([DENSE], families=[fam], store=s, buckets=Buckets.of((1,)), timer=FAST, env=CPU)
        measured = {t.tactic_id for t in s.get_trials(DENSE.key, 1, CPU.device_key)}
    assert measured and not measured & {t.id for t in unchecked}
    assert any("4 tactics with an unchecked verdict (unknown) not measured" in n for n in rep.notes)
    with Store(tmp_path / "b.db") as s:
        search([DENSE], families=[fam], store=s, buckets=Buckets.of((1,)), timer=FAST, env=CPU, measure_unknown=True)
        measured = {t.tactic_id for t in s.get_trials(DENSE.key, 1, CPU.device_key)}
    assert {t.id for t in unchecked} <= measured


@pytest.mark.parametrize("strategy", ["halving", "ranked"])
def test_a_tactic_its_family_calls_useless_at_a_bucket_is_not_timed_there(tmp_path, register_family, strategy):
    """Family.useful (a decode-only kernel, e.g. cuda moe_tok past 2 pairs per expert): the search
    times the chunked tactics at M = 1 only, the unchunked ones and the default everywhere; winners
    in every bucket. The ranked strategy plans from the same rows (engine.strategies.base.kept_at)."""
    register_family("decodeonly", "tests.families.decodeonly:DecodeOnlyFamily")
    fam = registry.get("decodeonly")
    store = Store(tmp_path / "c.db")
    wide = Problem.dense(1024, 256)                                  # chunk_n 512 < N: a kept chunked tactic
    rep = search([wide], families=[fam], store=store, buckets=Buckets.of((1, 4)), timer=FAST, env=CPU,
                 strategy=strategy)
    assert rep.failed == 0
    dev = rep.winners[0].device_key
    timed = {b: {t.tactic_id for t in store.get_trials(wide.key, b, dev) if t.status in ("ok", "dropped")}
             for b in (1, 4)}
    kept = [t for t in fam.enumerate(wide, CPU_ARCH) if fam.verdict(wide, t, CPU_ARCH).ok]
    chunked = {t.id for t in kept if t["chunk_n"]}
    assert chunked and chunked & timed[1] and not chunked & timed[4]
    assert {w.bucket for w in store.winners()} == {1, 4}
    assert fam.default(wide, CPU_ARCH).id in timed[4]


def test_the_stage_summary_is_a_table_with_parts_indented_and_not_added():
    from autotune.report.text import stage_lines
    data = {"time": [906, 133.2], "check": [300, 54.0], "check: call": [300, 50.0], "check: build": [300, 0.5],
            "setup": [70, 12.0], "compile: overlapped": [3, 4.0]}
    lines = list(stage_lines(data))
    assert lines[0].startswith("time per stage") and lines[1].split() == ["stage", "seconds", "count", "ms", "each"]
    assert [ln.split()[0] for ln in lines[2:]] == ["time", "check", "call", "build", "setup", "compile", "overlapped"]
    assert lines[3].startswith("check ") and lines[4].startswith("  call ") and lines[5].startswith("  build ")
    assert lines[8].startswith("  overlapped") and lines[7].strip() == "compile"     # its stage never timed alone
    assert all(len(ln) <= 100 for ln in lines)
