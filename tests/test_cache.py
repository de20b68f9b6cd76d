"""Tests of the persistent cache: real SQLite files in tmp_path, no mocks."""
from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Miss, Trial, Winner
from autotune.integrations.portable import export_cache, import_cache
from autotune.cache import CacheError, Store, default_url
from autotune.cache.schema import SCHEMA_VERSION
from autotune.core.tactic import Tactic
from tests.helpers import run_unprivileged, unprivileged_base

DEPS = ("triton",)
ENV_A = Env("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "12.0", 188, "cuda", "575.51", "12.9", "12090",
            "0.1.0", (("torch", "2.8.0"), ("triton", "3.4.0")))
ENV_B = Env("NVIDIA H200", "9.0", 132, "cuda", "570.1", "12.8", None, "0.1.0", (("triton", "3.3.1"),))
P1 = Problem.dense(3072, 6144)
P2 = Problem.moe(2048, 4096, 64, 8, w_fmt="mxfp4")
T1 = Tactic("triton_fp4", block_m=128, block_n=128, block_k=128, stages=3, warps=8)
T2 = Tactic("triton_fp4", block_m=64, block_n=128, block_k=256, stages=2, warps=4)


def trial(t: Tactic = T1, *, p: Problem = P1, bucket: int = 16, env: Env = ENV_A, status="ok", median=10.0, **kw) -> Trial:
    return Trial(p.key, bucket, t.id, t.family, t.to_json(), env.device_key, env.lib_key(DEPS), status,
                 median_us=median, **kw)


def winner(t: Tactic = T1, *, p: Problem = P1, bucket: int = 16, env: Env = ENV_A, median=8.0) -> Winner:
    return Winner(p.key, bucket, env.device_key, t.id, t.family, t.to_json(), env.lib_key(DEPS), median,
                  T2.id, 10.0, 10.0 / median)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "c.db")
    s.put_environment(ENV_A, DEPS)
    s.put_environment(ENV_B, DEPS)
    yield s
    s.close()


def listing(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*")}


# ------------------------------------------------------------------------------ round trips

def test_environment_problem_tactic_round_trip(store):
    assert store.device(ENV_A.device_key) == ENV_A.to_dict()
    assert store.device("nope") is None
    assert store.libset(ENV_A.lib_key(DEPS)) == {"triton": "3.4.0"}
    assert store.libset("nope") is None
    store.put_environment(replace(ENV_A, driver="580.0"), DEPS)
    assert store.device(ENV_A.device_key)["driver"] == "580.0"          # recorded, not keyed: replaced
    store.put_problem(P1)
    store.put_problem(P2)
    store.put_problem(P1)
    assert store.problems() == sorted([P1, P2], key=lambda p: p.key)
    fused = [Problem.moe(512, 6144, 256, 8, epilogue="swiglu"), Problem.moe(6144, 256, 256, 8, epilogue="reduce")]
    for p in fused:                  # the epilogue lives in the key only: read back from it
        store.put_problem(p)
    assert store.problems() == sorted([P1, P2, *fused], key=lambda p: p.key)
    from autotune.cache.schema import ProblemRow                 # a newer version's key: left out, not misread
    store._write(lambda s: s.add(ProblemRow(key=P1.key + ":gelu", kind="grouped_moe", a_fmt="bf16", w_fmt="nvfp4",
                                            out_dtype="bf16", n=P1.n, k=P1.k, experts=P1.experts, top_k=P1.top_k)))
    from sqlalchemy import func, select
    assert store._read(lambda s: s.scalar(select(func.count()).select_from(ProblemRow))) == 5
    assert store.problems() == sorted([P1, P2, *fused], key=lambda p: p.key)
    store.put_tactic(T2)
    assert store.tactic(T2.id) == T2 and store.tactic("missing") is None
    assert {d["device_key"] for d in store.devices()} == {ENV_A.device_key, ENV_B.device_key}


def test_trials_round_trip_upsert_and_keys(store):
    t1 = trial(T1, median=12.5, iqr_us=0.25, reps=50, rel_err=1e-3, smem_model=98304, smem_compiled=99000)
    t2 = trial(T2, status="rejected", median=None, reason="smem 120 KiB > 99 KiB", smem_model=122880)
    t3 = trial(T2, status="failed", median=None, reason="worker died", exit_signal=11, bucket=32)
    for t in (t1, t2, t3):
        store.put_trial(t)
    assert store.get_trials(P1.key, 16, ENV_A.device_key) == [t1, t2]
    assert store.get_trials(P1.key, 32, ENV_A.device_key) == [t3]
    assert store.get_trials(P1.key, 16, ENV_B.device_key) == []
    assert store.tactic(T1.id) == T1                                    # tactic row came from params_json
    assert P1 in store.problems()
    # a later result for the same key replaces the earlier one
    t1b = trial(T1, median=11.0, reps=100)
    store.put_trial(t1b)
    assert store.get_trials(P1.key, 16, ENV_A.device_key) == [t1b, t2]
    # other libs -> a separate trial
    t1c = replace(t1, lib_key=ENV_B.lib_key(DEPS))
    store.put_trial(t1c)
    assert len(store.get_trials(P1.key, 16, ENV_A.device_key)) == 3
    lk = ENV_A.lib_key(DEPS)
    assert store.trial_keys(ENV_A.device_key) == {(P1.key, 16, T1.id, lk), (P1.key, 16, T2.id, lk),
                                                  (P1.key, 32, T2.id, lk), (P1.key, 16, T1.id, ENV_B.lib_key(DEPS))}
    assert store.trial_keys(ENV_B.device_key) == set()


def test_trial_with_mismatched_tactic_id_is_refused(store):
    bad = replace(trial(), tactic_id=T2.id)
    with pytest.raises(CacheError, match="does not match"):
        store.put_trial(bad)


def test_winners_upsert_filter_delete(store):
    w1, w2, w3 = winner(T1), winner(T2, bucket=32), winner(T1, p=P2, env=ENV_B)
    for w in (w1, w2, w3):
        store.put_winner(w)
    assert set(store.winners()) == {w1, w2, w3}
    assert store.winners(ENV_A.device_key) == [w1, w2]
    w1b = winner(T2, median=5.0)
    store.put_winner(w1b)
    assert store.winners(ENV_A.device_key) == [w1b, w2]
    store.delete_winner(P1.key, 16, ENV_A.device_key)
    assert store.winners(ENV_A.device_key) == [w2]
    store.delete_winner(P1.key, 16, ENV_A.device_key)                # deleting nothing is fine


def test_misses_add_counts(store):
    store.record_misses([Miss(P1.key, 7, ENV_A.device_key, 3), Miss(P1.key, 9, ENV_A.device_key, 1)])
    store.record_misses([Miss(P1.key, 7, ENV_A.device_key, 2), Miss(P2.key, 7, ENV_B.device_key, 5)])
    store.record_misses([])
    assert store.misses(ENV_A.device_key) == [Miss(P1.key, 7, ENV_A.device_key, 5), Miss(P1.key, 9, ENV_A.device_key, 1)]
    assert len(store.misses()) == 3


def test_reopen_keeps_data(tmp_path):
    with Store(tmp_path / "c.db") as s:
        s.put_winner(winner())
    with Store(tmp_path / "c.db") as s:
        assert s.winners() == [winner()]


# ------------------------------------------------------------------------------ sqlite settings

def test_wal_and_pragmas(store):
    with store.engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert c.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert c.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert c.exec_driver_sql("PRAGMA synchronous").scalar() == 1     # NORMAL


def test_default_url(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "a" / "x.db"))
    assert default_url() == f"sqlite:///{tmp_path}/a/x.db"
    monkeypatch.setenv("AUTOTUNE_CACHE", "postgresql://u@h/db")
    assert default_url() == "postgresql://u@h/db"
    monkeypatch.delenv("AUTOTUNE_CACHE")
    assert default_url().startswith("sqlite:////") and default_url().endswith("fp4-autotune/cache.db")


def test_default_store_uses_env(tmp_cache):
    with Store() as s:
        s.put_problem(P1)
    assert tmp_cache.is_file()


def test_in_memory_url():
    with Store("sqlite://") as s:
        s.put_winner(winner())
        assert s.winners() == [winner()]


# ------------------------------------------------------------------------------ read-only

def test_readonly_reads_and_refuses_writes(store):
    store.put_winner(winner())
    store.close()
    ro = Store(store.path, readonly=True)
    assert ro.winners() == [winner()]
    with pytest.raises(CacheError, match="read-only"):
        ro.put_winner(winner(T2))
    with pytest.raises(OperationalError, match="readonly"):           # mode=ro is enforced by SQLite itself
        with ro.engine.begin() as c:
            c.exec_driver_sql("DELETE FROM winners")
    ro.close()
    with Store(store.path) as s:
        assert s.winners() == [winner()]




def test_readonly_on_readonly_file_and_dir(tmp_path):
    base = unprivileged_base(tmp_path)
    d = base / "ro"
    with Store(d / "c.db") as s:
        s.put_winner(winner())
    os.chmod(base, 0o755)
    os.chmod(d / "c.db", 0o444)
    os.chmod(d, 0o555)

    def body() -> None:
        before = listing(d)
        with Store(d / "c.db", readonly=True) as ro:     # a WAL file, no -shm creatable: read immutable
            assert ro.winners() == [winner()]
        assert listing(d) == before
        with pytest.raises(CacheError, match="not writable"):
            Store.check_writable(d / "c.db")
        with pytest.raises(CacheError, match="no write permission"):
            Store.check_writable(d / "new" / "c.db")
        with pytest.raises(CacheError):
            Store(d / "c.db")
        assert listing(d) == before
    run_unprivileged(body, base, d)


def test_readonly_missing_file(tmp_path):
    with pytest.raises(CacheError, match="no cache"):
        Store(tmp_path / "none.db", readonly=True)
    assert listing(tmp_path) == set()


# ------------------------------------------------------------------------------ check_writable

def test_check_writable_ok_creates_nothing(tmp_path):
    Store.check_writable(tmp_path / "new" / "deeper" / "c.db")
    Store.check_writable(f"sqlite:///{tmp_path}/c.db")
    Store.check_writable("postgresql://u@h/db")                        # not checkable without connecting
    assert listing(tmp_path) == set()


def test_check_writable_refuses(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    bad = [f / "c.db", f / "sub" / "c.db", tmp_path, "/proc/fp4-autotune/c.db", "/proc/self/c.db"]
    for p in bad:
        with pytest.raises(CacheError):
            Store.check_writable(p)
    assert listing(tmp_path) == {"file.txt"}
    assert not Path("/proc/fp4-autotune").exists()
    with pytest.raises(CacheError, match="not an fp4-autotune cache"):
        Store.check_writable(f)                                        # exists but is not SQLite


def test_open_unwritable_raises(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(CacheError):
        Store(f / "c.db")
    with pytest.raises(CacheError, match="directory"):
        Store(tmp_path)


# ------------------------------------------------------------------------------ damaged / foreign files

def test_not_sqlite_file(tmp_path):
    p = tmp_path / "junk.db"
    p.write_bytes(os.urandom(4096))
    for ro in (False, True):
        with pytest.raises(CacheError, match="is not an fp4-autotune cache"):
            Store(p, readonly=ro)
    assert p.stat().st_size == 4096


def test_truncated_file(tmp_path):
    p = tmp_path / "c.db"
    with Store(p) as s:
        for b in range(1, 200):
            s.put_trial(trial(bucket=b, reason="x" * 200))
    size = p.stat().st_size
    for cut in (50, size // 2):
        q = tmp_path / f"cut{cut}.db"
        q.write_bytes(p.read_bytes()[:cut])
        with pytest.raises(CacheError, match="is not an fp4-autotune cache"):
            Store(q)


def test_foreign_sqlite_file(tmp_path):
    p = tmp_path / "other.db"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE stuff (a)")
    con.commit()
    con.close()
    with pytest.raises(CacheError, match="is not an fp4-autotune cache: no schema_version"):
        Store(p)


def test_newer_schema(tmp_path):
    p = tmp_path / "c.db"
    Store(p).close()
    con = sqlite3.connect(p)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    for ro in (False, True):
        with pytest.raises(CacheError, match=rf"newer fp4-autotune \(schema {SCHEMA_VERSION + 1} > supported"):
            Store(p, readonly=ro)


# ------------------------------------------------------------------------------ concurrency

def test_threads_lose_no_trials(tmp_path):
    p = tmp_path / "c.db"
    Store(p).close()
    errors = []

    def work(i: int) -> None:
        try:
            with Store(p) as s:
                for b in range(50):
                    s.put_trial(trial(T1 if i % 2 else T2, bucket=1000 * i + b))
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    shared = Store(p)

    def work_shared(i: int) -> None:
        try:
            for b in range(50):
                shared.put_trial(trial(T1, p=P2, bucket=1000 * i + b))
        except Exception as e:  # pragma: no cover
            errors.append(e)
    ts = [threading.Thread(target=f, args=(i,)) for i in range(4) for f in (work, work_shared)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert len(shared.trial_keys(ENV_A.device_key)) == 400
    shared.close()


def _process_worker(path: str, i: int) -> None:
    with Store(path) as s:
        for b in range(50):
            s.put_trial(trial(T1, bucket=1000 * i + b))


def test_processes_lose_no_trials(tmp_path):
    # fork: the children inherit the imported modules, so four processes start in milliseconds
    import multiprocessing
    ctx = multiprocessing.get_context("fork")
    p = tmp_path / "sub" / "c.db"      # processes race to create the file and the tables
    procs = [ctx.Process(target=_process_worker, args=(str(p), i)) for i in range(4)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(60)
        assert pr.exitcode == 0
    with Store(p, readonly=True) as s:
        assert len(s.trial_keys(ENV_A.device_key)) == 200


# ------------------------------------------------------------------------------ export / import

@pytest.fixture
def full(store):
    store.put_winner(winner(T1))
    store.put_winner(winner(T2, bucket=64))
    store.put_winner(winner(T2, p=P2, env=ENV_B))
    return store


@pytest.mark.parametrize("fmt", ["sqlite", "json"])
def test_export_import_round_trip(full, tmp_path, fmt):
    out = tmp_path / f"export.{fmt}"
    assert export_cache(full, out, fmt=fmt).written == 3
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted(["c.db", "c.db-wal", "c.db-shm", out.name])
    with pytest.raises(CacheError, match="refusing to overwrite"):
        export_cache(full, out, fmt=fmt)
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, out)
        assert rep.imported == 3 and rep.skipped == {}
        assert set(dst.winners()) == set(full.winners())
        assert dst.device(ENV_B.device_key) == ENV_B.to_dict()
        assert dst.libset(ENV_A.lib_key(DEPS)) == {"triton": "3.4.0"}
        assert set(dst.problems()) == {P1, P2}
        assert dst.tactic(T2.id) == T2


@pytest.mark.parametrize("fmt", ["sqlite", "json"])
def test_export_filters(full, tmp_path, fmt):
    assert export_cache(full, tmp_path / "h200", gpu="NVIDIA H200", fmt=fmt).written == 1       # exact name
    assert export_cache(full, tmp_path / "rtx", gpu="rtx pro", fmt=fmt).written == 2            # substring
    assert export_cache(full, tmp_path / "pk", problem_keys=[P1.key], fmt=fmt).written == 2
    assert export_cache(full, tmp_path / "none", gpu="H200", problem_keys=[P1.key], fmt=fmt).written == 0
    with pytest.raises(CacheError, match="no device in the cache matches"):
        export_cache(full, tmp_path / "b200", gpu="B200", fmt=fmt)
    assert not (tmp_path / "b200").exists()
    with Store(tmp_path / "dst.db") as dst:
        assert import_cache(dst, tmp_path / "h200").imported == 1
        assert [w.device_key for w in dst.winners()] == [ENV_B.device_key]


def test_import_a_whole_cache_file(full, tmp_path):
    with Store(tmp_path / "dst.db") as dst:
        assert import_cache(dst, full.path).imported == 3


def test_tampered_json(full, tmp_path):
    out = tmp_path / "e.json"
    export_cache(full, out, fmt="json")
    doc = json.loads(out.read_text())
    doc["winners"][0]["median_us"] = 0.001
    out.write_text(json.dumps(doc))
    with Store(tmp_path / "dst.db") as dst:
        with pytest.raises(CacheError, match="checksum mismatch"):
            import_cache(dst, out)
        assert dst.winners() == []
    out.write_text(out.read_text()[:-20])
    with pytest.raises(CacheError, match="not an fp4-autotune export"):
        import_cache(Store(tmp_path / "dst.db"), out)


def test_tampered_sqlite_export(full, tmp_path):
    out = tmp_path / "e.db"
    export_cache(full, out)
    con = sqlite3.connect(out)
    con.execute("UPDATE winners SET median_us = 0.001")
    con.commit()
    con.close()
    with Store(tmp_path / "dst.db") as dst, pytest.raises(CacheError, match="checksum mismatch"):
        import_cache(dst, out)


def _resign(doc: dict) -> dict:
    """Re-sign a modified document the way a careless tool would, so the per-entry checks are reached."""
    import hashlib
    from autotune.core.tactic import canonical_json
    payload = {k: v for k, v in doc.items() if k != "checksum"}
    return {**payload, "checksum": hashlib.sha256(canonical_json(payload).encode()).hexdigest()}


def test_import_skips_invalid_entries(full, tmp_path):
    out = tmp_path / "e.json"
    export_cache(full, out, fmt="json")
    doc = json.loads(out.read_text())
    weird = Tactic("cutlass_sm200_only", tile="256x256")
    doc["tactics"].append({"id": weird.id, "family": weird.family, "params": weird.params})
    base = doc["winners"][0]
    doc["winners"] += [
        {**base, "bucket": 1, "tactic_id": weird.id, "family": weird.family},       # unknown family
        {**base, "bucket": 2, "device_key": "0" * 16},                              # no device row
        {**base, "bucket": 3, "lib_key": "1" * 16},                                 # no libset
        {**base, "bucket": 4, "tactic_id": "f" * 16},                               # no tactic
        {**base, "bucket": "five"},                                                 # malformed
    ]
    doc["devices"].append({**doc["devices"][0], "device_key": "2" * 16})
    doc["winners"].append({**base, "bucket": 6, "device_key": "2" * 16})            # forged device key
    out2 = tmp_path / "e2.json"
    out2.write_text(json.dumps(_resign(doc)))

    def validate(family: str, params: dict) -> str | None:
        return None if family == "triton_fp4" else f"unknown family {family!r}"
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, out2, validate=validate)
        assert rep.imported == 3
        assert rep.skipped == {"unknown family 'cutlass_sm200_only'": 1, "unknown device": 1, "unknown libset": 1,
                               "unknown tactic": 1, "bad bucket": 1, "device record does not match its key": 1}
        assert len(dst.winners()) == 3


def test_import_rejects_garbage(tmp_path):
    dst = Store(tmp_path / "dst.db")
    (tmp_path / "g.bin").write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(CacheError, match="not an fp4-autotune export"):
        import_cache(dst, tmp_path / "g.bin")
    (tmp_path / "o.json").write_text('{"format": "something-else"}')
    with pytest.raises(CacheError, match="not an fp4-autotune export"):
        import_cache(dst, tmp_path / "o.json")
    (tmp_path / "n.json").write_text(json.dumps(_resign({"format": "fp4-autotune-cache", "schema": 99})))
    with pytest.raises(CacheError, match="newer"):
        import_cache(dst, tmp_path / "n.json")
    with pytest.raises(CacheError, match="no export"):
        import_cache(dst, tmp_path / "missing.json")
    dst.close()
