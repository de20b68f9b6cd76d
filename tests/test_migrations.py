"""Schema migrations, tested from the first released schema (V1_DDL, frozen)."""
from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine, inspect, text

from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Miss, Trial, Winner
from autotune.cache import CacheError, Store
from autotune.cache import migrations
from autotune.cache.schema import SCHEMA_VERSION, Base
from autotune.core.tactic import Tactic

ENV = Env("NVIDIA H200", "9.0", 132, "cuda", "570.1", "12.8", None, "0.1.0", (("torch", "2.13.0"),))
P = Problem.dense(256, 512)
T = Tactic("torch", dequant_dtype="bf16", chunk_n=0)


def v1_cache(path) -> None:
    e = create_engine(f"sqlite:///{path}")
    migrations.create_v1(e)
    e.dispose()


def shape(path) -> dict:
    """Tables -> sorted (column, type, nullable, pk) + unique constraints + indexes, as SQLite sees them."""
    e = create_engine(f"sqlite:///{path}")
    ins = inspect(e)
    out = {}
    for t in ins.get_table_names():
        cols = sorted((c["name"], str(c["type"]), c["nullable"], c.get("primary_key", 0)) for c in ins.get_columns(t))
        uniq = sorted(tuple(u["column_names"]) for u in ins.get_unique_constraints(t))
        idx = sorted((i["name"], tuple(i["column_names"])) for i in ins.get_indexes(t))
        fks = sorted((tuple(f["constrained_columns"]), f["referred_table"]) for f in ins.get_foreign_keys(t))
        out[t] = (cols, uniq, idx, fks)
    e.dispose()
    return out


def test_v1_upgrades_to_exactly_the_current_schema(tmp_path):
    v1_cache(tmp_path / "old.db")
    Store(tmp_path / "old.db").close()                 # a writable open runs the steps
    Store(tmp_path / "new.db").close()                 # a fresh cache: create_all
    assert shape(tmp_path / "old.db") == shape(tmp_path / "new.db")
    con = sqlite3.connect(tmp_path / "old.db")
    assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION
    con.close()


def test_frozen_v1_matches_the_declared_schema_while_version_is_1():
    """While SCHEMA_VERSION is 1, schema.py must be V1_DDL; once it moves on, steps must exist."""
    if SCHEMA_VERSION == 1:
        e = create_engine("sqlite://")
        migrations.create_v1(e)
        f = create_engine("sqlite://")
        Base.metadata.create_all(f)
        assert set(inspect(e).get_table_names()) == set(Base.metadata.tables)
        for t in Base.metadata.tables:
            assert [c["name"] for c in inspect(e).get_columns(t)] == [c["name"] for c in inspect(f).get_columns(t)], t
    assert all(v in migrations.STEPS for v in range(2, SCHEMA_VERSION + 1))


def test_v1_cache_with_data_reads_and_writes_after_upgrade(tmp_path):
    v1_cache(tmp_path / "old.db")
    con = sqlite3.connect(tmp_path / "old.db")
    con.execute("INSERT INTO tactics VALUES (?, 'torch', ?)", (T.id, T.to_json()))
    con.execute("INSERT INTO winners VALUES (?, 4, ?, ?, 'torch', 'lib', 2.0, ?, 3.0, 1.5, '2026-01-01 00:00:00')",
                (P.key, ENV.device_key, T.id, T.id))
    con.execute("INSERT INTO misses VALUES (?, 7, ?, 3)", (P.key, ENV.device_key))
    con.commit()
    con.close()
    with Store(tmp_path / "old.db", readonly=True) as ro:             # read-only: no migration, still readable
        assert [w.bucket for w in ro.winners()] == [4]
    with Store(tmp_path / "old.db") as s:
        assert s.winners()[0].tactic_id == T.id and s.misses() == [Miss(P.key, 7, ENV.device_key, 3)]
        s.put_environment(ENV, ("torch",))
        s.put_trial(Trial(P.key, 4, T.id, "torch", T.to_json(), ENV.device_key, "lib", "ok", median_us=2.0))
        s.put_winner(Winner(P.key, 8, ENV.device_key, T.id, "torch", T.to_json(), "lib", 1.0, T.id, 1.0, 1.0))
        s.record_misses([Miss(P.key, 7, ENV.device_key, 1)])
        assert [w.bucket for w in s.winners()] == [4, 8] and s.misses()[0].count == 4


def test_steps_run_in_order_once_each_in_a_transaction(tmp_path):
    v1_cache(tmp_path / "c.db")
    e = create_engine(f"sqlite:///{tmp_path / 'c.db'}")
    ran = []

    def add_seen(c):
        ran.append(2)
        c.exec_driver_sql("ALTER TABLE misses ADD COLUMN last_seen DATETIME")

    def backfill(c):
        ran.append(3)
        c.exec_driver_sql("UPDATE misses SET last_seen = '2026-01-01'")

    steps = {2: add_seen, 3: backfill}
    assert migrations.upgrade(e, steps, target=3) == [2, 3]
    assert migrations.upgrade(e, steps, target=3) == []          # already there: nothing runs again
    assert ran == [2, 3]
    with e.connect() as c:
        assert migrations.version(c) == 3
        assert "last_seen" in [col["name"] for col in inspect(c).get_columns("misses")]
    e.dispose()


def test_failing_step_leaves_the_cache_untouched(tmp_path):
    v1_cache(tmp_path / "c.db")
    e = create_engine(f"sqlite:///{tmp_path / 'c.db'}")

    def half_done(c):
        c.exec_driver_sql("ALTER TABLE misses ADD COLUMN last_seen DATETIME")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        migrations.upgrade(e, {2: half_done}, target=2)
    with e.connect() as c:
        assert migrations.version(c) == 1
        assert "last_seen" not in [col["name"] for col in inspect(c).get_columns("misses")]
    e.dispose()


def test_missing_step_is_a_clear_error(tmp_path):
    v1_cache(tmp_path / "c.db")
    e = create_engine(f"sqlite:///{tmp_path / 'c.db'}")
    with pytest.raises(migrations.MigrationError, match="no migration step to schema 2 \\(cache is at 1, code at 3\\)"):
        migrations.upgrade(e, {3: lambda c: None}, target=3)
    with e.connect() as c:
        assert migrations.version(c) == 1
        assert c.execute(text("SELECT count(*) FROM schema_version")).scalar() == 1
    e.dispose()


def test_newer_cache_is_refused_not_migrated(tmp_path):
    v1_cache(tmp_path / "c.db")
    con = sqlite3.connect(tmp_path / "c.db")
    con.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    for ro in (False, True):
        with pytest.raises(CacheError, match="newer fp4-autotune"):
            Store(tmp_path / "c.db", readonly=ro)


def test_v2_rows_upgrade_to_code_keys_readable_and_never_current(tmp_path):
    """Schema 3 adds the code key: rows stored before get '' (no code certified them), stay readable
    (read-only opens do not migrate), and a trial of this code's key sits beside the old one."""
    from helpers import keyed
    from autotune.tactics import registry
    v1_cache(tmp_path / "v2.db")
    e = create_engine(f"sqlite:///{tmp_path / 'v2.db'}")
    assert migrations.upgrade(e, target=2) == [2]                    # the frozen v1 DDL plus step 2
    e.dispose()
    con = sqlite3.connect(tmp_path / "v2.db")
    con.execute("INSERT INTO tactics VALUES (?, 'torch', ?)", (T.id, T.to_json()))
    lib = ENV.lib_key(("torch",))
    con.execute("INSERT INTO trials (problem_key, bucket, tactic_id, family, device_key, lib_key, status, reason, "
                "median_us, reps, created_at) VALUES (?, 4, ?, 'torch', ?, ?, 'ok', '', 2.0, 3, '2026-01-01')",
                (P.key, T.id, ENV.device_key, lib))
    con.execute("INSERT INTO winners VALUES (?, 4, ?, ?, 'torch', ?, 2.0, ?, 3.0, 1.5, '2026-01-01 00:00:00')",
                (P.key, ENV.device_key, T.id, lib, T.id))
    con.commit()
    con.close()
    with Store(tmp_path / "v2.db", readonly=True) as ro:
        assert ro.schema_version == 2 and [w.code_key for w in ro.winners()] == [""]
        assert [t.code_key for t in ro.trials()] == [""] and ro.compiler_figure("triton 3.9.0", "sm90", "nvfp4", T.id, "x") is None
    with Store(tmp_path / "v2.db") as s:
        assert s.schema_version == SCHEMA_VERSION
        [w] = s.winners()
        assert w.code_key == "" and registry.stale_code(w) is not None
        new = keyed(Trial(P.key, 4, T.id, "torch", T.to_json(), ENV.device_key, lib, "ok", median_us=1.0))
        s.put_trial(new)                            # same (problem, bucket, tactic, device, libs): another code key
        assert sorted(t.code_key for t in s.get_trials(P.key, 4, ENV.device_key)) == ["", new.code_key]
        s.put_compiler_figure("triton 3.9.0", "sm90", "nvfp4", T.id, "c0de", 1024, 0)
        assert s.compiler_figure("triton 3.9.0", "sm90", "nvfp4", T.id, "c0de") == (1024, 0, None)
    v1_cache(tmp_path / "fresh-v1.db")
    Store(tmp_path / "fresh-v1.db").close()
    Store(tmp_path / "fresh.db").close()
    assert shape(tmp_path / "fresh-v1.db") == shape(tmp_path / "v2.db") == shape(tmp_path / "fresh.db")


def test_v3_rows_upgrade_to_replay_checked_false_and_new_rows_keep_it(tmp_path):
    """Schema 4 adds `replay_checked` to trials and winners: rows stored before read False (read-only
    opens of the old file too, without migrating), and a new row's True survives the round trip."""
    from helpers import keyed
    v1_cache(tmp_path / "v3.db")
    e = create_engine(f"sqlite:///{tmp_path / 'v3.db'}")
    assert migrations.upgrade(e, target=3) == [2, 3]
    e.dispose()
    lib = ENV.lib_key(("torch",))
    con = sqlite3.connect(tmp_path / "v3.db")
    con.execute("INSERT INTO tactics VALUES (?, 'torch', ?)", (T.id, T.to_json()))
    con.execute("INSERT INTO trials (problem_key, bucket, tactic_id, family, device_key, lib_key, code_key, status, "
                "reason, median_us, reps, created_at) VALUES (?, 4, ?, 'torch', ?, ?, '', 'ok', '', 2.0, 3, '2026-01-01')",
                (P.key, T.id, ENV.device_key, lib))
    con.commit()
    con.close()
    with Store(tmp_path / "v3.db", readonly=True) as ro:
        assert ro.schema_version == 3 and [t.replay_checked for t in ro.trials()] == [False]
    with Store(tmp_path / "v3.db") as s:
        assert s.schema_version == SCHEMA_VERSION == 5
        assert [t.replay_checked for t in s.trials()] == [False]
        new = keyed(Trial(P.key, 8, T.id, "torch", T.to_json(), ENV.device_key, lib, "ok", median_us=1.0,
                          replay_checked=True))
        s.put_trial(new)
        assert [t.replay_checked for t in s.get_trials(P.key, 8, ENV.device_key)] == [True]
        w = Winner(P.key, 8, ENV.device_key, T.id, "torch", T.to_json(), lib, 1.0, T.id, 1.0, 1.0, new.code_key,
                   replay_checked=True)
        s.put_winner(w)
        assert [x.replay_checked for x in s.winners() if x.bucket == 8] == [True]
    Store(tmp_path / "fresh.db").close()
    assert shape(tmp_path / "v3.db") == shape(tmp_path / "fresh.db")
