"""Dispatcher's parts, each alone: the loader (open, verify, vet rows -> winners), the table
builder, the serving policy as data, the miss recorder; and no dispatcher kept alive by module
state (its misses are still written when it is collected and at exit). Real SQLite, real
torch-family kernels."""
from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import weakref
from collections import Counter
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.core.arch import ARCHS
from autotune.core.env import cpu
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.runtime import loader
from autotune.runtime.builder import TableBuilder
from autotune.runtime.dispatch import Dispatcher
from autotune.runtime.misses import MissRecorder, counted
from autotune.runtime.policy import ServingPolicy, invariant_pick
from tests.helpers import keyed, make_cache

ROOT = Path(__file__).resolve().parents[1]
CPU, ARCH = cpu(), ARCHS["cpu"]
P, Q = Problem.dense(256, 512), Problem.dense(128, 256)
LIB = CPU.lib_key(("torch",))
T_A = Tactic("torch", dequant_dtype="fp32", chunk_n=0)
T_B = Tactic("torch", dequant_dtype="bf16", chunk_n=0)
T_C = Tactic("torch", dequant_dtype="fp32", chunk_n=512)     # rejected for N=256 (chunk >= N)


def win(t: Tactic, bucket: int, p: Problem = P, lib: str = LIB) -> Winner:
    """A winner as a search of this code stores it (with its code key: dispatch serves no other)."""
    return keyed(Winner(p.key, bucket, CPU.device_key, t.id, t.family, t.to_json(), lib, 10.0, T_A.id, 11.0, 1.1))


def builder() -> TableBuilder:
    return TableBuilder(CPU, ARCH, warn=False)


# ------------------------------------------------------------------------------------ loader

def test_loader_vets_rows_into_winners_sorted_by_bucket(tmp_path):
    path = make_cache(tmp_path / "c.db", [win(T_A, 16), win(T_B, 1), win(T_C, 4, Q), win(T_A, 8, lib="0" * 16)])
    got = loader.load(path, CPU, ARCH, builder().kernel, immutable=False)
    assert got.error is None and got.url and got.writable
    assert got.winners == {P: [(1, T_B), (16, T_A)]}
    assert got.skipped == Counter({"torch library version differs": 1, "torch verdict rejects it on cpu": 1})


def test_loader_counts_a_kernel_that_does_not_build(tmp_path):
    def build(p, t):
        raise RuntimeError("no")
    why, p, t = loader.vet(win(T_A, 1), CPU, ARCH, build)
    assert (why, p, t) == ("torch build failed: RuntimeError", None, None)
    assert loader.vet(win(T_A, 1), CPU, ARCH, builder().kernel) == (None, P, T_A)


def test_loader_never_raises_on_a_broken_cache(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"not a database at all" * 10)
    got = loader.load(bad, CPU, ARCH, builder().kernel, immutable=False)
    assert got.error and got.winners == {} and got.url is None and not got.writable


# ------------------------------------------------------------------------------------ builder

def test_builder_builds_each_kernel_once_and_keeps_counts_and_pin_on_reinstall():
    b = builder()
    assert b.kernel(P, T_A) is b.kernel(P, T_A) and b.kernel(P, T_A) is not b.kernel(P, T_B)
    t = b.table(P, [(1, T_A), (16, T_B)])
    assert t.buckets == (1, 16) and t.tactics == (T_A, T_B) and t.default_tactic == b.default_tactic(P)
    t(4)
    t._set_pin(b.kernel(P, T_B), T_B)
    again = b.table(P, [(1, T_A)], old=t)
    assert again.counts is t.counts and again.pinned_tactic == T_B and again.tactics == (T_A,)


# ------------------------------------------------------------------------------------ policy

def test_policy_reads_pins_and_modes_as_data(monkeypatch):
    monkeypatch.setenv("AUTOTUNE_PIN", f"{Q.key}={T_A.to_json()}")
    monkeypatch.delenv("AUTOTUNE_BATCH_INVARIANT", raising=False)
    monkeypatch.delenv("VLLM_BATCH_INVARIANT", raising=False)
    pol = ServingPolicy.from_settings({"*": T_B.to_json()})
    assert pol.pins == {Q.key: T_A, "*": T_B} and not pol.batch_invariant and not pol.one_copy
    assert pol.pin_for(Q) == (T_A, True) and pol.pin_for(P) == (T_B, False)
    assert pol.explicit() == [Q]
    assert ServingPolicy.from_settings(batch_invariant=True, one_copy=True).batch_invariant


def test_invariant_pick():
    inv = {T_A}.__contains__

    def invariant(p, t):
        return inv(t)
    assert invariant_pick(P, [(1, T_A), (4, T_A)], T_B, invariant, "cpu") == (T_A, "")
    pick, note = invariant_pick(P, [(1, T_A), (4, T_B), (8, T_A)], T_B, invariant, "cpu")
    assert pick == T_A and "2 of 3 buckets" in note
    assert invariant_pick(P, [(1, T_B)], T_A, invariant, "cpu")[0] == T_A
    pick, why = invariant_pick(P, [(1, T_B)], T_B, invariant, "cpu")
    assert pick is None and "no batch-invariant tactic" in why


# ------------------------------------------------------------------------------------ misses

def test_recorder_writes_what_grew_and_only_when_recording(tmp_path):
    out = tmp_path / "m.db"
    rec = MissRecorder(CPU.device_key, to=str(out))
    assert rec.flush(Counter({(P.key, 3): 2})) == 1
    assert rec.flush(Counter({(P.key, 3): 2})) == 0                     # nothing new
    assert rec.flush(Counter({(P.key, 3): 5, (Q.key, 1): 1})) == 2
    assert sorted((m.m, m.count) for m in Store(out).misses()) == [(1, 1), (3, 5)]
    assert MissRecorder(CPU.device_key, record=False, to=str(out)).flush(Counter({(P.key, 9): 1})) == 0
    assert MissRecorder(CPU.device_key, to="memory").flush(Counter({(P.key, 9): 1})) == 0
    assert MissRecorder(CPU.device_key, cache_url=None).store() is None      # read-only image: memory


def test_counted_reads_the_default_rungs_misses():
    t = builder().table(P, [])
    t(3), t(3), t(7)
    assert counted({P: t}) == Counter({(P.key, 3): 2, (P.key, 7): 1})


# ------------------------------------------------------------------------------------ lifetime

def test_no_dispatcher_is_kept_alive_and_a_collected_one_writes_its_misses(tmp_path):
    out = tmp_path / "m.db"
    Store(out).close()
    d = Dispatcher(make_cache(tmp_path / "c.db", []), env=CPU, misses=str(out), warn=False)
    d((3, Q.n, Q.k))
    ref = weakref.ref(d)
    del d
    gc.collect()
    assert ref() is None
    assert [(m.problem_key, m.m) for m in Store(out).misses()] == [(Q.key, 3)]


def test_misses_are_written_at_exit(tmp_path):
    out = tmp_path / "m.db"
    Store(out).close()
    c = make_cache(tmp_path / "c.db", [])
    code = textwrap.dedent(f"""
        from autotune.runtime.dispatch import Dispatcher
        d = Dispatcher({str(c)!r}, misses={str(out)!r}, warn=False)
        d((5, {Q.n}, {Q.k}))""")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [(m.problem_key, m.m) for m in Store(out).misses()] == [(Q.key, 5)]
