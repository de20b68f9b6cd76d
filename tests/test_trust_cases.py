"""#24 item 5: each case of the adversarial pass on f11bb21 answered with one line and a non-zero
exit, or made correct. (Deep JSON, the refused import's target and dispatch((1.5 | True, N, K))
are in tests/test_hostile_readers.py and tests/test_input_contract.py.)"""
from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from pathlib import Path

import pytest

from autotune import api
from autotune.core.records import Trial
from autotune.integrations import flashinfer as fi
from autotune.integrations.portable import export_cache, import_cache
from autotune.models import ModelError, load_model
from autotune.runtime.dispatch import Dispatcher
from autotune.cache import CacheError, Store, verify_for_serving
from autotune.cache.signing import KEY_ENV, KEY_FILE_ENV
from autotune.tactics import registry
from tests.test_cache_bad import ENV, P, TOR, TRI, _w, one_line_error, resign
from tests.helpers import run_cli
from tests import test_flashinfer_export as fx


@pytest.fixture(autouse=True)
def no_configured_key(monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)


def _llama(tmp_path: Path, raw_hidden: str | None = None, **over) -> Path:
    """A tiny llama config.json; raw_hidden is written as a bare JSON literal (a 5000-digit integer)."""
    d = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 4, **over}
    text = json.dumps(d)
    if raw_hidden is not None:
        text = text.replace('"hidden_size": 256', f'"hidden_size": {raw_hidden}')
    p = tmp_path / "config.json"
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------- config.json

@pytest.mark.parametrize("value, shown", [("{0}", "'{0}'"), ("{f}", "'{f}'"), ({"a": {"b": 1}}, "{'a': {'b': 1}}"),
                                          ("{" * 3, "'{{{'")])
def test_config_values_holding_braces_or_objects_name_file_and_field(tmp_path, value, shown):
    cfg = _llama(tmp_path, hidden_size=value)
    with pytest.raises(ModelError) as e:
        load_model(cfg)
    assert str(e.value) == f"{cfg}: field 'hidden_size' must be a positive integer, got {shown}"


def test_a_5000_digit_integer_names_the_file_and_the_field(tmp_path):
    cfg = _llama(tmp_path, raw_hidden="9" * 5000)
    with pytest.raises(ModelError) as e:
        load_model(cfg)
    assert str(e.value) == (f"{cfg}: field 'hidden_size' = a 5000-digit integer is larger than 2147483647, "
                            "the largest size supported")


def test_a_size_that_cannot_fit_is_refused_before_anything_is_stored(tmp_path):
    # every N and K within MAX_DIM (head_dim 16), so only the memory the inputs need refuses it
    cfg = _llama(tmp_path, hidden_size=2**31 - 16, head_dim=16, num_attention_heads=1, num_key_value_heads=1)
    db = tmp_path / "c.db"
    with pytest.raises(api.BadInput, match=r"GiB, more than the [\d,.]+ GiB of cpu memory here: nothing could be "
                                           "measured"):
        api.run(str(cfg), families="torch", buckets="1", cache=str(db))
    assert not db.exists()            # refused up front: no cache, no trial stored as failed


def test_an_in_memory_cache_is_refused_for_search(tmp_path):
    with pytest.raises(api.BadInput, match="sqlite:// is an in-memory database: a search would measure and keep "
                                           "nothing"):
        api.run([P], families="torch", buckets=[1], cache="sqlite://")


# ------------------------------------------------------------------------------- import/serve

def _src(tmp_path: Path) -> Store:
    s = Store(tmp_path / "src.db")
    s.put_environment(ENV, registry.get("torch").depends_on)
    s.put_environment(ENV, registry.get("triton").depends_on)
    s.put_winner(_w(TOR, 4))
    return s


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_two_winners_for_one_key_in_one_import_follow_the_winner_rule(tmp_path, order):
    src = _src(tmp_path)
    out = tmp_path / "x.json"
    export_cache(src, out, fmt="json")
    doc = json.loads(out.read_text())
    slow = doc["winners"][0]
    fast = {**slow, "tactic_id": TRI.id, "family": "triton", "lib_key": _w(TRI, 4).lib_key, "median_us": 4.0,
            "speedup": 1.5}                       # default 6.0 us: beats it by the margin
    doc["winners"] = [(slow, fast)[i] for i in order]
    doc["tactics"].append({"id": TRI.id, "family": "triton", "params": TRI.params})
    doc["tactics"].sort(key=lambda t: t["id"])
    doc["libsets"] = sorted({json.dumps(x, sort_keys=True) for x in doc["libsets"]}
                            | {json.dumps({"lib_key": fast["lib_key"], "versions": ENV.lib_versions(
                                registry.get("triton").depends_on)}, sort_keys=True)})
    doc["libsets"] = [json.loads(x) for x in doc["libsets"]]
    (tmp_path / "dup.json").write_text(json.dumps(resign(doc)))
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, tmp_path / "dup.json")
        assert rep.imported == 1 and rep.skipped == {"duplicate winner, lost to the winner rule": 1}
        assert [(w.tactic_id, w.median_us) for w in dst.winners()] == [(TRI.id, 4.0)]


def _tampered_export(tmp_path: Path) -> Path:
    src = _src(tmp_path)
    out = tmp_path / "x.db"
    export_cache(src, out)
    c = sqlite3.connect(out)
    c.execute("UPDATE winners SET median_us = 0.5, speedup = 12.0")     # the meta checksum no longer matches
    c.commit()
    c.close()
    return out


def test_serving_refuses_an_export_whose_checksum_does_not_match_without_a_key(tmp_path):
    out = _tampered_export(tmp_path)
    with pytest.raises(CacheError, match="checksum mismatch"):      # what import says
        import_cache(Store(tmp_path / "dst.db"), out)
    ok, why = verify_for_serving(out, environ={})
    assert not ok and "checksum mismatch" in why
    with pytest.warns(UserWarning, match="cache not used .*checksum mismatch"):
        d = Dispatcher(out, env=ENV, record_misses=False)
    assert "checksum mismatch" in d.cache_error and not d._winners
    # an intact export and a whole cache still serve with no key configured
    good = tmp_path / "good.db"
    export_cache(Store(tmp_path / "src.db", readonly=True), good)
    assert verify_for_serving(good, environ={}) == (True, "unsigned: no signing key configured")
    with Store(tmp_path / "src.db", readonly=True) as whole:
        assert verify_for_serving(whole, environ={}) == (True, "unsigned: no signing key configured")


# ------------------------------------------------------------------------------- exports

def _full_disk(monkeypatch, module) -> list[str]:
    """The export's temporary file opened on /dev/full: its writes get ENOSPC from the kernel."""
    made: list[str] = []
    real = tempfile.mkstemp

    def mkstemp(*a, **kw):
        fd, name = real(*a, **kw)
        full = os.open("/dev/full", os.O_WRONLY)
        os.dup2(full, fd)
        os.close(full)
        made.append(name)
        return fd, name
    monkeypatch.setattr(module.tempfile, "mkstemp", mkstemp)
    return made


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_flashinfer_export_onto_a_full_disk_leaves_no_file_and_says_so(tmp_path, monkeypatch):
    made = _full_disk(monkeypatch, fi)
    with Store(_fi_cache(tmp_path), readonly=True) as s:
        with pytest.raises(fi.ExportError) as e:
            fi.export_flashinfer(s, tmp_path / "out" / "fi.json", gpu=fx.GPU, version="0.7.4",
                                 metadata=fx._meta("0.7.4"))
    assert str(e.value) == f"cannot write {tmp_path / 'out' / 'fi.json'}: No space left on device; nothing written " \
                           "(no partial file left)"
    assert made and sorted(os.listdir(tmp_path / "out")) == []         # neither file, no temporary left


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_json_export_onto_a_full_disk_leaves_no_file_and_says_so(tmp_path, monkeypatch):
    import autotune.integrations.portable as portable
    src = _src(tmp_path)
    (tmp_path / "out").mkdir()
    _full_disk(monkeypatch, portable)
    with pytest.raises(CacheError, match="No space left on device; nothing written"):
        export_cache(src, tmp_path / "out" / "x.json", fmt="json")
    assert os.listdir(tmp_path / "out") == []


def _fi_cache(tmp_path: Path, failed_idx: int | None = None) -> Path:
    (tmp_path / "out").mkdir(exist_ok=True)
    path = tmp_path / "fi.db"
    with Store(path) as s:
        s.put_environment(fx.SM120, fx.DEPS)
        for b, idx in fx.PICKS.items():
            s.put_winner(fx._winner(fx.SM120, fx.DENSE, b, fx._tactic(idx)))
        if failed_idx is not None:      # the bucket-8 winner failed at bucket 16 of the same problem
            t = fx._tactic(failed_idx)
            s.put_trial(Trial(fx.DENSE.key, 16, t.id, "cutlass", t.to_json(), fx.SM120.device_key,
                              fx.SM120.lib_key(fx.DEPS), "failed", "illegal instruction (worker died)"))
    return path


def test_flashinfer_never_writes_a_tactic_into_an_entry_of_a_problem_it_failed_on(tmp_path):
    bad = fx.PICKS[8]
    with Store(_fi_cache(tmp_path, failed_idx=bad), readonly=True) as s:
        rep = fi.export_flashinfer(s, tmp_path / "out" / "fi.json", gpu=fx.GPU, version="0.7.4",
                                   metadata=fx._meta("0.7.4"))
    doc = json.loads((tmp_path / "out" / "fi.json").read_text())
    served = {v[1] for k, v in doc.items() if isinstance(v, list)}
    assert bad not in served and served                       # every other winner is still written
    assert any(f"bucket 8: winner tactic {bad} is blocklisted (trial failed on {fx.DENSE.key} bucket 16" in x
               and "FlashInfer falls back to -1" in x for x in rep.skipped)
    bl = json.loads((tmp_path / "out" / "fi.blocklist.json").read_text())
    assert bad in bl["invalid_tactics"][fi.K.BLOCKLIST_KEY]   # blocked, and no entry serves it


def test_sign_key_with_the_flashinfer_format_is_refused(tmp_path):
    key = tmp_path / "k"
    key.write_text("0123456789abcdef-a-shared-secret")
    r = run_cli("cache", "export", "--format", "flashinfer", "-o", tmp_path / "o.json", "--gpu", "5090",
                "--flashinfer-version", "0.7.4", "--sign-key", key, "--cache", _fi_cache(tmp_path), timeout=300)
    one_line_error(r, "--sign-key does not apply to --format flashinfer")
    assert not (tmp_path / "o.json").exists()
