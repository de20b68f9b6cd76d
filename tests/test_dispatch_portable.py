"""Moving caches between machines: export by GPU/model/format, prune, and what dispatch makes of
an imported cache recorded elsewhere."""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

from helpers import run_cli, keyed
from autotune.runtime.dispatch import Dispatcher
from autotune.core.env import Env, cpu, current
from autotune.core.problem import Problem
from autotune.core.records import Miss, Trial, Winner
from autotune.integrations.portable import export_cache, import_cache
from autotune.cache import Store
from autotune.integrations.prune import prune
from autotune.tactics import registry
from autotune.core.tactic import Tactic

ROOT = Path(__file__).resolve().parents[1]
CPU = cpu()
GPU = Env("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0", 188, "cuda", "575", "12.9", None, "0.1.0",
          (("torch", "2.13.0"), ("triton", "3.9.0")))
P = Problem.dense(256, 512)
T = Tactic("torch", dequant_dtype="bf16", chunk_n=0)


def fill(s: Store, env: Env, lib: str | None = None) -> None:
    lib = lib or env.lib_key(("torch",))
    s.put_environment(env, ("torch",))
    for b in (1, 4):
        s.put_trial(keyed(Trial(P.key, b, T.id, "torch", T.to_json(), env.device_key, lib, "ok", median_us=2.0)))
        s.put_winner(keyed(Winner(P.key, b, env.device_key, T.id, "torch", T.to_json(), lib, 2.0, T.id, 2.0, 1.0)))
    s.record_misses([Miss(P.key, 9, env.device_key, 2)])


def test_prune_keep_drop_stale_and_dry_run(tmp_path):
    s = Store(tmp_path / "c.db")
    fill(s, CPU)
    fill(s, GPU)
    old = dataclasses.replace(CPU, libs=tuple((k, "0.0" if k == "torch" else v) for k, v in CPU.libs))
    s.put_winner(Winner(P.key, 16, CPU.device_key, T.id, "torch", T.to_json(), old.lib_key(("torch",)),
                        2.0, T.id, 2.0, 1.0))
    rep = prune(s, keep_devices={CPU.device_key}, dry_run=True)
    assert (rep.trials, rep.winners, rep.misses, rep.devices) == (2, 2, 1, 1)
    assert len(s.winners()) == 5                                          # dry run: nothing gone
    rep = prune(s, stale_libs=CPU)
    assert (rep.trials, rep.winners, rep.misses) == (0, 1, 0)            # the winner from old torch
    rep = prune(s, drop_devices={GPU.device_key})
    assert (rep.winners, rep.devices) == (2, 1)
    assert {w.device_key for w in s.winners()} == {CPU.device_key} and s.device(GPU.device_key) is None
    rep = prune(s, drop_misses=True)
    assert rep.misses == 1 and s.misses() == []
    s.close()


def test_cli_export_by_gpu_and_format_then_prune(tmp_path):
    path = tmp_path / "c.db"
    with Store(path) as s:
        fill(s, current())
        fill(s, GPU)
    r = run_cli("cache", "export", "--gpu", GPU.gpu_name, "-o", tmp_path / "sm120.db", cache=path)
    assert r.returncode == 0 and "exported 2 winners" in r.stdout, r.stderr
    r = run_cli("cache", "export", "--gpu", GPU.gpu_name, "--format", "json", "-o", tmp_path / "sm120.json", cache=path)
    doc = json.loads((tmp_path / "sm120.json").read_text())
    assert r.returncode == 0 and len(doc["winners"]) == 2 and doc["checksum"] and doc["devices"][0]["gpu_name"] == GPU.gpu_name
    assert {x["lib_key"] for x in doc["libsets"]} == {w["lib_key"] for w in doc["winners"]}   # env keys travel
    r = run_cli("cache", "export", "--gpu", "B200", "-o", tmp_path / "none.db", cache=path)
    assert r.returncode == 2 and "no device in the cache matches GPU 'B200'" in r.stderr
    r = run_cli("cache", "prune", cache=path)
    assert r.returncode == 2 and "nothing to prune" in r.stderr
    r = run_cli("cache", "prune", "--drop-gpu", "RTX PRO 6000", "--dry-run", cache=path)
    assert r.returncode == 0 and "would drop 2 trials, 2 winners, 1 misses, 1 devices" in r.stdout
    r = run_cli("cache", "prune", "--keep-gpu", current().gpu_name, cache=path)
    assert r.returncode == 0 and "dropped 2 trials, 2 winners" in r.stdout, r.stderr
    with Store(path, readonly=True) as s:
        assert {w.device_key for w in s.winners()} == {current().device_key}


def test_imported_cache_from_another_gpu_is_all_misses_here(tmp_path):
    """An export made on another GPU imports fine (entries are valid) but dispatch here never
    uses them: another device key, so every call takes the default rung."""
    with Store(tmp_path / "gpu.db") as s:
        fill(s, GPU)
        export_cache(s, tmp_path / "x.json", fmt="json")
    with Store(tmp_path / "here.db") as s:
        rep = import_cache(s, tmp_path / "x.json", validate=registry.validate)
        assert rep.imported == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = Dispatcher(tmp_path / "here.db", env=CPU, record_misses=False, warn=False)
    d((4, 256, 512))
    assert d.stats["default"] == 1 and d.stats["hit"] == 0
