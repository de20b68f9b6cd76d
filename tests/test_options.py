"""Search options declared once: the fields of `SearchInput` (autotune/request.py) and
`SearchOptions` (autotune/engine/options.py) make the CLI's `search` options, `api.run`'s keywords,
their one-line refusals and the options table of docs/search.md."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import api, request
from autotune.engine import options
from autotune.engine.options import Halving, OptionError, Runner, SearchOptions, TimerConfig

ROOT = Path(__file__).resolve().parents[1]


def test_the_committed_options_table_is_the_generated_one():
    doc = (ROOT / "docs" / "search.md").read_text()
    assert request.with_table(doc) == doc, "run python3 -m autotune.request to regenerate docs/search.md's table"
    for fl in request.search_flags():
        assert f"| `{fl.opt.flag}` |" in doc
    r = subprocess.run([sys.executable, "-m", "autotune.request", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_stale_table_is_noticed():
    doc = (ROOT / "docs" / "search.md").read_text()
    stale = doc.replace("| `--margin` | `0.03` |", "| `--margin` | `0.05` |")
    assert stale != doc and request.with_table(stale) == doc


def test_the_cli_options_are_the_declared_flags():
    from autotune.cli import search
    params = {p.name: p for p in search.params}
    flags = request.search_flags()
    assert [p.name for p in search.params] == [fl.key for fl in flags] + ["as_json"]
    for fl in flags:
        p = params[fl.key]
        assert p.help == fl.opt.text() and p.default == fl.default, fl.key
        assert fl.opt.flag.split("/")[0] in p.opts
        if fl.opt.options():
            assert list(p.type.choices) == list(fl.opt.options())
    assert list(params["strategy"].type.choices) == list(options.strategies.names())


def test_every_cli_flag_is_a_keyword_of_api_run():
    inp, top, nested = request.split({fl.key: fl.default for fl in request.search_flags()})
    assert set(nested) | set(top) | {f.name for f in dataclasses.fields(inp)} >= {fl.key for fl in request.search_flags()}
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_flag'"):
        request.split({"no_such_flag": 1})


@pytest.mark.parametrize("build, field, flag", [
    (lambda: Runner(workers=0), "workers must be a whole number >= 1, got 0", "--workers must"),
    (lambda: Runner(compile_workers=2.5), "compile_workers must be a whole number", "--compile-workers must"),
    (lambda: Runner(timeout_s=float("inf")), "timeout_s must be a positive number of seconds", "--timeout-s must"),
    (lambda: Runner(gpus=(0, 0)), "gpus must list distinct device indices, got [0, 0]", "--gpus must"),
    (lambda: Halving(budget_s=0), "budget_s must be a positive number of seconds", "--budget-s must"),
    (lambda: SearchOptions(margin=1.5), "margin must be in [0, 1), got 1.5", "--margin must"),
    (lambda: SearchOptions(max_tactics=0), "max_tactics must be >= 1, got 0", "--max-tactics must"),
    (lambda: SearchOptions(strategy="nope"), "strategy must be one of ranked, halving, exhaustive, predict, got 'nope'",
     "--strategy must"),
])
def test_a_refusal_names_the_field_for_the_library_and_the_flag_for_the_cli(build, field, flag):
    with pytest.raises(OptionError) as e:
        build()
    assert str(e.value).startswith(field) and e.value.flag_message.startswith(flag)


def test_build_applies_the_flags_over_the_groups_in_their_units():
    o = options.build({"margin": 0.05, "strategy": None, "runner": Runner(timeout_s=60)},
                      {"budget_ms": 100, "budget_s": None, "workers": 2, "gpus": "0,1", "isolate": False})
    assert o.margin == 0.05 and o.strategy == "ranked"        # a flag left unset: the field's default
    assert o.timer == dataclasses.replace(TimerConfig(), budget_s=0.1) and o.halving == Halving()
    assert o.runner == Runner(gpus=(0, 1), workers=2, timeout_s=60, isolate=False)   # over the caller's Runner
    with pytest.raises(OptionError, match="gpus takes device indices like 0,1,2, got ','") as e:
        options.build({}, {"gpus": ","})
    assert e.value.flag_message == "--gpus takes device indices like 0,1,2, got ','"


def test_api_run_refuses_in_the_flags_words_before_anything_is_opened(tmp_path):
    with pytest.raises(api.BadInput, match=r"^--timeout-s must be a positive number of seconds, got 0"):
        api.run("glm5", tp=8, only="mlp.down_proj", families="torch", max_tokens=1, timeout_s=0,
                cache=str(tmp_path / "c.db"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'budget'"):
        api.run("glm5", budget=1)
    assert not (tmp_path / "c.db").exists()
