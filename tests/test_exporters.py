"""Export formats as plug-ins (autotune.integrations.exporters): `cache export --format` lists the
registry's formats and options, an option of another format is refused, and a new format is one
module plus one registry line."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.cache import Store
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic
from autotune.integrations import exporters
from tests.helpers import ROOT, keyed, run_cli

ENV = Env("NVIDIA H200", "9.0", 132, "cuda", libs=(("torch", "2.13.0"),))
T = Tactic("torch", dequant_dtype="bf16", chunk_n=0)


def _cache(path) -> None:
    lib = ENV.lib_key(("torch",))
    with Store(path) as s:
        s.put_environment(ENV, ("torch",))
        for p, b in ((Problem.dense(256, 512), 16), (Problem.dense(512, 512), 4)):
            s.put_winner(keyed(Winner(p.key, b, ENV.device_key, T.id, "torch", T.to_json(), lib, 8.0, T.id, 8.0, 1.0)))


def test_every_registered_exporter_loads_under_its_name_with_distinct_flags():
    assert exporters.names()[0] == "sqlite"                 # the default
    flags = [o.flag for _, o in exporters.all_options()]
    assert len(flags) == len(set(flags))
    for n in exporters.names():
        ex = exporters.get(n)
        assert ex.name == n and ex.help and callable(ex.export)


def test_the_cli_reads_formats_and_options_from_the_registry():
    r = run_cli("cache", "export", "--help")
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert "[" + "|".join(exporters.names()) + "]" in text
    for n, o in exporters.all_options():
        assert o.flag in text


def test_an_option_of_another_format_is_refused():
    with pytest.raises(exporters.ExportRefused, match="--flashinfer-version, --metadata-from-env, --meta and --blocklist need --format flashinfer"):
        exporters.check_options("json", {"blocklist": "x"})
    exporters.check_options("flashinfer", {"blocklist": "x"})
    exporters.check_options("json", {"blocklist": None, "meta": (), "metadata_from_env": False})


def test_a_new_exporter_is_one_module_and_one_registry_line(tmp_path):
    db, out = tmp_path / "c.db", tmp_path / "w.txt"
    _cache(db)
    code = ("import sys\n"
            "from autotune.integrations import exporters\n"
            "exporters.REGISTRY['probe'] = 'tests.exporter_probe:PROBE'\n"      # the one line
            "from autotune import cli\n"
            "sys.argv = ['autotune', *sys.argv[1:]]\n"
            "cli.main()\n")
    run = lambda *a: subprocess.run([sys.executable, "-c", code, "cache", "export", *map(str, a)], cwd=ROOT,  # noqa: E731
                                    capture_output=True, text=True, timeout=300)
    r = run("--help")
    assert r.returncode == 0 and "probe" in r.stdout and "--probe-prefix" in r.stdout, r.stderr
    r = run("--format", "probe", "--probe-prefix", "W", "-o", out, "--cache", db)
    assert r.returncode == 0 and "probe: 2 winners" in r.stdout, r.stderr
    assert sorted(line.split()[0] for line in out.read_text().splitlines()) == ["W", "W"]
    r = run("--format", "probe", "-o", out, "--cache", db)                 # its own refusal, one line
    assert r.returncode == 2 and "needs --probe-prefix" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("--format", "json", "--probe-prefix", "W", "-o", tmp_path / "x.json", "--cache", db)
    assert r.returncode == 2 and "--probe-prefix needs --format probe" in r.stderr
    r = run("--format", "json", "-o", tmp_path / "x.json", "--cache", db)  # the built-in formats unchanged
    assert r.returncode == 0 and "exported 2 winners" in r.stdout, r.stderr
