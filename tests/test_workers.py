"""Isolated workers, successive halving, sharding over workers, Ray, concurrent writers,
and resume after kill -9. Real worker processes, real SQLite, real torch kernels on the CPU."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from autotune.engine import timing
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.engine.strategies.successive_halving import Halving, _rounds, measure
from autotune.core.problem import Problem
from autotune.engine.search import Runner, search
from autotune.cache import Store
from autotune.tactics import registry
from autotune.core.arch import ARCHS
from autotune.core.tactic import Tactic
from autotune.core import winner as winner_rule
from tests.families.crashing import BUILD_LOG, SLEEP_MS
from tests.helpers import gated_search_argv, run_cli, temp_caches, wait_for
from tests.writers import write_concurrently

ROOT = Path(__file__).resolve().parent.parent
CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
DENSE = Problem.dense(256, 512)
MOE = Problem.moe(128, 256, experts=8, top_k=2)


@pytest.fixture
def crashing(monkeypatch, tmp_path, register_family):
    register_family("crashing", "tests.families.crashing:CrashingFamily")
    log = tmp_path / "builds.log"
    monkeypatch.setenv(BUILD_LOG, str(log))
    yield log
    registry.get.cache_clear()


def _by_tactic(store, problem, bucket):
    return {Tactic.from_json(t.params_json): t for t in store.get_trials(problem.key, bucket, CPU.device_key)}


def test_rounds_schedule():
    h = Halving(eta=3, finalists=3)
    assert _rounds(100, h) == [34, 12, 4, 3]
    assert _rounds(6, h) == [] and _rounds(7, h) == [3]
    with pytest.raises(ValueError):
        Halving(budget_s=0)


def test_faults_cost_only_their_worker(tmp_path, crashing, event_deadlines):
    store = Store(tmp_path / "c.db")
    fams = [registry.get("crashing"), registry.get("torch")]
    rep = search([DENSE], families=fams, store=store, buckets=Buckets.of((4,)), timer=FAST, env=CPU,
                 halving=Halving(budget_s=0.5), runner=Runner(timeout_s=4, compile_workers=2))
    got = _by_tactic(store, DENSE, 4)
    # a compile failure (joblib pool, before any timing) is a failed trial for every bucket (0), never built
    at0 = {t["mode"]: tr for t, tr in _by_tactic(store, DENSE, 0).items() if t.family == "crashing"}
    assert at0["nocompile"].status == "failed" and "compile failed: RuntimeError: ptxas" in at0["nocompile"].reason
    assert Tactic("crashing", mode="nocompile", sleep_ms=0.0) not in got
    assert rep.compiled == len(SLEEP_MS) + 6      # every kept crashing tactic, none of the rejected
    mode = {t["mode"]: tr for t, tr in got.items() if t.family == "crashing" and t["mode"] != "good"}
    assert mode["segfault"].status == "failed" and "SIGSEGV" in mode["segfault"].reason
    assert mode["segfault"].exit_signal == signal.SIGSEGV
    assert mode["hang"].status == "failed" and "timed out after 4 s" in mode["hang"].reason
    assert mode["hang"].exit_signal == signal.SIGKILL
    assert mode["exit"].status == "failed" and "exited with status 7" in mode["exit"].reason
    assert mode["raise"].status == "failed" and "deliberate failure" in mode["raise"].reason
    assert mode["zeros"].status == "failed" and "relative error" in mode["zeros"].reason
    assert rep.failed == 6
    # every good tactic measured despite the crashes before it, and checked against the reference
    good = [tr for t, tr in got.items() if t.family == "torch" or t["mode"] == "good"]
    assert len(good) == len(SLEEP_MS) + 2 and all(tr.status in ("ok", "dropped") and tr.rel_err < 1e-2 for tr in good)
    # the over-limit tactic is stored once as rejected and was never built
    rejected = [tr for tr in store.get_trials(DENSE.key, 0, CPU.device_key) if tr.status == "rejected"]
    assert any("smem 300000" in tr.reason for tr in rejected)
    built = set(crashing.read_text().split())
    assert not built & ({tr.tactic_id for tr in rejected} | {at0["nocompile"].tactic_id})
    (w,) = rep.winners
    wt = Tactic.from_json(w.params_json)
    assert w.tactic_id not in {tr.tactic_id for tr in mode.values()}
    # a good one, never a faulty one; which good one is the winner rule over the stored timings (a
    # "fast" claim would depend on this machine's load: the sleeps are wall-clock)
    assert wt.family == "torch" or wt["mode"] == "good"
    assert w.tactic_id == winner_rule.choose(store.get_trials(DENSE.key, 4, CPU.device_key), w.default_tactic_id).tactic_id
    # failures are final unless --retry-failed
    again = search([DENSE], families=fams, store=store, buckets=Buckets.of((4,)), timer=FAST, env=CPU,
                   halving=Halving(budget_s=0.5), runner=Runner(timeout_s=4))
    assert again.measured == 0 and again.failed == 0


class CostedExecutor:
    """An executor whose timings are injected costs (no clock): halving's decisions then depend on
    the costs alone, never on how busy the machine is."""

    device = "cpu"

    def __init__(self, cost_us: dict[str, float]):
        self.cost_us, self.timed = cost_us, []

    def setup(self, problem_key, bucket, seed):
        pass

    def check(self, tactic):
        return {"rel_err": 0.0, "smem_compiled": None}

    def time(self, tactic, timer):
        self.timed.append(tactic.id)
        c = self.cost_us[tactic.id]
        return {"median_us": c, "iqr_us": 0.0, "reps": timer.min_reps}

    def close(self):
        pass


def test_successive_halving_drops_slow_tactics_and_keeps_the_default():
    # nine tactics, the designated default the slowest: one round keeps 3 (+ the default), drops 5
    ts = [Tactic("torch", chunk_n=i, dequant_dtype="fp32") for i in range(9)]
    cost = {t.id: 10.0 + i for i, t in enumerate(ts)}
    default = ts[-1]
    out = []
    measure(CostedExecutor(cost), ts, default.id, FAST, Halving(budget_s=0.5), out.append)
    by = {o.tactic: o for o in out}
    assert len(out) == len(ts) and set(by) == set(ts)
    dropped = [t for t, o in by.items() if o.status == "dropped"]
    assert sorted(dropped, key=lambda t: t["chunk_n"]) == ts[3:8]           # the five slowest but the default
    assert all("successive halving: dropped after round 1" in by[t].reason for t in dropped)
    assert by[default].status == "ok"                                      # the baseline always reaches the final
    assert [t for t, o in by.items() if o.status == "ok"] == ts[:3] + [default]
    assert all(by[t].median_us == cost[t.id] for t in ts)


@pytest.fixture
def sleepy(register_family):
    return register_family("sleepy", "tests.families.crashing:SleepyFamily")
    registry.get.cache_clear()


def test_halving_then_exhaustive_in_a_search_counts(tmp_path, sleepy):
    """The search around halving: dropped trials are stored as such, --exhaustive re-times exactly
    those. Counts only — which ones drop depends on real timings of real worker processes. The
    rounds, not the count-bound host rule: that one takes over where a check call costs more than
    the budget's share per tactic (55 ms here), which a loaded machine's can (8 dropped, seen with
    a load average of 10), so it is off (host_window=0) and the count does not depend on speed."""
    store = Store(tmp_path / "c.db")
    fams = [sleepy]
    search([DENSE], families=fams, store=store, buckets=Buckets.of((1,)), timer=FAST, env=CPU,
           halving=Halving(budget_s=0.5, host_window=0.0), runner=Runner(timeout_s=30))
    got = {t: tr for t, tr in _by_tactic(store, DENSE, 1).items() if True}
    dropped = [t for t, tr in got.items() if tr.status == "dropped"]
    # 8 good + the torch default alive: _rounds(9) == [3], so 9 - 3 - (the default, if it ranked below) drop
    assert len(got) == len(SLEEP_MS) + 1 and len(dropped) in (5, 6)
    assert all("successive halving" in got[t].reason for t in dropped)
    default = registry.get("torch").default(DENSE, ARCHS["cpu"])   # the designated baseline (torch)
    assert got[default].status == "ok"
    rep2 = search([DENSE], families=fams, store=store, buckets=Buckets.of((1,)), timer=FAST, env=CPU,
                  halving=Halving(exhaustive=True), runner=Runner(timeout_s=30))
    assert rep2.measured == len(dropped)
    after = _by_tactic(store, DENSE, 1)
    assert all(after[t].status == "ok" for t in got)


def _keys(store):
    out = set()
    for p in (DENSE, MOE):
        for b in (1, 2, 4, 8):
            out |= {(p.key, b, t.tactic_id, t.status) for t in store.get_trials(p.key, b, CPU.device_key)
                    if t.status != "dropped"}
    return out


_SHARD_KW = dict(buckets=Buckets.of((1, 2, 4, 8)), timer=FAST, env=CPU, halving=Halving(budget_s=0.1, exhaustive=True))


@pytest.fixture(scope="module")
def one_worker(tmp_path_factory, _user_cache_home):
    """The search on one worker that each sharded search is compared with (run once per module;
    its process sees the temporary cache directories, as every test does)."""
    d = tmp_path_factory.mktemp("one-worker")
    one = Store(d / "one.db")
    with temp_caches(d, _user_cache_home):
        return one, search([DENSE, MOE], store=one, families=[registry.get("torch")], **_SHARD_KW)


@pytest.mark.parametrize("runner", [Runner(workers=2), Runner(gpus=(0, 1))], ids=["workers2", "gpus0,1"])
def test_sharding_over_workers_measures_each_job_once(tmp_path, runner, one_worker):
    (one, r1), two = one_worker, Store(tmp_path / "two.db")
    r2 = search([DENSE, MOE], store=two, runner=runner, families=[registry.get("torch")], **_SHARD_KW)
    assert len(r2.shards) == 2 and sum(r2.shards.values()) == 8 and min(r2.shards.values()) >= 1
    assert r2.measured == r1.measured and r2.failed == 0
    assert _keys(one) == _keys(two)                     # the same trials, each stored once
    assert {(w.problem_key, w.bucket) for w in r2.winners} == {(p.key, b) for p in (DENSE, MOE) for b in (1, 2, 4, 8)}
    # where the time went, summed over both workers: one setup per job, one store per trial
    st = r2.stages.data
    assert st["setup"][0] == 8 and st["store"][0] == r2.measured + r2.failed
    assert st["check"][0] == r2.measured and st["time"][0] >= r2.measured
    assert all(sec > 0 for _, sec in st.values())


def test_ray_local_cluster(tmp_path):
    pytest.importorskip("ray")
    store = Store(tmp_path / "ray.db")
    rep = search([DENSE, MOE], families=[registry.get("torch")], store=store, buckets=Buckets.of((1, 4)),
                 timer=FAST, env=CPU, halving=Halving(budget_s=0.1), runner=Runner(ray="local", workers=2))
    assert sum(rep.shards.values()) == 4 and rep.failed == 0
    assert rep.stages.data["setup"][0] == 4          # stage times come back from the Ray tasks
    assert {(w.problem_key, w.bucket) for w in store.winners()} == {(p.key, b) for p in (DENSE, MOE) for b in (1, 4)}
    ok = [t for p in (DENSE, MOE) for b in (1, 4) for t in store.get_trials(p.key, b, CPU.device_key)]
    assert ok and all(t.status in ("ok", "dropped") and t.rel_err < 1e-2 for t in ok)


# -- eight concurrent writers ------------------------------------------------------------------

def test_eight_concurrent_writers_lose_nothing(tmp_path):
    url = str(tmp_path / "shared.db")
    write_concurrently(url, 40)
    con = sqlite3.connect(url)
    assert con.execute("select count(*) from trials").fetchone() == (320,)
    assert con.execute("select count(*) from winners").fetchone() == (320,)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# -- kill -9 at any moment, then resume -------------------------------------------------------

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 1000}


def _search_args(cfg: Path, db: Path) -> list[str]:
    return ["search", "--model", str(cfg), "--families", "torch", "--buckets", "1,2,4,8", "--cache", str(db),
            "--budget-s", "0.3", "--json"]


def _rows(db: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        return con.execute("select count(*) from trials where bucket > 0").fetchone()[0]
    except sqlite3.Error:
        return 0


def test_kill_9_leaves_a_sound_cache_and_rerun_measures_only_the_rest(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY))
    db = tmp_path / "c.db"
    mark = tmp_path / "stopped"
    # the handshake: the search stops (alive, its worker too) once it has stored 5 measured trials
    proc = subprocess.Popen(gated_search_argv(_search_args(cfg, db), 5, mark), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    wait_for(mark.exists, "stop after 5 trials", proc)
    assert proc.poll() is None and _rows(db) >= 5
    os.killpg(proc.pid, signal.SIGKILL)                 # the search and its worker, mid-search
    proc.wait()
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    before = con.execute("select count(*) from trials where bucket > 0").fetchone()[0]
    con.close()
    out = run_cli(*_search_args(cfg, db), timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    total = sqlite3.connect(db).execute("select count(*) from trials where bucket > 0").fetchone()[0]
    assert rep["resumed"] == before and rep["measured"] + rep["failed"] == total - before
    assert len(rep["winners"]) == len(rep["problems"]) * 4


def test_a_worker_that_cannot_start_aborts_without_failing_tactics(tmp_path, monkeypatch):
    # a broken environment (here: an interpreter without torch) must not mark every tactic failed
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n")
    py.chmod(0o755)
    monkeypatch.setattr("autotune.engine.workers.sys.executable", str(py))
    store = Store(tmp_path / "c.db")
    with pytest.raises(RuntimeError, match="could not start: worker exited with status 1.*No module named 'torch'"):
        search([DENSE], families=[registry.get("torch")], store=store, buckets=Buckets.of((1,)), timer=FAST,
               env=CPU, runner=Runner(timeout_s=30))
    assert not [t for t in store.get_trials(DENSE.key, 1, CPU.device_key)]


def test_a_worker_takes_the_jobs_of_the_problem_it_holds_first():
    """run_local's pick (workers._next): a worker keeps to its problem's buckets (its weights are
    drawn once), a free one starts the first problem no other worker holds, and a worker whose
    problems are all held by others helps with the first queued job."""
    from types import SimpleNamespace
    from autotune.engine.workers import _next
    q = [SimpleNamespace(problem=SimpleNamespace(key=k), bucket=b) for k, b in
         (("a", 1), ("a", 2), ("b", 1), ("b", 2), ("c", 1))]
    held = {"w0": None, "w1": None}
    assert _next(q, held, "w0") == 0
    held["w0"] = "a"
    assert _next(q, held, "w1") == 2                  # not a's second bucket: w0 holds a
    held["w1"] = "b"
    q.pop(0)
    assert _next(q, held, "w0") == 0 and _next(q, held, "w1") == 1
    q[:] = [j for j in q if j.problem.key == "a"]
    assert _next(q, held, "w1") == 0                  # only w0's problem is left: w1 helps
