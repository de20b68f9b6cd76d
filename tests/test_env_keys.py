"""Library keys: every dependency a family declares moves its key (a live environment looks up a
dependency no list names), and the built-in families' keys are the ones the committed caches hold."""
from __future__ import annotations

import dataclasses
import lzma
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.core import env as envmod
from autotune.core.env import Env
from autotune.tactics import registry

ROOT = Path(__file__).resolve().parents[1]
#: the device record's libs of docs/data/2026-12-06-h100-2d14637-main-job.db.xz, and each built-in family's
#: lib key over them as f4cc350 computed it (cutlass and cuBLASLt have no trials in a committed cache)
LIBS_AT_F4CC350 = {"cupy": "14.2.0", "flashinfer-python": None, "nvidia-cutlass": None, "nvmath-python": "1.0.1",
                   "torch": "2.11.0", "triton": "3.6.0"}
KEYS_AT_F4CC350 = {"cublaslt": "02076f9ebfd09eda", "cuda": "41ead8348853d878", "cutlass": "4cfd870ac6fc549e",
                   "torch": "b11d1ca58baaa331", "triton": "a27ccc16db2c8ff9"}
CACHES = ("docs/data/2026-12-06-h100-2d14637-main-job.db.xz", "docs/data/2026-12-03-h200-moe-config-sweep.db.xz",
          "docs/data/2026-11-30-h200x2-full-search.db.xz")


def _env_of(rec: dict, live: bool) -> Env:
    return Env(rec["gpu_name"], rec["cc"], rec["sm_count"], "cuda", cublas=rec.get("cublas"),
               libs=tuple(sorted(rec["libs"].items())), live=live)


@pytest.mark.parametrize("name", CACHES)
def test_built_in_keys_recomputed_from_a_committed_caches_env_rows(name, tmp_path):
    p = ROOT / name
    if p.suffix == ".xz":
        (tmp_path / "c.db").write_bytes(lzma.decompress(p.read_bytes()))
        p = tmp_path / "c.db"
    with Store(p, readonly=True) as s:
        recs, stored = s.device_records(), {(t.device_key, t.family, t.lib_key) for t in s.trials()}
        libsets = {k: s.libset(k) for _, _, k in stored}
    assert stored
    for dev, fam, key in stored:
        deps = registry.get(fam).depends_on
        for live in (False, True):          # a live lookup changes no built-in key: all are recorded
            e = _env_of(recs[dev], live)
            assert e.lib_key(deps) == key, (fam, live)
            assert e.lib_versions(deps) == libsets[key]


def test_built_in_keys_unchanged_for_every_family():
    e = Env("NVIDIA H100 80GB HBM3", "9.0", 132, "cuda", libs=tuple(sorted(LIBS_AT_F4CC350.items())))
    # the layer family (2026-12-07) composes the torch family's calls: torch's dependency, torch's key
    assert {f: e.lib_key(registry.get(f).depends_on) for f in registry.FAMILIES} == \
        {**KEYS_AT_F4CC350, "layer": KEYS_AT_F4CC350["torch"]}


def _live_env(monkeypatch, versions: dict[str, str]) -> Env:
    """This machine's environment with the installed distributions' versions as given."""
    monkeypatch.setattr(envmod, "_version", lambda d: versions.get(d))
    return envmod.cpu()


def _deps() -> list[tuple[str, str]]:
    return sorted((f, d) for f in registry.FAMILIES for d in registry.get(f).depends_on)


@pytest.mark.parametrize("family, dep", _deps())
def test_every_family_dependency_moves_its_key(monkeypatch, family, dep):
    deps = registry.get(family).depends_on
    base = {d: "1.0" for f, d in _deps()} | {"fp4-autotune": "0.1.0"}
    a = _live_env(monkeypatch, base)
    key_a = a.lib_key(deps)
    b = _live_env(monkeypatch, base | {dep: "2.0"})
    if dep == "cublas":       # not a distribution: Env.cublas (torch does not report it; None on a live Env)
        b = dataclasses.replace(a, cublas="2.0")
    assert key_a != b.lib_key(deps)


def test_a_dependency_no_list_names_is_looked_up(monkeypatch, register_family):
    fam = register_family("newdep", "tests.families.newdep:NewDep")
    assert "fp4-test-newdep" not in envmod.KNOWN_LIBS and "fp4-test-newdep" in fam.depends_on
    a = _live_env(monkeypatch, {"torch": "2.13.0", "fp4-test-newdep": "1.0"})
    assert a.lib_versions(fam.depends_on)["fp4-test-newdep"] == "1.0"
    key_a = a.lib_key(fam.depends_on)
    b = _live_env(monkeypatch, {"torch": "2.13.0", "fp4-test-newdep": "1.1"})
    assert key_a != b.lib_key(fam.depends_on)
    # an Env read from a record knows only what it recorded: no lookup on this machine
    rec = dataclasses.replace(a, live=False)
    assert rec.lib_versions(fam.depends_on)["fp4-test-newdep"] is None
    assert "live" not in a.to_dict() and a == rec
