"""Several searches on one cache share the (problem, bucket) jobs through claims.

Unit tests move an injected clock instead of sleeping; the process tests run real `autotune
search` processes on one SQLite file and compare counts from the trials table, never times.
The PostgreSQL versions are in tests/test_postgres.py (they reuse this file's helpers)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from autotune.core.codekey import code_key
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine.claims import TTL_ENV, ClaimSettingError, JobClaims, ttl_s
from autotune.engine.search import Job
from autotune.cache import CacheError, Store, migrations
from autotune.cache.schema import SCHEMA_VERSION
from autotune.cache.claims import CLAIMED, DONE, Claims, JobKey, owner_alive
from tests.claims_race import race_claimers
from tests.helpers import gated_search_argv, run_cli, wait_for

ROOT = Path(__file__).resolve().parent.parent
P = Problem.dense(256, 512)
KEY = JobKey.of(P.key, 4, "dev", ["libA", "libB"])


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


# -- cache/claims.py --------------------------------------------------------------------------

def test_claim_renew_expire_take_over_finish(tmp_path):
    store, clock = Store(tmp_path / "c.db"), Clock()
    a, b = Claims(store, "hostA:1:a", clock), Claims(store, "hostB:1:b", clock)
    got = a.claim(KEY, 60)
    assert got.won and got.took_from is None and got.holder.owner == "hostA:1:a"
    assert got.holder.expires_at == 1060 and got.holder.state == CLAIMED
    clock.t = 1059
    lost = b.claim(KEY, 60)
    assert not lost.won and lost.holder.owner == "hostA:1:a"        # live: b must not measure it
    assert a.renew(60) == 1 and a.get(KEY).expires_at == 1119
    clock.t = 1100                                                   # past the first expiry, not the renewed one
    assert not b.claim(KEY, 60).won
    clock.t = 1119                                                   # expired (expires_at <= now)
    took = b.claim(KEY, 60)
    assert took.won and took.took_from == "hostA:1:a" and took.why == "expired"
    assert a.renew(60) == 0 and not a.finish(KEY)                    # a's claim is gone: neither renews nor finishes
    assert a.get(KEY).owner == "hostB:1:b" and a.get(KEY).state == CLAIMED
    assert b.finish(KEY) and b.get(KEY).state == DONE
    clock.t = 1120
    again = a.claim(KEY, 60)                                         # a done job may be claimed again (a rerun
    assert again.won and again.why == "done"                         # then measures only what the cache lacks)
    assert [c.owner for c in a.all()] == ["hostA:1:a"]


def test_claim_is_keyed_by_problem_bucket_device_and_library_set(tmp_path):
    store, clock = Store(tmp_path / "c.db"), Clock()
    a, b = Claims(store, "hostA:1:a", clock), Claims(store, "hostB:1:b", clock)
    assert a.claim(KEY, 60).won
    assert JobKey.of(P.key, 4, "dev", ["libB", "libA", "libA"]) == KEY      # a set: order and repeats do not count
    for other in (JobKey.of(P.key, 8, "dev", ["libA", "libB"]), JobKey.of(P.key, 4, "gpu2", ["libA", "libB"]),
                  JobKey.of(P.key, 4, "dev", ["libA", "libC"]), JobKey.of(Problem.dense(256, 1024).key, 4, "dev",
                                                                          ["libA", "libB"])):
        assert b.claim(other, 60).won, other
    assert not b.claim(KEY, 60).won


def test_release_frees_unfinished_claims_only(tmp_path):
    store, clock = Store(tmp_path / "c.db"), Clock()
    a, b = Claims(store, "hostA:1:a", clock), Claims(store, "hostB:1:b", clock)
    k2 = JobKey.of(P.key, 8, "dev", ["libA"])
    assert a.claim(KEY, 60).won and a.claim(k2, 60).won and a.finish(k2)
    assert b.release() == 0                                  # b holds nothing: releases nothing of a's
    assert a.release() == 1                                  # the unfinished one; the done row stays
    assert [(c.key, c.state) for c in a.all()] == [(k2, DONE)]
    assert b.claim(KEY, 60).won


def test_a_gone_owner_on_this_host_is_taken_over_at_once(tmp_path):
    store, clock = Store(tmp_path / "c.db"), Clock()
    host = socket.gethostname()
    dead = f"{host}:{_dead_pid()}:0badc0de"
    assert owner_alive(dead) is False and owner_alive(f"{host}:{os.getpid()}:x") is True
    assert owner_alive("some-other-host:1:x") is None        # another host: only the expiry can tell
    assert Claims(store, dead, clock).claim(KEY, 1e6).won
    assert Claims(store, "some-other-host:1:x", clock).claim(JobKey.of(P.key, 8, "dev", []), 1e6).won
    me = Claims(store, now=clock)
    took = me.claim(KEY, 60)
    assert took.won and took.took_from == dead and took.why == "owner gone" and me.get(KEY).owner == me.owner
    assert not me.claim(JobKey.of(P.key, 8, "dev", []), 60).won     # live as far as anyone here can tell


def test_concurrent_claimers_on_sqlite_win_each_job_once(tmp_path):
    won = race_claimers(str(tmp_path / "c.db"))
    assert all(len(owners) == 1 for owners in won.values()), won


def test_a_read_only_cache_never_writes_claims(tmp_path):
    db = tmp_path / "c.db"
    Store(db).close()
    before = db.read_bytes()
    for immutable in (None, True):
        ro = Store(db, readonly=True, immutable=immutable)
        with pytest.raises(CacheError, match="claims need a writable cache"):
            Claims(ro)
        jc = JobClaims(ro, "dev", ["lib"], lambda j: j.tactics, 60)
        job = _job(4)
        assert jc.start(job) is job and jc.notes()[0].startswith("claims off") and jc.elsewhere == []
        jc.done(job)
        jc.close()
        ro.close()
    assert db.read_bytes() == before
    assert sqlite3.connect(db).execute("SELECT count(*) FROM claims").fetchone() == (0,)


# -- migration: schema 1 caches get the table ---------------------------------------------------

def test_a_schema_1_cache_gets_the_claims_table(tmp_path):
    e = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrations.create_v1(e)
    e.dispose()
    with Store(tmp_path / "old.db", readonly=True) as ro:        # read-only: not migrated, still readable
        assert ro.winners() == []
    assert "claims" not in inspect(create_engine(f"sqlite:///{tmp_path / 'old.db'}")).get_table_names()
    store = Store(tmp_path / "old.db")
    assert Claims(store, "h:1:a", Clock()).claim(KEY, 60).won


def test_two_processes_upgrading_one_old_cache_at_once(tmp_path, monkeypatch):
    """The loser of the race sees its version row collide; it must find the cache upgraded, not fail."""
    e = create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    migrations.create_v1(e)
    assert migrations.upgrade(e) == list(range(2, SCHEMA_VERSION + 1))     # the other process won the race
    real, calls = migrations.version, []

    def stale(c):                                             # this one read version 1 before that commit
        calls.append(1)
        return 1 if len(calls) <= 2 else real(c)
    monkeypatch.setattr(migrations, "version", stale)
    assert migrations.upgrade(e) == []
    assert len(calls) == SCHEMA_VERSION + 1      # the stale reads, the re-read after the collision, one per later step
    e.dispose()


# -- autotune/engine/claims.py ----------------------------------------------------------------

def _job(bucket: int) -> Job:
    ts = tuple(Tactic("torch", dequant_dtype="fp32", chunk_n=c) for c in (0, 64, 128))
    return Job(P, bucket, ts, ts[0].id)


def test_job_claims_heartbeat_is_rate_limited_and_notices_a_lost_claim(tmp_path):
    store, clock = Store(tmp_path / "c.db"), Clock()
    jc = JobClaims(store, "dev", ["lib"], lambda j: j.tactics, 100, now=clock, owner="hostA:1:a")
    job = jc.start(_job(4))
    assert job is not None and len(job.tactics) == 3
    key, peek = jc.key(job), Claims(store, "hostB:1:b", clock)
    clock.t += 24                                  # under TTL/4 since the last beat: no write
    jc.beat()
    assert peek.get(key).expires_at == 1100
    clock.t += 1                                   # TTL/4: the next progress event renews
    jc.beat()
    assert peek.get(key).expires_at == 1125
    clock.t = 1125                                 # no event for a whole TTL (a hung request): expired
    assert peek.claim(key, 100).won
    clock.t += 30
    jc.beat()                                      # the next beat finds the claim taken
    assert jc.lost == {key}
    jc.done(job)                                   # finishing a lost claim leaves the other's alone
    assert peek.get(key).owner == "hostB:1:b" and peek.get(key).state == CLAIMED
    assert any("1 claim(s) expired while this search measured them" in n for n in jc.notes())


def test_job_claims_skip_a_live_job_and_take_only_what_the_cache_lacks(tmp_path):
    store, clock = Store(tmp_path / "c.db"), Clock()
    stored: dict[int, set] = {4: set(), 8: set()}
    remaining = lambda j: tuple(t for t in j.tactics if t.id not in stored[j.bucket])   # noqa: E731
    a = JobClaims(store, "dev", ["lib"], remaining, 100, now=clock, owner="hostA:1:a")
    b = JobClaims(store, "dev", ["lib"], remaining, 100, now=clock, owner="hostB:1:b")
    j4, j8 = _job(4), _job(8)
    assert a.start(j4) is not None
    assert b.start(j4) is None                                     # a measures it: b skips it
    stored[4] |= {t.id for t in j4.tactics}
    a.done(j4)
    assert [j.bucket for j in b.settled()] == [4]                  # done there: b reads its winner now
    assert b.start(j8) is not None
    clock.t += 100                                                 # b is killed mid-job: its claim expires
    stored[8].add(j8.tactics[0].id)                                # one trial had been committed
    c = JobClaims(store, "dev", ["lib"], remaining, 100, now=clock, owner="hostC:1:c")
    rest = c.start(j8)
    assert rest.tactics == j8.tactics[1:] and c.found == 1         # only what the cache lacks
    assert c.taken == [(j8, "hostB:1:b", "expired")]
    stored[8] |= {t.id for t in j8.tactics}
    c.done(j8)
    d = JobClaims(store, "dev", ["lib"], remaining, 100, now=clock, owner="hostD:1:d")
    assert d.start(j4).tactics == () and d.complete == 1           # planned before a finished: nothing left
    notes = b.notes() + d.notes()
    assert "1 job measured by another search" in notes and "1 job measured by another search" in d.notes()
    c.close()
    d.close()
    assert {c_.state for c_ in Claims(store).all()} == {DONE}


def test_an_interrupt_right_after_the_claims_commit_still_releases_it(tmp_path):
    """SIGTERM/SIGINT raised between the claim's insert and the search's own bookkeeping (here: while
    it reads what the cache lacks) must not leave the claim behind for the TTL: close() releases it."""
    store, clock = Store(tmp_path / "c.db"), Clock()

    def interrupted(job):
        assert Claims(store, "peek:1:p", clock).get(jc.key(job)).state == CLAIMED     # committed already
        raise KeyboardInterrupt
    jc = JobClaims(store, "dev", ["lib"], interrupted, 100, now=clock, owner="hostA:1:a")
    with pytest.raises(KeyboardInterrupt):
        jc.start(_job(4))
    jc.close()
    assert Claims(store).all() == []
    # a job another search holds is not released by this one's close
    other = JobClaims(store, "dev", ["lib"], lambda j: j.tactics, 100, now=clock, owner="hostB:1:b")
    assert other.start(_job(8)) is not None
    mine = JobClaims(store, "dev", ["lib"], lambda j: j.tactics, 100, now=clock, owner="hostC:1:c")
    assert mine.start(_job(8)) is None
    mine.close()
    assert [c.owner for c in Claims(store).all()] == ["hostB:1:b"]


def test_ttl_setting(monkeypatch):
    monkeypatch.delenv(TTL_ENV, raising=False)
    assert ttl_s(300) == 600 and ttl_s(900) == 1800
    monkeypatch.setenv(TTL_ENV, "2.5")
    assert ttl_s(300) == 2.5
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(TTL_ENV, bad)
        with pytest.raises(ClaimSettingError, match=f"{TTL_ENV} must be a positive number of seconds"):
            ttl_s(300)


def test_every_worker_request_is_a_heartbeat_of_the_sink_apart_from_the_stages():
    """The claims are renewed through the result sink's heartbeat, one per executor request (setup,
    check, time, free), not by wrapping the stage recorder: the figures stay the recorder's own."""
    from autotune.engine import timing
    from autotune.engine.strategies.successive_halving import Halving
    from autotune.engine.sink import Collect
    from autotune.engine.workers import InlineExecutor, run_job
    got = Collect()
    job = _job(4)
    assert run_job(InlineExecutor("cpu"), job, timing.TimerConfig(min_reps=2, max_reps=3, budget_s=0.01),
                   Halving(budget_s=0.05), 0, got) is None
    requests = sum(n for stage, (n, _) in got.stages.data.items() if ": " not in stage)
    assert got.beats == requests and requests >= 1 + 2 * len(job.tactics)     # setup, a check and a time each
    # the worker's own split of its checks and of the end of the job, one part per request
    for part in ("check: build", "check: pack", "check: run", "check: call"):
        assert got.stages.data[part][0] == got.stages.data["check"][0]
    # the kernel's call is part of the check's run (its sync and the compare are the rest)
    assert got.stages.data["check: call"][1] <= got.stages.data["check: run"][1]
    for part in ("end job: drop", "end job: collect", "end job: figures"):
        assert got.stages.data[part][0] == got.stages.data["end job"][0] == 1
    assert sorted(o.tactic.id for o in got.outcomes) == sorted(t.id for t in job.tactics)


# -- real `autotune search` processes on one cache ----------------------------------------------

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 1000}
BUCKETS = (1, 2)


def cli(cfg: Path, cache: str) -> list[str]:
    return [sys.executable, "-m", "autotune.cli", "search", "--model", str(cfg), "--families", "torch",
            "--buckets", ",".join(map(str, BUCKETS)), "--cache", cache, "--budget-s", "0.2", "--json"]


def _env(**kw) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **kw)
    return env


def one_search(cfg: Path, cache: str, **env) -> subprocess.CompletedProcess:
    """The search of cli() run alone (nothing beside it): a process of this tree through
    tests.helpers.run_cli, which forks it from a process with torch imported where it can."""
    return run_cli(*cli(cfg, cache)[3:], env=env, timeout=600)


def start_searches(cfg: Path, cache: str, n: int, *, gate: Path | None = None, **env) -> list[subprocess.Popen]:
    """n searches on one cache; with `gate`, the first stops (alive, holding the job it measures)
    once it has stored a measured trial, and creates `gate` (tests.helpers.gated_search_argv)."""
    Store(cache).close()        # created (and migrated) once, so the processes race on the claims only
    argv = [cli(cfg, cache)] * n
    if gate is not None:
        argv[0] = gated_search_argv(cli(cfg, cache)[3:], 1, gate)
    return [subprocess.Popen(a, cwd=ROOT, env=_env(**env), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True) for a in argv]


def reports(procs: list[subprocess.Popen]) -> list[dict]:
    out = []
    for p in procs:
        so, se = p.communicate(timeout=600)
        assert p.returncode == 0, se[-2000:]
        out.append(json.loads(so))
    return out


def check_shared(cfg: Path, cache: str, reps: list[dict], trials: int) -> None:
    """Every trial measured by exactly one search; a rerun measures nothing and has every winner."""
    assert sum(r["measured"] + r["failed"] for r in reps) == trials
    r = one_search(cfg, cache)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads(r.stdout)
    assert again["measured"] == 0 and again["resumed"] == trials
    assert len(again["winners"]) == len(again["problems"]) * len(BUCKETS)
    with Store(cache) as s:
        states = [c.state for c in Claims(s).all()]
    assert states == [DONE] * len(again["winners"])


def _trials(db: Path) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT count(*) FROM trials WHERE bucket > 0").fetchone()[0]
    finally:
        con.close()


@pytest.fixture
def cfg(tmp_path) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    return p


def test_four_searches_on_one_sqlite_cache_measure_each_trial_once(tmp_path, cfg):
    db = tmp_path / "c.db"
    reps = reports(start_searches(cfg, str(db), 4))
    assert all(r["failed"] == 0 for r in reps)
    check_shared(cfg, str(db), reps, _trials(db))
    assert sqlite3.connect(db).execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _claims(db: Path) -> list[tuple]:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        return con.execute("SELECT owner, state, claimed_at, expires_at FROM claims").fetchall()
    except sqlite3.Error:
        return []


def test_kill_9_of_one_of_four_searches(tmp_path, cfg):
    db = tmp_path / "c.db"
    gate = tmp_path / "stopped"
    procs = start_searches(cfg, str(db), 4, gate=gate, **{TTL_ENV: "60"})
    victim = procs[0]                     # stops once it stored a trial of a job it holds: the handshake
    wait_for(gate.exists, "stop after a measured trial", victim)
    held = [(s, c, e) for owner, s, c, e in _claims(db) if int(owner.split(":")[1]) == victim.pid]
    assert (CLAIMED, ) in {(s,) for s, _, _ in held}, held
    assert all(60 <= e - c < 600 for _, c, e in held)  # AUTOTUNE_CLAIM_TTL_S, not the default 600 s
    assert victim.poll() is None
    os.killpg(victim.pid, signal.SIGKILL)             # the search and its worker
    victim.wait()
    others = [p for p in procs if p is not victim]
    reps = reports(others)
    con = sqlite3.connect(db)
    assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    con.close()
    before = _trials(db)
    assert sum(r["measured"] + r["failed"] for r in reps) <= before
    # the rerun takes over what the killed search left (its process is gone) and finishes every job
    out = one_search(cfg, str(db), **{TTL_ENV: "60"})
    assert out.returncode == 0, out.stderr[-2000:]
    rerun = json.loads(out.stdout)
    assert rerun["resumed"] == before and rerun["measured"] + rerun["failed"] == _trials(db) - before
    assert len(rerun["winners"]) == len(rerun["problems"]) * len(BUCKETS)
    assert {state for _, state, *_ in _claims(db)} == {DONE}
    assert f":{victim.pid}:" not in " ".join(o for o, *_ in _claims(db))


def plant_and_search(cfg: Path, cache: str) -> tuple[dict, dict[int, tuple]]:
    """Two claims by a search on another host: one live for a day, one expired an hour ago. The
    search must skip the first (and say so) and take the second over."""
    from autotune.core.env import current
    from autotune.models import problems_for
    from autotune.tactics import registry
    first = problems_for(str(cfg))[0].problem.key
    with Store(cache) as s:
        env = current()
        lib = env.lib_key(registry.get("torch").depends_on)
        # what a search of this code claims under: its library keys and every member's code key
        libs = {lib, *(code_key(lib, c) for c in registry.get("torch").codes())}
        now = time.time()
        for b, expires in ((BUCKETS[0], now + 86400), (BUCKETS[1], now - 3600)):
            c = Claims(s, f"far-away-host:{b}:feedbeef", lambda e=expires: e - 600)
            assert c.claim(JobKey.of(first, b, env.device_key, libs), 600).won
    out = one_search(cfg, cache)
    assert out.returncode == 0, out.stderr[-2000:]
    with Store(cache) as s:
        rows = {c.key.bucket: (c.owner, c.state) for c in Claims(s).all() if c.key.problem_key == first}
    return json.loads(out.stdout), rows


def test_a_live_claim_elsewhere_is_skipped_and_an_expired_one_taken_over(tmp_path, cfg):
    rep, rows = plant_and_search(cfg, str(tmp_path / "c.db"))
    check_planted(rep, rows)


def check_planted(rep: dict, rows: dict) -> None:
    assert rows[BUCKETS[0]] == (f"far-away-host:{BUCKETS[0]}:feedbeef", CLAIMED)     # untouched
    assert rows[BUCKETS[1]][1] == DONE and "far-away-host" not in rows[BUCKETS[1]][0]
    assert len(rep["winners"]) == len(rep["problems"]) * len(BUCKETS) - 1
    notes = " | ".join(rep["notes"])
    assert re.search(r"1 job measured by another search; 1 still in progress there \(far-away-host:1:feedbeef", notes)
    assert "took over 1 job(s) left unfinished by another search: far-away-host:2:feedbeef (expired)" in notes


def test_a_bad_ttl_setting_is_a_one_line_error(tmp_path, cfg):
    out = one_search(cfg, str(tmp_path / "c.db"), **{TTL_ENV: "soon"})
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert f"{TTL_ENV} must be a positive number of seconds, got 'soon'" in out.stderr
