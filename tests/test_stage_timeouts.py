"""Every stage under a timeout: a precompile that hangs is killed past --timeout-s and
stored failed with the stage and the signal (a segfaulting one too), and the search goes on; a
store that cannot complete ends the search naming the stage; SIGTERM ends like SIGINT (a message,
the claims released). On f11bb21 the precompile had no timeout (in-process with one compile
worker: the search hung) and SIGTERM exited 143 silently, its claim held for the TTL.

No test asserts a duration: the limits are counts and a hang guard (SIGALRM / subprocess timeout)
that only turns a hang into a failure."""
from __future__ import annotations

import json
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import event

from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.strategies.successive_halving import Halving
from autotune.engine.search import Runner, StoreFailed, search
from autotune.cache import Store
from autotune.tactics import registry
from tests.helpers import ROOT

CPU = cpu()
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
DENSE = Problem.dense(256, 512)
GUARD_S = 240


@pytest.fixture
def hang_guard():
    """A hang becomes a test failure (TimeoutError), not a stuck CI job."""
    def fire(signum, frame):
        raise TimeoutError(f"hang guard: still running after {GUARD_S} s")
    prev = signal.signal(signal.SIGALRM, fire)
    signal.alarm(GUARD_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, prev)


@pytest.fixture
def pcfaults(register_family):
    fam = register_family("pcfaults", "tests.families.precompile_faults:PrecompileFaults")
    yield fam
    registry.get.cache_clear()


def _trials(store, bucket):
    return {Tactic.from_json(t.params_json)["mode"]: t for t in store.get_trials(DENSE.key, bucket, CPU.device_key)
            if t.family == "pcfaults"}


@pytest.mark.parametrize("compile_workers", [1, 2])
def test_a_hanging_precompile_is_killed_and_the_search_goes_on(tmp_path, pcfaults, hang_guard, event_deadlines,
                                                              compile_workers):
    store = Store(tmp_path / "c.db")
    rep = search([DENSE], families=[pcfaults], store=store, buckets=Buckets.of((4,)), timer=FAST, env=CPU,
                 halving=Halving(budget_s=0.2), runner=Runner(timeout_s=3, compile_workers=compile_workers))
    at0 = _trials(store, 0)
    assert at0["hang"].status == "failed" and at0["hang"].exit_signal == signal.SIGKILL
    assert at0["hang"].reason.startswith("precompile failed: timed out after 3 s while precompiling pcfaults")
    assert at0["segfault"].status == "failed" and at0["segfault"].exit_signal == signal.SIGSEGV
    assert "precompile failed: compile worker died with SIGSEGV" in at0["segfault"].reason
    assert "good" not in at0                                   # compiled fine: no bucket-0 row
    assert rep.compiled == 3 and rep.failed == 2
    at4 = _trials(store, 4)
    assert set(at4) == {"good"} and at4["good"].status == "ok"  # the failed ones are never built
    assert [w.bucket for w in rep.winners] == [4]


@pytest.mark.parametrize("how, stage", [
    ("query_only", "storing the problems and static verdicts"),
    ("trigger", r"storing the ok trial of \S+ for dense:bf16\*nvfp4->bf16:n256:k512 m=4: "),
])
def test_a_store_that_cannot_complete_ends_the_search_naming_the_stage(tmp_path, pcfaults, hang_guard, event_deadlines,
                                                                      how, stage):
    """Real SQLite refusals, no mock: every write refused (query_only), or the bucket-4 trial
    aborted by a trigger added after the cache was opened (a write failing mid-search)."""
    path = tmp_path / "c.db"
    store = Store(path)
    if how == "query_only":
        store.engine.dispose()
        event.listen(store.engine, "connect", lambda c, _r: c.execute("PRAGMA query_only = ON"))
    else:
        c = sqlite3.connect(path)
        c.execute("CREATE TRIGGER full BEFORE INSERT ON trials WHEN NEW.bucket = 4 "
                  "BEGIN SELECT RAISE(ABORT, 'no space left on device'); END")
        c.commit()
        c.close()
    with pytest.raises(StoreFailed) as e:
        search([DENSE], families=[pcfaults], store=store, buckets=Buckets.of((4,)), timer=FAST, env=CPU,
               halving=Halving(budget_s=0.2), runner=Runner(timeout_s=3))
    msg = str(e.value)
    assert re.match(f"search stopped at the store stage, {stage}", msg), msg
    assert ("readonly" in msg or "no space left" in msg) and "\n" not in msg


def _tiny_llama(tmp_path: Path) -> Path:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
                               "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4}))
    return cfg


def test_sigterm_ends_a_search_like_sigint(tmp_path):
    """A search whose check hangs (the crashing family's `hang`, --timeout-s far away) is sent
    SIGTERM once it holds its job's claim: one message, exit 143, the claim released."""
    db = tmp_path / "c.db"
    code = ("import sys\n"
            "from autotune.tactics import registry\n"
            "registry.register('crashing', 'tests.families.crashing:CrashingFamily')\n"
            "from autotune import cli\n"
            f"sys.argv = ['autotune', 'search', '--model', {str(_tiny_llama(tmp_path))!r}, '--only', 'down_proj',\n"
            f"            '--families', 'crashing', '--buckets', '4', '--timeout-s', '900', '--cache', {str(db)!r},\n"
            "            '--compile-workers', '1']\n"
            "cli.main()\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        deadline = time.monotonic() + GUARD_S           # hang guard only
        while not _claims(db):
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "the search never claimed its job"
            time.sleep(0.2)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=GUARD_S)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + signal.SIGTERM, err
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("[", "fp4-autotune:"))]
    assert lines[-1].startswith("autotune search: stopped by SIGTERM; its claims are released"), err
    assert "Traceback" not in err
    assert _claims(db) == 0


def _claims(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return c.execute("SELECT count(*) FROM claims WHERE state = 'claimed'").fetchone()[0]
        finally:
            c.close()
    except sqlite3.OperationalError:       # not created yet
        return 0
