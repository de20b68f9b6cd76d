"""The cache on PostgreSQL (the shared cache for several hosts): a throwaway server started by the
test (Debian's postgresql, unix socket only, no network), eight concurrent writers, and a real
search writing to it. Skips only where no PostgreSQL server binaries are installed."""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile

import pytest

from autotune.engine import timing
from autotune.core.buckets import Buckets
from autotune.core.env import cpu
from autotune.engine.strategies.successive_halving import Halving
from autotune.core.problem import Problem
from autotune.engine.search import Runner, search
from autotune.cache import Store
from autotune.tactics import registry
from tests.writers import write_concurrently

BIN = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


def _as_postgres(*cmd: str) -> None:
    pre = [] if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--"]
    subprocess.run(pre + list(cmd), check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def pg_url():
    if not BIN:
        pytest.skip("no PostgreSQL server binaries (Debian package postgresql)")
    pytest.importorskip("psycopg")
    bindir = os.path.dirname(BIN[-1])
    d = tempfile.mkdtemp(prefix="autotune-pg-")
    os.chmod(d, 0o755)
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(d, pw.pw_uid, pw.pw_gid)
    port = str(20000 + os.getpid() % 20000)
    _as_postgres(f"{bindir}/initdb", "-D", f"{d}/data", "-A", "trust", "-U", "postgres")
    _as_postgres(f"{bindir}/pg_ctl", "-D", f"{d}/data", "-w", "-l", f"{d}/log",
                 "-o", f"-k {d} -p {port} -c listen_addresses=''", "start")
    try:
        yield f"postgresql+psycopg://postgres@/postgres?host={d}&port={port}"
    finally:
        _as_postgres(f"{bindir}/pg_ctl", "-D", f"{d}/data", "-m", "immediate", "stop")
        shutil.rmtree(d, ignore_errors=True)


def test_eight_concurrent_writers_on_postgres(pg_url):
    write_concurrently(pg_url, 25)
    s = Store(pg_url)
    assert len(s.winners("dev")) == 200
    assert sum(len(s.get_trials(Problem.dense(256, 512).key, b, "dev")) for b in (1, 2, 3, 4)) == 200


def test_search_into_postgres_and_resume(pg_url):
    store = Store(pg_url)
    p = Problem.dense(128, 256)
    kw = dict(families=[registry.get("torch")], store=store, buckets=Buckets.of((1, 4)), env=cpu(),
              timer=timing.TimerConfig(min_reps=2, max_reps=3, budget_s=0.01), halving=Halving(budget_s=0.1),
              runner=Runner(workers=2))
    first = search([p], **kw)
    assert first.measured > 0 and first.failed == 0 and len(first.winners) == 2
    again = search([p], **kw)
    assert again.measured == 0 and again.resumed == first.measured


# -- claims: several searches on one PostgreSQL cache share the jobs ----------------------

def _fresh_db(pg_url: str, name: str) -> str:
    """A database of its own on the throwaway server, so each test starts from an empty cache."""
    from sqlalchemy import create_engine, text
    e = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    with e.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        c.execute(text(f"CREATE DATABASE {name}"))
    e.dispose()
    return pg_url.replace("@/postgres?", f"@/{name}?")


def test_concurrent_claimers_on_postgres_win_each_job_once(pg_url):
    from tests.claims_race import race_claimers
    won = race_claimers(_fresh_db(pg_url, "claims_race"))
    assert all(len(owners) == 1 for owners in won.values()), won


def test_four_searches_on_one_postgres_cache_measure_each_trial_once(pg_url, tmp_path):
    from sqlalchemy import func, select

    from autotune.cache.schema import TrialRow
    from tests.test_claims import TINY, check_shared, reports, start_searches
    cfg = tmp_path / "config.json"
    cfg.write_text(__import__("json").dumps(TINY))
    url = _fresh_db(pg_url, "claims_four")
    reps = reports(start_searches(cfg, url, 4))
    assert all(r["failed"] == 0 for r in reps)
    with Store(url) as s:
        trials = s._read(lambda x: x.execute(select(func.count()).select_from(TrialRow)
                                             .where(TrialRow.bucket > 0)).scalar())
    check_shared(cfg, url, reps, trials)


def test_planted_claims_on_postgres(pg_url, tmp_path):
    from tests.test_claims import TINY, check_planted, plant_and_search
    cfg = tmp_path / "config.json"
    cfg.write_text(__import__("json").dumps(TINY))
    check_planted(*plant_and_search(cfg, _fresh_db(pg_url, "claims_planted")))
