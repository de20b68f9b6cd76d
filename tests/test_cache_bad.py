"""Bad cache files: truncated, tampered, not SQLite, newer schema, JSON with wrong types.

Each gives a clear one-line error (CLI: exit 2, no traceback) or skipped entries with counts and
reasons; the serving side (test_dispatch.py) falls back to defaults and never uses a wrong kernel.
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

from helpers import run_cli
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.integrations.portable import export_cache, import_cache, merge_exports
from autotune.cache import CacheError, Store
from autotune.tactics import registry
from autotune.core.arch import ARCHS
from autotune.core.tactic import Tactic, canonical_json

ROOT = Path(__file__).resolve().parents[1]
ENV = Env("NVIDIA H200", "9.0", 132, "cuda", "570.1", "12.8", None, "0.1.0", (("triton", "3.9.0"), ("torch", "2.13.0")))
P = Problem.dense(3072, 6144)
TRI = registry.get("triton").default(P, ARCHS["sm90"])      # whatever the family's schema is today
TOR = Tactic("torch", dequant_dtype="bf16", chunk_n=0)


def _w(t: Tactic, bucket: int) -> Winner:
    fam = registry.get(t.family)
    return Winner(P.key, bucket, ENV.device_key, t.id, t.family, t.to_json(), ENV.lib_key(fam.depends_on), 5.0,
                  TRI.id, 6.0, 1.2)


def winners_store(path: Path) -> Store:
    """A real store at `path` with four winners (buckets 1, 2, 4, 8; triton and torch, median 5 µs)."""
    s = Store(path)
    for fam in ("triton", "torch"):
        s.put_environment(ENV, registry.get(fam).depends_on)
    for i, b in enumerate((1, 2, 4, 8)):
        s.put_winner(_w(TRI if i % 2 else TOR, b))
    return s


@pytest.fixture
def src(tmp_path):
    s = winners_store(tmp_path / "src.db")
    yield s
    s.close()


def resign(doc: dict) -> dict:
    payload = {k: v for k, v in doc.items() if k != "checksum"}
    return {**payload, "checksum": hashlib.sha256(canonical_json(payload).encode()).hexdigest()}


def cli(*args, cache=None):
    return run_cli(*args, cache=cache, timeout=300)


def one_line_error(r, needle: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr


# ------------------------------------------------------------------------------- whole-file

def _sqlite_export(src, tmp_path) -> Path:
    out = tmp_path / "x.db"
    export_cache(src, out)
    return out


@pytest.mark.parametrize("case, needle", [
    ("truncated", "truncated"),
    ("tampered", "checksum mismatch"),
    ("not sqlite", "not an fp4-autotune export"),
    ("newer schema", "newer fp4-autotune"),
    ("half a header", "not an fp4-autotune"),
])
def test_bad_sqlite_exports_refused_with_one_line(src, tmp_path, case, needle):
    out = _sqlite_export(src, tmp_path)
    if case == "truncated":
        out.write_bytes(out.read_bytes()[:3 * 4096 // 2])
    elif case == "tampered":
        con = sqlite3.connect(out)
        con.execute("UPDATE winners SET median_us = 0.001 WHERE bucket = 2")   # "make it win"
        con.commit()
        con.close()
    elif case == "not sqlite":
        out.write_bytes(b"\x80\x04\x95\x10\x00cos\nsystem\n" * 40)           # a pickle is never loaded
    elif case == "newer schema":
        con = sqlite3.connect(out)
        con.execute("UPDATE schema_version SET version = 7")
        con.commit()
        con.close()
    else:
        out.write_bytes(out.read_bytes()[:50])
    with Store(tmp_path / "dst.db") as dst:
        with pytest.raises(CacheError, match=needle):
            import_cache(dst, out, validate=registry.validate)
        assert dst.winners() == []
    one_line_error(cli("cache", "import", out, cache=tmp_path / "dst.db"), needle)
    one_line_error(cli("cache", "merge", out, "-o", tmp_path / "m.db"), needle)
    assert not (tmp_path / "m.db").exists()


@pytest.mark.parametrize("text, needle", [
    ("{", "not an fp4-autotune export"),
    ('["fp4-autotune-cache"]', "no format"),
    ('{"format": "fp4-autotune-cache", "schema": "1"}', "newer fp4-autotune"),
    ('{"format": "fp4-autotune-cache", "schema": 1, "winners": []}', "checksum mismatch"),
    ('{"format": "fp4-autotune-cache", "schema": 1, "winners": [], "checksum": NaN}', "checksum mismatch"),
])
def test_bad_json_documents(tmp_path, text, needle):
    (tmp_path / "x.json").write_text(text)
    with Store(tmp_path / "dst.db") as dst, pytest.raises(CacheError, match=needle):
        import_cache(dst, tmp_path / "x.json")
    one_line_error(cli("cache", "import", tmp_path / "x.json", cache=tmp_path / "dst.db"), needle)


def test_json_wrong_container_types(src, tmp_path):
    out = tmp_path / "x.json"
    export_cache(src, out, fmt="json")
    doc = json.loads(out.read_text())
    for key, bad in (("tactics", {"a": 1}), ("winners", "all of them"), ("devices", 3)):
        (tmp_path / "y.json").write_text(json.dumps(resign({**doc, key: bad})))
        with Store(tmp_path / "dst.db") as dst, pytest.raises(CacheError, match=f"'{key}' is not a list"):
            import_cache(dst, tmp_path / "y.json")
    (tmp_path / "z.json").write_text(json.dumps({**doc, "winners": doc["winners"] + [{"median_us": float("nan")}]},
                                                allow_nan=True))
    with Store(tmp_path / "dst.db") as dst, pytest.raises(CacheError, match="not canonical JSON|checksum"):
        import_cache(dst, tmp_path / "z.json")


# ---------------------------------------------------------------------------------- per entry

def test_json_entries_with_wrong_types_are_skipped_with_reasons(src, tmp_path):
    out = tmp_path / "x.json"
    export_cache(src, out, fmt="json")
    doc = json.loads(out.read_text())
    base = next(w for w in doc["winners"] if w["family"] == "triton")
    dev = doc["devices"][0]
    lib = next(x for x in doc["libsets"] if x["lib_key"] == base["lib_key"])
    odd_tac = {"id": "a" * 16, "family": "triton", "params": "block_m=64"}             # params not a dict
    list_tac = {"id": "b" * 16, "family": "triton", "params": [["block_m", 64]]}       # params as pairs
    bad_params = Tactic("triton", {**TRI.params, "block_m": 48})                        # not in the schema
    doc["tactics"] += [odd_tac, list_tac, {"id": bad_params.id, "family": "triton", "params": bad_params.params}]
    doc["devices"].append({**dev, "device_key": "c" * 16, "sm_count": "132"})           # sm_count a string
    doc["libsets"].append({"lib_key": "d" * 16, "versions": {"triton": 3.9}})           # version a number
    doc["winners"] += [
        "a winner",                                                      # not an object
        {**base, "bucket": "16"},                                        # bucket a string
        {**base, "bucket": True},                                        # bool is not an int here
        {**base, "bucket": -16},
        {**base, "bucket": 32, "median_us": "fast"},
        {**base, "bucket": 64, "family": 7},
        {**base, "bucket": 128, "tactic_id": odd_tac["id"]},
        {**base, "bucket": 256, "tactic_id": list_tac["id"]},
        {**base, "bucket": 512, "tactic_id": bad_params.id},
        {**base, "bucket": 1024, "device_key": "c" * 16},
        {**base, "bucket": 2048, "lib_key": "d" * 16},
        {**base, "bucket": 4096, "problem_key": "dense:fp4:n0"},
        {**base, "bucket": 8192, "family": "torch"},                     # family column disagrees with the tactic
    ]
    assert lib
    (tmp_path / "y.json").write_text(json.dumps(resign(doc)))
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, tmp_path / "y.json", validate=registry.validate)
        assert rep.imported == 4
        assert rep.skipped == {                 # the reasons of autotune.cache.rows.check_winner, as dispatch counts them
            "malformed winner": 2, "bad bucket": 3, "bad median_us": 1, "malformed tactic": 1,
            "tactic does not match its id": 2, registry.validate("triton", bad_params.params): 1,
            "device record does not match its key": 1, "malformed libset": 1, "bad problem key": 1}
        assert sorted(w.bucket for w in dst.winners()) == [1, 2, 4, 8]
    r = cli("cache", "import", tmp_path / "y.json", cache=tmp_path / "dst2.db")
    assert r.returncode == 0 and "imported 4 winners" in r.stdout and "skipped 3: bad bucket" in r.stdout


def test_damaged_rows_of_a_whole_cache_file_are_skipped(src, tmp_path):
    """Importing a raw cache file (no checksum): damaged rows are skipped, never a crash."""
    src.close()
    con = sqlite3.connect(src.path)
    con.execute("UPDATE winners SET bucket = 'x' WHERE bucket = 1")
    con.execute("UPDATE tactics SET params_json = '{not json' WHERE id = ?", (TRI.id,))
    con.execute("UPDATE devices SET record_json = '[1, 2' ")
    con.commit()
    con.close()
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, src.path, validate=registry.validate)
    assert rep.imported == 0
    assert rep.skipped == {"bad bucket": 1, "malformed tactic": 2, "unknown device": 1}


def test_merge_validates_each_file_and_later_wins(src, tmp_path):
    a = tmp_path / "a.json"
    export_cache(src, a, fmt="json")
    doc = json.loads(a.read_text())
    for w in doc["winners"]:
        w["median_us"], w["speedup"] = 1.0, w["default_median_us"] / 1.0  # a newer measurement
    doc["winners"].append({**doc["winners"][0], "bucket": 16, "tactic_id": "f" * 16})
    b = tmp_path / "b.json"
    b.write_text(json.dumps(resign(doc)))
    rep = merge_exports([a, b], tmp_path / "m.db", validate=registry.validate)
    assert rep.written == 4 and rep.replaced == 4
    assert rep.per_file[str(b)].skipped == {"unknown tactic": 1}
    with Store(tmp_path / "m.db", readonly=True) as m:
        assert {w.median_us for w in m.winners()} == {1.0}
    r = cli("cache", "merge", a, b, "-o", tmp_path / "m2.json", "--format", "json")
    assert r.returncode == 0 and "wrote 4 winners" in r.stdout and "4 replaced" in r.stdout, r.stderr
    assert json.loads((tmp_path / "m2.json").read_text())["format"] == "fp4-autotune-cache"
