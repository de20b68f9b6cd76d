"""Damaged or hostile cache rows and the torch-free cache layer.

Readers (`autotune show`, `show --json`, `autotune report`) skip and count rows that fail
autotune.cache.rows' checks instead of crashing; an import never replaces a real row with an invalid one
and names every row it skips (also a winner whose tactic row is gone); signed exports are
refused on import and at serve time when the signature is not the configured key's.
"""
from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.core.records import Trial, Winner
from autotune.integrations.portable import export_cache, import_cache
from autotune.cache import CacheError, Store, check_trial, check_winner, verify_for_serving
from autotune.cache.rows import MAX_US
from autotune.cache.signing import KEY_ENV, KEY_FILE_ENV, load_key
from autotune.tactics import registry
from tests.test_cache_bad import ENV, P, TOR, TRI, _w, cli, one_line_error, resign, winners_store

ROOT = Path(__file__).resolve().parents[1]
SECRET = "0123456789abcdef-a-shared-secret"


@pytest.fixture(autouse=True)
def no_configured_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)


@pytest.fixture
def src(tmp_path):
    """Four real winners (buckets 1, 2, 4, 8, median 5 µs) and one ok trial."""
    s = winners_store(tmp_path / "src.db")
    w = _w(TOR, 1)
    s.put_trial(Trial(P.key, 1, TOR.id, "torch", TOR.to_json(), ENV.device_key, w.lib_key, "ok", median_us=5.0))
    yield s
    s.close()


# ------------------------------------------------------------------------------- the validator

def test_check_winner_numeric_fields():
    good = _w(TOR, 4)
    assert check_winner(good) is None
    cases = {"bad bucket": [{"bucket": 0}, {"bucket": -4}, {"bucket": "4"}, {"bucket": True}, {"bucket": 2**31}],
             "bad median_us": [{"median_us": v} for v in (0.0, -5.0, math.nan, math.inf, MAX_US * 2, "5", None)],
             "bad default_median_us": [{"default_median_us": -6.0, "speedup": None}],
             "bad speedup": [{"speedup": 12.0}, {"speedup": math.nan}, {"default_median_us": None}],
             "bad device key": [{"device_key": "H200"}], "bad lib key": [{"lib_key": "lib"}],
             "bad problem key": [{"problem_key": "dense:n0"}], "unknown tactic": [{"params_json": ""}],
             "malformed tactic": [{"params_json": "[1, 2]"}], "malformed winner": [{"family": 7}],
             "tactic does not match its id": [{"tactic_id": "f" * 16}, {"family": "triton"}]}
    for reason, edits in cases.items():
        for e in edits:
            assert check_winner(Winner(**{**good.__dict__, **e})) == reason, e
    t = Trial(P.key, 4, TOR.id, "torch", TOR.to_json(), ENV.device_key, good.lib_key, "ok", median_us=5.0, reps=3)
    assert check_trial(t) is None
    assert check_trial(Trial(**{**t.__dict__, "status": "rejected", "bucket": 0, "median_us": None})) is None
    for e, reason in (({"bucket": 0}, "bad bucket"), ({"median_us": None}, "bad median_us"),
                      ({"median_us": "x"}, "bad median_us"), ({"status": "great"}, "bad status"),
                      ({"iqr_us": -1.0}, "bad iqr_us"), ({"smem_model": -1}, "bad smem_model")):
        assert check_trial(Trial(**{**t.__dict__, **e})) == reason, e


# ------------------------------------------------------------------------ readers never crash

def _damage(path: Path) -> None:
    """Rows a hand edit or another tool could leave: bucket 0 / negative, medians not numbers."""
    con = sqlite3.connect(path)
    row = con.execute("SELECT * FROM winners WHERE bucket = 1").fetchone()
    cols = [d[0] for d in con.execute("SELECT * FROM winners").description]
    ins = f"INSERT INTO winners ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    base = dict(zip(cols, row))
    for edit in ({"bucket": 0}, {"bucket": -16}, {"bucket": 32, "median_us": "fast"},
                 {"bucket": 64, "median_us": math.inf}, {"bucket": 128, "median_us": -3.0}):
        r = {**base, **edit}
        con.execute(ins, [r[c] for c in cols])
    con.execute("UPDATE trials SET median_us = 'slow'")
    con.execute("INSERT INTO misses VALUES (?, 7, ?, 'many')", (P.key, ENV.device_key))
    con.execute("INSERT INTO misses VALUES (?, 9, ?, 3)", (P.key, ENV.device_key))
    con.commit()
    con.close()


def test_show_and_report_skip_and_count_damaged_rows(src, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")        # rich wraps notes at the terminal width
    src.close()
    _damage(src.path)
    r = cli("show", "--cache", src.path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "skipped 5 winners that fail the row checks: bad bucket 2, bad median_us 3" in r.stdout
    assert "skipped 1 trials that fail the row checks: bad median_us 1" in r.stdout
    r = cli("show", "--json", "--cache", src.path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert sorted(w["bucket"] for w in json.loads(r.stdout)) == [1, 2, 4, 8]
    assert "skipped 5 winners that fail the row checks" in r.stderr
    r = cli("show", "--misses", "--cache", src.path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "m=9  3×" in r.stdout and "skipped 1 misses that fail the row checks: bad count 1" in r.stdout
    r = cli("report", "-o", tmp_path / "rep", "--cache", src.path)
    assert r.returncode == 0 and "report of 4 winners" in r.stdout, r.stderr
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert summary["skipped"] == {"winners": {"bad bucket": 2, "bad median_us": 3}, "trials": {"bad median_us": 1},
                                  "misses": {"bad count": 1}}
    assert "skipped 5 winners" in (tmp_path / "rep" / "index.html").read_text()


# ------------------------------------------------------------------------------------ import

def test_import_never_replaces_a_real_row_with_an_invalid_one(src, tmp_path):
    out = tmp_path / "x.json"
    export_cache(src, out, fmt="json")
    doc = json.loads(out.read_text())
    for w, med in zip(doc["winners"], (-5.0, 0.0, 1e300, 5.0)):
        w["median_us"] = med                               # three hostile timings, one real row
    doc["winners"][3]["default_median_us"] = -6.0
    (tmp_path / "y.json").write_text(json.dumps(resign(doc)))
    with Store(tmp_path / "dst.db") as dst:
        assert import_cache(dst, out).imported == 4        # the target's real rows
        rep = import_cache(dst, tmp_path / "y.json", validate=registry.validate)
        assert rep.imported == 0 and rep.skipped == {"bad median_us": 3, "bad default_median_us": 1}
        assert {w.bucket: w.median_us for w in dst.winners()} == {1: 5.0, 2: 5.0, 4: 5.0, 8: 5.0}
        assert rep.skips.rows["bad default_median_us"] == [f"{P.key} bucket 8 on {ENV.device_key}"]
    r = cli("cache", "import", tmp_path / "y.json", cache=tmp_path / "dst.db")
    assert r.returncode == 0 and "imported 0 winners; skipped 3: bad median_us" in r.stdout, r.stderr
    assert f"{P.key} bucket 1 on {ENV.device_key}" in r.stdout


def test_a_winner_without_its_tactic_row_is_counted_and_named(src, tmp_path):
    src.close()
    con = sqlite3.connect(src.path)                       # foreign keys are off in a plain connection
    con.execute("DELETE FROM tactics WHERE id = ?", (TRI.id,))
    con.commit()
    con.close()
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, src.path, validate=registry.validate)
        assert rep.imported == 2 and rep.skipped == {"unknown tactic": 2}
        assert rep.skips.rows["unknown tactic"] == [f"{P.key} bucket {b} on {ENV.device_key}" for b in (2, 8)]
    r = cli("cache", "import", src.path, cache=tmp_path / "dst2.db")
    assert "imported 2 winners; skipped 2: unknown tactic" in r.stdout, r.stderr
    with Store(src.path, readonly=True) as s:
        assert [check_winner(w) for w in s.winners()] == [None, "unknown tactic", None, "unknown tactic"]


def test_export_leaves_invalid_rows_out_and_counts_them(src, tmp_path):
    src.close()
    _damage(src.path)
    with Store(src.path, readonly=True) as s:
        rep = export_cache(s, tmp_path / "x.db")
    assert rep.written == 4 and rep.skipped == {"bad bucket": 2, "bad median_us": 3}
    with Store(tmp_path / "dst.db") as dst:
        assert import_cache(dst, tmp_path / "x.db").skipped == {}


# ----------------------------------------------------------------------------------- signing

def _ed25519(tmp_path: Path, name: str) -> tuple[Path, Path]:
    ser = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    k = Ed25519PrivateKey.generate()
    priv, pub = tmp_path / f"{name}.pem", tmp_path / f"{name}.pub.pem"
    priv.write_bytes(k.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    pub.write_bytes(k.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub


@pytest.mark.parametrize("fmt", ["sqlite", "json"])
def test_hmac_signed_export_round_trip_and_tampering(src, tmp_path, fmt):
    key = load_key(environ={KEY_ENV: SECRET})
    out = tmp_path / f"x.{fmt}"
    assert export_cache(src, out, fmt=fmt, key=key).signature == f"signed (hmac-sha256, key {key.key_id})"
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, out, key=key)
        assert rep.imported == 4 and rep.signature == f"verified (hmac-sha256, key {key.key_id})"
        assert import_cache(dst, out).signature.endswith("not verified: no key configured")
        other = load_key(environ={KEY_ENV: SECRET + "!"})
        with pytest.raises(CacheError, match="bad signature: signed by key"):
            import_cache(dst, out, key=other)
    assert verify_for_serving(out, key) == (True, f"verified (hmac-sha256, key {key.key_id})")
    assert verify_for_serving(out, environ={}) == (True, "unsigned: no signing key configured")
    if fmt == "sqlite":                                    # the dispatcher may pass the Store it opened
        with Store(out, readonly=True) as s:
            assert verify_for_serving(s, key)[0] is True
    # an edit with the checksum recomputed (integrity is not origin): refused on import and at serve time
    if fmt == "json":
        doc = json.loads(out.read_text())
        doc["winners"][0]["median_us"], doc["winners"][0]["speedup"] = 0.5, 12.0
        sig = doc.pop("signature")
        out.write_text(json.dumps({**resign(doc), "signature": sig}))
    else:
        from autotune.cache import exportfile
        con = sqlite3.connect(out)
        con.execute("UPDATE winners SET median_us = 0.5, speedup = 12.0 WHERE bucket = 1")
        con.commit()
        con.close()
        with Store(out, readonly=True) as s:
            digest = exportfile.checksum(exportfile.collect(s))
        con = sqlite3.connect(out)
        con.execute("UPDATE meta SET value = ? WHERE key = 'checksum'", (digest,))
        con.commit()
        con.close()
    with Store(tmp_path / "dst2.db") as dst, pytest.raises(CacheError, match="signature does not match"):
        import_cache(dst, out, key=key)
    ok, why = verify_for_serving(out, key)
    assert not ok and "signature does not match the contents" in why
    if fmt == "sqlite":
        with Store(out, readonly=True) as s:
            assert verify_for_serving(s, key)[0] is False


def test_ed25519_signed_export_via_cli(src, tmp_path, monkeypatch):
    priv, pub = _ed25519(tmp_path, "deploy")
    _, stranger = _ed25519(tmp_path, "stranger")
    src.close()
    r = cli("cache", "export", "-o", tmp_path / "img.db", "--cache", src.path, "--sign-key", priv)
    assert r.returncode == 0 and "exported 4 winners" in r.stdout and "signed (ed25519, key" in r.stdout, r.stderr
    r = cli("cache", "import", tmp_path / "img.db", "--verify-key", pub, cache=tmp_path / "a.db")
    assert r.returncode == 0 and "imported 4 winners" in r.stdout and "verified (ed25519" in r.stdout, r.stderr
    one_line_error(cli("cache", "import", tmp_path / "img.db", "--verify-key", stranger, cache=tmp_path / "b.db"),
                   "bad signature: signed by key")
    with pytest.raises(CacheError, match="needs the private key"):
        load_key(pub).sign("0" * 64)
    # the serving side reads the key from the environment: the public key is enough
    monkeypatch.setenv(KEY_FILE_ENV, str(pub))
    assert verify_for_serving(tmp_path / "img.db")[0] is True
    monkeypatch.setenv(KEY_FILE_ENV, str(stranger))
    assert verify_for_serving(tmp_path / "img.db")[0] is False


def test_unsigned_is_the_default_and_says_so(src, tmp_path, monkeypatch):
    src.close()
    r = cli("cache", "export", "-o", tmp_path / "u.db", "--cache", src.path)
    assert r.returncode == 0 and "[unsigned: give --sign-key" in r.stdout, r.stderr
    r = cli("cache", "import", tmp_path / "u.db", cache=tmp_path / "a.db")
    assert r.returncode == 0 and "imported 4 winners" in r.stdout and "[unsigned]" in r.stdout, r.stderr
    monkeypatch.setenv(KEY_ENV, SECRET)              # a key configured: an unsigned file is refused
    one_line_error(cli("cache", "import", tmp_path / "u.db", cache=tmp_path / "b.db"), "is not signed")
    ok, why = verify_for_serving(tmp_path / "u.db")
    assert not ok and "is not signed" in why
    assert verify_for_serving("postgresql://nobody@/nothing")[0] is False
    assert verify_for_serving(tmp_path / "missing.db")[0] is False
    monkeypatch.setenv(KEY_ENV, "short")
    assert verify_for_serving(tmp_path / "u.db") == (False, f"signing key not usable: signing key from ${KEY_ENV} "
                                                     "is too short (5 bytes, need 16)")


def test_merge_verifies_inputs_and_signs_its_output(src, tmp_path, monkeypatch):
    key = load_key(environ={KEY_ENV: SECRET})
    export_cache(src, tmp_path / "a.json", fmt="json", key=key)
    export_cache(src, tmp_path / "u.json", fmt="json")
    monkeypatch.setenv(KEY_ENV, SECRET)                # the key for both, from the environment
    r = cli("cache", "merge", tmp_path / "a.json", "-o", tmp_path / "m.db")
    assert r.returncode == 0 and f"wrote 4 winners to {tmp_path / 'm.db'}" in r.stdout, r.stderr
    assert f"[signed (hmac-sha256, key {key.key_id})]" in r.stdout and "verified (hmac-sha256" in r.stdout
    assert verify_for_serving(tmp_path / "m.db")[0] is True
    one_line_error(cli("cache", "merge", tmp_path / "a.json", tmp_path / "u.json", "-o", tmp_path / "n.db"),
                   "u.json is not signed")
    assert not (tmp_path / "n.db").exists()


# ---------------------------------------------------------------------------- no torch needed

def test_cache_export_merge_prune_load_no_torch(src, tmp_path):
    """A build machine without torch can export, merge and prune (by device)."""
    src.close()
    code = f"""
import sys
sys.modules["torch"] = None                      # any import of torch fails
from autotune import cache
from autotune.integrations.portable import export_cache, merge_exports
from autotune.integrations.prune import prune
s = cache.Store({str(src.path)!r})
assert export_cache(s, {str(tmp_path / 'a.json')!r}, fmt="json").written == 4
assert export_cache(s, {str(tmp_path / 'b.db')!r}).written == 4
assert merge_exports([{str(tmp_path / 'a.json')!r}, {str(tmp_path / 'b.db')!r}], {str(tmp_path / 'm.db')!r}).written == 4
assert prune(s, drop_devices={{"0" * 16}}).winners == 0
loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith(("torch.", "tactics", "autotune.engine", "autotune.runtime")))
print(loaded, sys.modules["torch"])
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['torch'] None"
