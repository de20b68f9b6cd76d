"""Dispatch on the CPU: the rung ladder, pinning, per-entry validation, misses and read-only caches.

Real SQLite files, real torch-family kernels; winners are written through the Store API (the
search itself is tested in test_search.py)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from helpers import run_cli, keyed
from autotune.core import inputs
from autotune.core.tactic import parse_tactic
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.misses import search_input_from_misses
from autotune.runtime.pins import parse_pins
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.records import Miss, Winner
from autotune.integrations.portable import export_cache
from autotune.cache import Store
from autotune.core.tactic import Tactic
from tests.helpers import make_cache, run_unprivileged, unprivileged_base

CPU = cpu()
P = Problem.dense(256, 512)
Q = Problem.dense(128, 256)
MOE = Problem.moe(128, 256, experts=4, top_k=2)
LIB = CPU.lib_key(("torch",))
T_A = Tactic("torch", dequant_dtype="fp32", chunk_n=0)
T_B = Tactic("torch", dequant_dtype="bf16", chunk_n=0)
T_C = Tactic("torch", dequant_dtype="fp32", chunk_n=512)     # rejected for N=256 (chunk >= N)
ROOT = Path(__file__).resolve().parents[1]


def win(t: Tactic, bucket: int, p: Problem = P, *, lib: str = LIB, device: str | None = None,
        params_json: str | None = None, tactic_id: str | None = None) -> Winner:
    return keyed(Winner(p.key, bucket, device or CPU.device_key, tactic_id or t.id, t.family,
                        params_json or t.to_json(), lib, 10.0, T_A.id, 11.0, 1.1))


def quiet(**kw) -> Dispatcher:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Dispatcher(env=CPU, record_misses=False, warn=False, **kw)


def rel_err(kernel, p: Problem, m: int) -> float:
    s = inputs.make_inputs(p, m, "cpu", seed=3)[0]
    ref = inputs.reference(p, s)
    y = kernel(s.x, s.w)
    return float((y.double() - ref).norm() / ref.norm())


# ------------------------------------------------------------------------------------ ladder

def test_ladder_exact_nearest_clamp_and_counters(tmp_path):
    d = quiet(cache=make_cache(tmp_path / "c.db", [win(T_A, 1), win(T_B, 4), win(T_A, 16)]))
    t = d.table(P)
    assert t.buckets == (1, 4, 16) and t.tactics == (T_A, T_B, T_A)
    assert d((4, 256, 512)) is t.kernels[1]                 # exact
    assert d((3, 256, 512)) is t.kernels[1]                 # nearest: smallest bucket >= M
    assert d((5, 256, 512)) is t.kernels[2]
    assert d((1000, 256, 512)) is t.kernels[2]              # clamped to the largest
    assert d(P, 1) is t.kernels[0]                          # the (problem, M) form
    assert t.counts == [0, 2, 0, 3, 0] and d.stats["exact"] == 2 and d.stats["nearest"] == 3
    assert d.stats["hit"] == 5 and d.stats["miss"] == 0
    assert t.rung_for(16) == ("exact", T_A) and t.rung_for(17) == ("nearest", T_A)
    assert t.counts == [0, 2, 0, 3, 0]                      # rung_for does not count
    assert t.kernels[0] is t.kernels[2]                     # one kernel per (problem, tactic)
    for m in (1, 3, 40):
        assert rel_err(d((m, 256, 512)), P, m) < 1e-2


def test_default_rung_counts_misses_per_m_and_warns_once(tmp_path):
    d = Dispatcher(make_cache(tmp_path / "c.db", [win(T_A, 4)]), env=CPU, record_misses=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k1 = d((5, 128, 256))
        assert d((5, 128, 256)) is k1 and d(Q, 9) is k1
        assert rel_err(k1, Q, 5) < 1e-2
        rel_err(k1, Q, 7)
    assert sum("no tuned tactic" in str(c.message) for c in caught) == 1
    assert d.table(Q).counts == [0, 0, 0, 0, 3]
    assert d.misses == {(Q.key, 5): 2, (Q.key, 9): 1}
    assert d.rung_for(Q, 5) == ("default", d._default_tactic(Q))
    assert d.tactic_for(P, 4) == ("winner", T_A)


def test_bad_m_and_k_name_the_value(tmp_path):
    d = quiet(cache=make_cache(tmp_path / "c.db", [win(T_A, 4)]))
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"M must be a positive integer, got {bad}"):
            d((bad, 256, 512))
        with pytest.raises(ValueError, match=f"M must be a positive integer, got {bad}"):
            d(Q, bad)
    with pytest.raises(ValueError, match="K=100 is not a multiple"):
        d((4, 256, 100))


def test_hot_path_touches_no_sql(tmp_path):
    """After load the cache file can vanish: lookups never go back to it."""
    path = make_cache(tmp_path / "c.db", [win(T_A, 4)])
    d = quiet(cache=path)
    path.unlink()
    assert d((3, 256, 512)) is d.table(P).kernels[0]


# ------------------------------------------------------------------------------ validation

def test_every_stored_entry_is_checked_before_use(tmp_path):
    bad_params = Tactic("torch", dequant_dtype="fp64", chunk_n=0)             # not in the family's schema
    path = make_cache(tmp_path / "c.db", [
        win(T_A, 1), win(bad_params, 2, Q), win(T_C, 4), win(T_B, 8, lib="0" * 16),
        win(T_A, 16, device="1" * 16)])
    con = sqlite3.connect(path)      # a tampered row: params that no longer hash to the stored id
    con.execute("UPDATE tactics SET params_json = ? WHERE id = ?", (T_B.to_json(), T_A.id))
    con.execute("INSERT INTO winners (problem_key, bucket, device_key, tactic_id, family, lib_key, median_us, "
                "default_tactic_id, default_median_us, speedup, updated_at, code_key) "
                "VALUES (?, 32, ?, ?, 'nope', ?, 1, ?, 1, 1, '2026-01-01', ?)",
                (P.key, CPU.device_key, T_A.id, LIB, T_A.id, win(T_A, 32).code_key))   # family column lies
    con.commit()
    con.close()
    d = quiet(cache=path)
    assert d.skipped == {"tactic does not match its id": 2, "invalid torch parameters": 1,
                         "torch verdict rejects it on cpu": 1, "torch library version differs": 1}
    assert d.table(P).buckets == () and d.rung_for(P, 4)[0] == "default"     # nothing usable: default rung


def test_unknown_family_and_foreign_device_are_misses(tmp_path):
    odd = Tactic("cutlass_sm200_only", tile="256x256")
    d = quiet(cache=make_cache(tmp_path / "c.db", [win(odd, 4), win(T_A, 8, device="2" * 16)]))
    assert d.skipped == {"unknown family": 1}            # the foreign device's row is never even read
    assert d.rung_for(P, 8)[0] == "default"


@pytest.mark.parametrize("damage", ["truncated", "not sqlite", "newer schema", "foreign sqlite", "empty file"])
def test_broken_cache_serves_defaults_never_crashes(tmp_path, damage):
    path = make_cache(tmp_path / "c.db", [win(T_A, 4)])
    raw = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(raw[:len(raw) // 2])
    elif damage == "not sqlite":
        path.write_bytes(b"\x80\x04\x95 not a cache " * 50)
    elif damage == "newer schema":
        con = sqlite3.connect(path)
        con.execute("UPDATE schema_version SET version = 999")
        con.commit()
        con.close()
    elif damage == "foreign sqlite":
        path.unlink()
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE winners (a)")
        con.commit()
        con.close()
    else:
        path.write_bytes(b"")
    with pytest.warns(UserWarning, match="cache not used"):
        d = Dispatcher(path, env=CPU, record_misses=False, warn=False)
    assert d.cache_error
    k = d((4, 256, 512))
    assert d.stats["default"] == 1 and rel_err(k, P, 4) < 1e-2


# ---------------------------------------------------------------------------------- pinning

def test_pin_api_overrides_winners_and_unpin_restores(tmp_path):
    d = quiet(cache=make_cache(tmp_path / "c.db", [win(T_A, 4)]))
    d.pin(P, T_B)
    k = d((4, 256, 512))
    assert d.table(P).rung_for(4) == ("pinned", T_B) and d.table(P).counts[0] == 1
    assert k is d._kernel(P, T_B) and rel_err(k, P, 4) < 1e-2
    d.pin(Q, "torch[chunk_n=0,dequant_dtype=bf16]")              # the form `autotune show` prints
    assert d.rung_for(Q, 7) == ("pinned", T_B)
    d.unpin(P)
    assert d((4, 256, 512)) is d.table(P).kernels[0] and d.rung_for(P, 4)[0] == "exact"


def test_pin_refuses_invalid_or_rejected_tactics(tmp_path):
    d = quiet(cache=make_cache(tmp_path / "c.db", []))
    with pytest.raises(ValueError, match="dequant_dtype='fp64' not in"):
        d.pin(P, Tactic("torch", dequant_dtype="fp64", chunk_n=0))
    with pytest.raises(ValueError, match="chunk_n 512 >= N 256"):
        d.pin(P, T_C)
    with pytest.raises(ValueError, match="unknown family 'nope'"):
        d.pin(P, Tactic("nope"))
    with pytest.raises(ValueError, match="not a tactic"):
        d.pin(P, "torch(chunk_n=0)")


def test_pin_from_environment_both_forms(tmp_path, monkeypatch):
    path = make_cache(tmp_path / "c.db", [win(T_A, 4)])
    monkeypatch.setenv("AUTOTUNE_PIN", f"{P.key}=torch[dequant_dtype=bf16,chunk_n=0]")
    d = quiet(cache=path)
    assert d.rung_for(P, 4) == ("pinned", T_B) and d.rung_for(Q, 4)[0] == "default"
    monkeypatch.setenv("AUTOTUNE_PIN", json.dumps({"*": {"family": "torch", "params": T_B.params}}))
    d = quiet(cache=path)
    assert d.rung_for(P, 4) == ("pinned", T_B) and d.rung_for(Q, 4) == ("pinned", T_B)
    d((2, 256, 512))
    assert d.stats["pinned"] == 1
    monkeypatch.setenv("AUTOTUNE_PIN", "dense:oops=torch[a=1]")
    with pytest.raises(ValueError, match=r"\$AUTOTUNE_PIN: not a problem key"):
        quiet(cache=path)
    monkeypatch.setenv("AUTOTUNE_PIN", "{not json")
    with pytest.raises(ValueError, match=r"\$AUTOTUNE_PIN is not valid JSON"):
        quiet(cache=path)


def test_pin_parsing_evaluates_nothing():
    t = parse_tactic("triton[block_m=64,kernel=w4a16_dequant,num_stages=3,x=1.5,y=true,z=__import__('os')]")
    assert t.params == {"block_m": 64, "kernel": "w4a16_dequant", "num_stages": 3, "x": 1.5, "y": True,
                        "z": "__import__('os')"}
    assert parse_pins("") == {}


# ----------------------------------------------------------------------------------- misses

def test_misses_go_to_a_separate_store_and_flush_only_new_counts(tmp_path):
    path = make_cache(tmp_path / "c.db", [win(T_A, 4)])
    log = tmp_path / "misses.db"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(path, env=CPU, misses=log)
        d((5, 128, 256))
        d((5, 128, 256))
        d(MOE, 3)
    assert d.flush_misses() == 2
    assert d.flush_misses() == 0                     # nothing new: nothing written twice
    d((5, 128, 256))
    assert d.flush_misses() == 1
    got = {(m.problem_key, m.m): m.count for m in Store(log, readonly=True).misses()}
    assert got == {(Q.key, 5): 3, (MOE.key, 3): 1}
    assert Store(path, readonly=True).misses() == []   # the cache itself was not written


def test_misses_default_to_env_then_writable_cache_then_memory(tmp_path, monkeypatch):
    path = make_cache(tmp_path / "c.db", [])
    monkeypatch.setenv("AUTOTUNE_MISSES", str(tmp_path / "m.db"))
    d = quiet(cache=path)
    d._record = True
    d((5, 128, 256))
    assert d.flush_misses() == 1 and len(Store(tmp_path / "m.db").misses()) == 1
    monkeypatch.delenv("AUTOTUNE_MISSES")
    d = quiet(cache=path)
    d._record = True
    d((6, 128, 256))
    assert d.flush_misses() == 1 and [m.m for m in Store(path).misses()] == [6]
    d = quiet(cache=path, misses="memory")
    d._record = True
    d((7, 128, 256))
    assert d.flush_misses() == 0 and d.misses == {(Q.key, 7): 1}


def test_search_input_from_misses():
    other = "9" * 16
    misses = [Miss(Q.key, 5, CPU.device_key, 2), Miss(Q.key, 9, CPU.device_key, 1), Miss(MOE.key, 3, CPU.device_key, 4),
              Miss(P.key, 700, other, 1), Miss("dense:garbage", 2, CPU.device_key, 1)]
    problems, ms, bad = search_input_from_misses(misses, CPU.device_key)
    assert problems == sorted([Q, MOE], key=lambda p: p.key) and ms == (3, 5, 9) and bad == 1
    problems, ms, _ = search_input_from_misses(misses, CPU.device_key, {Q.key})
    assert problems == [Q] and ms == (5, 9)


# --------------------------------------------------------------------------- read-only cache

def _listing(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


def test_export_file_opens_immutable_and_leaves_no_files(tmp_path):
    src = make_cache(tmp_path / "src.db", [win(T_A, 4)])
    img = tmp_path / "image"
    img.mkdir()
    with Store(src) as s:
        export_cache(s, img / "cache.db")
    before = _listing(img)
    with Store(img / "cache.db", readonly=True) as ro:
        assert "immutable=1" in str(ro.engine.url)         # rollback-journal export: nothing can be writing it
    d = quiet(cache=img / "cache.db")
    assert d.rung_for(P, 4)[0] == "exact" and _listing(img) == before
    live = Store(tmp_path / "live.db")                    # a live (WAL) cache is read with locking
    live.close()
    with Store(tmp_path / "live.db", readonly=True) as ro:
        assert "immutable" not in str(ro.engine.url)
    with Store(tmp_path / "live.db", readonly=True, immutable=True) as ro:   # Dispatcher(immutable=True)
        assert "immutable=1" in str(ro.engine.url)


def test_readonly_filesystem_image(tmp_path):
    """A cache in a read-only directory, read by an unprivileged process: loads, serves, writes
    nothing beside the cache, keeps misses in memory or sends them to $AUTOTUNE_MISSES."""
    base = unprivileged_base(tmp_path)
    img, var = base / "img", base / "var"
    img.mkdir()
    var.mkdir()
    with Store(make_cache(base / "src.db", [win(T_A, 4)])) as s:
        export_cache(s, img / "cache.db")
    live = make_cache(img / "live.db", [win(T_A, 4)])     # a WAL-mode cache copied in as is
    assert live.exists()
    for p in (img / "cache.db", img / "live.db"):
        os.chmod(p, 0o444)
    os.chmod(img, 0o555)
    os.chmod(base, 0o755)
    os.chmod(var, 0o777)

    def body() -> None:
        before = _listing(img)
        for name in ("cache.db", "live.db"):
            d = quiet(cache=img / name)
            d._record = True
            assert d.rung_for(P, 4)[0] == "exact" and d.cache_error is None
            d((3, 256, 512))
            d((5, 128, 256))
            assert d.flush_misses() == 0 and d.misses == {(Q.key, 5): 1}     # memory only
            d = Dispatcher(img / name, env=CPU, warn=False, misses=var / "misses.db")
            d((5, 128, 256))
            assert d.flush_misses() == 1
        assert _listing(img) == before
        assert {(m.problem_key, m.m, m.count) for m in Store(var / "misses.db", readonly=True).misses()} == \
            {(Q.key, 5, 2)}
    run_unprivileged(body, base, img)




# -------------------------------------------------------------------------------------- CLI

def test_cli_show_misses_and_search_from_misses(tmp_path):
    path = make_cache(tmp_path / "c.db", [])
    from autotune.core.env import current
    dev = current()                                    # this machine's env, as the CLI sees it
    with Store(tmp_path / "m.db") as s:
        s.put_environment(dev, ("torch",))
        s.record_misses([Miss(Q.key, 5, dev.device_key, 7), Miss(Q.key, 2, dev.device_key, 1),
                         Miss(P.key, 9, "8" * 16, 3)])
    r = run_cli("show", "--misses", env={"AUTOTUNE_MISSES": str(tmp_path / "m.db"), "AUTOTUNE_CACHE": str(path)})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{Q.key}  m=5  7×") and len(lines) == 3
    r = run_cli("search", "--from-misses", "--families", "torch", "--dry-run",
             env={"AUTOTUNE_MISSES": str(tmp_path / "m.db"), "AUTOTUNE_CACHE": str(path)})
    assert r.returncode == 0, r.stderr
    assert Q.key in r.stdout and P.key not in r.stdout
    r = run_cli("search", "--from-misses", "--dry-run", env={"AUTOTUNE_CACHE": str(path)})
    assert r.returncode == 2 and "no recorded misses" in r.stderr
    r = run_cli("search", "--dry-run", env={"AUTOTUNE_CACHE": str(path)})
    assert r.returncode == 2 and "--model" in r.stderr


def test_example_engine_linear_runs(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOTUNE_CACHE", "AUTOTUNE_PIN", "AUTOTUNE_MISSES")}
    r = subprocess.run([sys.executable, "examples/engine_linear.py"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "M= 200  up: nearest" in r.stdout and "'default': 0" in r.stdout and "n1536:k512', 5): 1" in r.stdout


def test_misses_to_search_to_exact_hits_end_to_end(tmp_path):
    """Serve with no winners -> misses recorded -> `autotune search --from-misses` measures exactly
    those (problem, M) -> a new dispatcher answers them from the exact rung."""
    from autotune.core.env import current
    env = current()
    Store(tmp_path / "c.db").close()
    d = Dispatcher(tmp_path / "c.db", env=env, misses=tmp_path / "m.db", warn=False)
    for m in (3, 5, 5):
        d((m, 128, 256))
    assert d.flush_misses() == 2
    r = run_cli("search", "--from-misses", "--families", "torch", "--cache", tmp_path / "c.db", "--budget-s", "0.2",
             env={"AUTOTUNE_MISSES": str(tmp_path / "m.db")})
    assert r.returncode == 0, r.stderr
    assert "2 winners" in r.stdout
    d2 = Dispatcher(tmp_path / "c.db", env=env, record_misses=False, warn=False)
    assert d2.table(Q).buckets == (3, 5)
    assert d2.rung_for(Q, 3)[0] == "exact" and d2.rung_for(Q, 5)[0] == "exact"
    assert rel_err(d2((5, 128, 256)), Q, 5) < 1e-2
