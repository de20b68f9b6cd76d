"""Readers that cannot be made to hang: every SQLite file opened from outside is
first checked for a plain schema (autotune.cache.guard: no view, trigger, virtual table, foreign table or
column, bounded row counts), and JSON readers are bounded in size and depth — each answered with
one line. On f11bb21 a recursive VIEW named `winners` hung `cache import`, `show` and
`Dispatcher()` forever, and deep JSON was a RecursionError traceback.

Subprocess calls carry a timeout as the hang guard; nothing here asserts a duration."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core import jsonread
from autotune.cache import CacheError, Store, guard
from autotune.tactics import registry
from tests.test_cache_bad import ENV, TOR, _w, one_line_error
from tests.helpers import ROOT, run_cli

GUARD_S = 120      # a hang guard for the subprocesses, not a speed assertion


def _cache(path: Path) -> Path:
    s = Store(path)
    s.put_environment(ENV, registry.get("torch").depends_on)
    s.put_winner(_w(TOR, 1))
    s.close()
    return path


def _alter(path: Path, *sql: str) -> Path:
    c = sqlite3.connect(path)
    for q in sql:
        c.execute(q)
    c.commit()
    c.close()
    return path


RECURSIVE_WINNERS = ("DROP TABLE winners",
                     "CREATE VIEW winners AS WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
                     "SELECT 'p' AS problem_key, x AS bucket, 'd' AS device_key, 't' AS tactic_id, 'torch' AS family, "
                     "'l' AS lib_key, 1.0 AS median_us, 't' AS default_tactic_id, NULL AS default_median_us, "
                     "NULL AS speedup, NULL AS updated_at FROM r ORDER BY x DESC")


def _dispatcher_in_a_subprocess(path: Path) -> str:
    code = ("import warnings; warnings.simplefilter('ignore')\n"
            "from autotune.runtime.dispatch import Dispatcher\n"
            f"d = Dispatcher({str(path)!r}, record_misses=False, warn=False)\n"
            "print(d.cache_error)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_recursive_view_named_winners_is_refused_by_every_reader(tmp_path):
    bad = _alter(_cache(tmp_path / "view.db"), *RECURSIVE_WINNERS)
    one_line_error(run_cli("cache", "import", bad, "--cache", tmp_path / "target.db", timeout=GUARD_S),
                   "a view 'winners'")
    assert not (tmp_path / "target.db").exists()          # a refused import creates no target
    one_line_error(run_cli("show", "--cache", bad, timeout=GUARD_S), "a view 'winners'")
    one_line_error(run_cli("cache", "merge", bad, "-o", tmp_path / "m.db", timeout=GUARD_S), "a view 'winners'")
    assert "a view 'winners'" in _dispatcher_in_a_subprocess(bad)


@pytest.mark.parametrize("sql, needle", [
    (("CREATE TRIGGER t AFTER INSERT ON misses BEGIN DELETE FROM winners; END",), "a trigger 't'"),
    (("CREATE TABLE extra (a)",), "a table 'extra' no fp4-autotune schema has"),
    (("ALTER TABLE winners ADD COLUMN payload TEXT",), "column(s) 'payload'"),
    (("CREATE VIEW v AS SELECT 1",), "a view 'v'"),
    (("CREATE INDEX i ON winners (bucket)",), None),                 # an index on our table is fine
])
def test_schema_entries_a_cache_never_has_are_refused(tmp_path, sql, needle):
    path = _alter(_cache(tmp_path / "c.db"), *sql)
    if needle is None:
        with Store(path, readonly=True) as s:
            assert len(s.winners()) == 1
        return
    for readonly in (True, False):
        with pytest.raises(CacheError, match=needle.replace("(", r"\(").replace(")", r"\)")) as e:
            Store(path, readonly=readonly)
        assert "\n" not in str(e.value)


def test_a_virtual_table_is_refused(tmp_path):
    path = _cache(tmp_path / "c.db")
    try:
        _alter(path, "CREATE VIRTUAL TABLE winners_fts USING fts5(problem_key)")
    except sqlite3.OperationalError:
        _alter(path, "CREATE VIRTUAL TABLE winners_rt USING rtree(id, a, b)")
    with pytest.raises(CacheError, match="is a virtual table"):
        Store(path, readonly=True)


def test_a_generated_column_is_refused(tmp_path):
    path = _alter(_cache(tmp_path / "c.db"), "DROP TABLE misses",
                  "CREATE TABLE misses (problem_key TEXT, m INTEGER, device_key TEXT, count INTEGER "
                  "GENERATED ALWAYS AS (m * 2) VIRTUAL)")
    with pytest.raises(CacheError, match="hidden or generated column"):
        Store(path, readonly=True)


def _many_rows(path: Path, n: int = 5000) -> Path:
    return _alter(_cache(path), "INSERT INTO misses SELECT 'p' || x, 1, 'd', 1 FROM (WITH RECURSIVE r(x) AS "
                                f"(SELECT 1 UNION ALL SELECT x + 1 FROM r LIMIT {n}) SELECT x FROM r)")


def test_a_huge_row_count_is_refused_by_a_bounded_count(tmp_path, monkeypatch):
    path = _many_rows(tmp_path / "c.db")
    with Store(path, readonly=True) as s:             # under the default limit: read as usual
        assert len(s.misses()) == 5000
    monkeypatch.setattr(guard, "MAX_ROWS", 1000)
    with pytest.raises(CacheError, match="table 'misses' has more than 1,000 rows"):
        Store(path, readonly=True)


def test_the_step_budget_stops_a_runaway_statement(tmp_path):
    """The progress handler is what bounds the checking connection's work: with a small budget
    the bounded count of a 5000-row table is interrupted, in one line."""
    path = _many_rows(tmp_path / "c.db")
    guard.check_plain(path)
    with pytest.raises(CacheError, match="took more than 1,000 SQLite steps"):
        guard.check_plain(path, max_steps=1000)


# ----------------------------------------------------------------------------------- JSON

def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def test_deep_json_is_one_line_for_import_merge_and_search(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text(_deep())
    one_line_error(run_cli("cache", "import", deep, "--cache", tmp_path / "t.db", timeout=GUARD_S), "nested deeper")
    assert not (tmp_path / "t.db").exists()
    one_line_error(run_cli("cache", "merge", deep, "-o", tmp_path / "m.db", timeout=GUARD_S), "nested deeper")
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "llama", "x": ' + _deep() + "}")
    one_line_error(run_cli("search", "--model", cfg, "--cache", tmp_path / "s.db", "--dry-run", timeout=GUARD_S),
                   "nested deeper")


def test_jsonread_bounds_depth_size_and_huge_integers():
    assert jsonread.loads("[[1]]", "x", max_bytes=100) == [[1]]
    with pytest.raises(jsonread.JSONLimitError, match="x: JSON nested deeper than 64 levels"):
        jsonread.loads("[" * 65 + "]" * 65, "x", max_bytes=1000)       # parses, then too deep
    with pytest.raises(jsonread.JSONLimitError, match="x: larger than 10 bytes"):
        jsonread.loads("[" + "1," * 10 + "1]", "x", max_bytes=10)
    v = jsonread.loads('{"a": ' + "9" * 5000 + "}", "x", max_bytes=10_000)["a"]
    assert isinstance(v, jsonread.HugeInt) and not isinstance(v, int) and repr(v) == "a 5000-digit integer"


def test_a_deep_rank_model_file_is_unusable_not_a_crash(tmp_path):
    from autotune.core.arch import ARCHS
    from autotune.engine.strategies.ranked import plans as strategy
    path = tmp_path / "m.json"
    path.write_text(_deep())
    m, note = strategy.load_model(path, None, ARCHS["sm90"])
    assert m is None and "nested deeper" in note


def test_deep_json_in_a_cache_row_is_skipped(tmp_path):
    path = _alter(_cache(tmp_path / "c.db"), f"UPDATE devices SET record_json = '{_deep(5000)}'")
    with Store(path, readonly=True) as s:
        assert s.device_records() == {}             # the damaged record is left out, as a bad one is
        with pytest.raises(ValueError, match="nested deeper"):
            s.devices()


def test_deep_tactic_parameters_in_a_row_are_a_counted_skip_not_a_traceback(tmp_path):
    from autotune import api
    from autotune.cache import check_winner
    path = _alter(_cache(tmp_path / "c.db"), f"UPDATE tactics SET params_json = '{_deep(5000)}'")
    with Store(path, readonly=True) as s:
        assert [check_winner(w) for w in s.winners()] == ["malformed tactic"]
    shown = api.show(str(path))
    assert shown.winners == [] and any("malformed tactic 1" in n for n in shown.notes)
