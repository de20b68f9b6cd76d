"""One column list (autotune.cache.columns, derived from autotune.core.records): the ORM declares
exactly its columns, and every committed cache opens, reads and round-trips as it did before the list
(its export payload's checksum and its trials, devices and meta rows unchanged, as recorded with the
code of f4cc350, which spelled the columns by hand)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import lzma
import tarfile
from pathlib import Path

import pytest

from autotune.cache import Store
from autotune.cache import columns
from autotune.cache.exportfile import Skips, checksum, collect, entries, read, write_json, write_sqlite
from autotune.cache.schema import SCHEMA_VERSION, MissRow, TrialRow, WinnerRow
from autotune.core.records import FIRST_FORM, Miss, Trial, Winner, added, joined
from autotune.core.tactic import canonical_json

ROOT = Path(__file__).resolve().parents[1]

#: name -> (schema, export checksum, trials digest, devices digest, meta digest), read at f4cc350
GOLDEN = {
    "docs/data/cuda-search-h200/cuda-search.db": (2, "a86ab3004cf4c71714655d669ae6ea729a0937081e60cb83773272fe5ea885a5", "1a8088601d9e5c5c", "f26172630c55c164", "44136fa355b3678a"),
    "docs/data/h200-glm5-tp8.db": (1, "58205dd0f0bede3e6d36219721999056d22f0dfaa501261022ebf548ab5cd9db", "57347a882468703c", "5b5c51288cfea312", "e6434b3247982276"),
    "docs/data/moe-latency-h200-ab/moe-sweep-h200.db": (3, "2dc9704b0573efa1132e3655d9277c6c72dc9e68bf2b5ddbd42ee7f3bf09ca62", "e316c19855ee905b", "26b3e8ca34ed4a1a", "44136fa355b3678a"),
    "docs/data/moe-search-h200.db": (2, "0a42fbd91112721a810bcc9c4ea3286b1b569d20e78368353a32cb0dc4ad2604", "3be845b307cb304e", "ec4792ec69f14e5d", "44136fa355b3678a"),
    "docs/data/h200x2-glm5-tp8-full.db.xz": (1, "f782e0f298b2b000c084bff69cbe0f0d2b1026476de57b526a7213d2a95f2ff7", "083145c4322afc0e", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/main-job-h100-nineteenth.db.xz": (3, "ccdd97b8aba612097ea6064ef58d8d4ffb71ac6b9c33b6a365cdb95d5b738938", "401ee12b3ad6bfd9", "7166258af045dabd", "548f1f18422e4f24"),
    "docs/data/main-job-h100-seventeenth-cut.db.xz": (3, "abcb7c6d4d8688631df1d3c7cd01995e586b8d7b3f16880d9941461638502cad", "c79e9ba6dc4ef0cb", "7166258af045dabd", "548f1f18422e4f24"),
    "docs/data/main-job-h100-seventeenth-max64-cut.db.xz": (3, "bff61af49b57ab3ae41fbff67e2804d4df7bfb052e04f737596cee110d6551cd", "5869f730fb74fcdf", "7166258af045dabd", "548f1f18422e4f24"),
    "docs/data/main-job-h100-seventeenth.db.xz": (3, "4558793302511bd9b15691764dbf6ab4636eddcc6dc0634dd9d27d2fb6c4fd02", "29e62ce523824f10", "7166258af045dabd", "548f1f18422e4f24"),
    "docs/data/main-job-h100-sixteenth.db.xz": (3, "8df0dfb2f6d70d4d4741ef392894d464a325fc6c1c1b24549ef9e1446d783071", "863f40ebf04a0e29", "7166258af045dabd", "548f1f18422e4f24"),
    "docs/data/main-job-h200-fourteenth.db.xz": (3, "c02acf22ac1a2e636c2d7e6a250789a9ac59a59b6fc52ab54df84896eb9e6648", "b434da685655a7b4", "97d0d2ac7c28e035", "548f1f18422e4f24"),
    "docs/data/main-job-h200-thirteenth.db.xz": (3, "833f50790935db9ad474b048b78f14d79477f5b5b76437e8b4351688a324b943", "979a294bd62fb3cf", "97d0d2ac7c28e035", "44136fa355b3678a"),
    "docs/data/main-job-h200.db.xz": (3, "7d783ef850a0586bdb1c916df93a79ad657c9aaf13f0d634f69d20949fe8b1f3", "c037d1970cafff18", "26b3e8ca34ed4a1a", "44136fa355b3678a"),
    "docs/data/h200-rank-caches.tgz:a.db": (2, "bd4d33b57ab8e26a96213dafb6eb7847b94ab8fa9e14e9493a1361f7ab7ca994", "5b981356a718a23a", "ec4792ec69f14e5d", "44136fa355b3678a"),
    "docs/data/h200-rank-caches.tgz:b.db": (2, "2b73828a8dc646ac2a942ef4b311109c15843d6e915dbf6c64a6a8422cafe233", "fdd76c1b62c2e075", "ec4792ec69f14e5d", "44136fa355b3678a"),
    "docs/data/multi-gpu/run1-sample.tgz:one.db": (1, "a770971657fb5ac0e2a3b4c055f1353f41fe7ad00e19c51c887a0aec42e9ea54", "3bc9b2021da172bb", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run1-sample.tgz:two.db": (1, "4755f27167bd830ffe2b5ade7559c3aaf214b9b66656abbe56317b1d5069e743", "285cbd57ff1ff0d7", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run1-sample.tgz:lo.db": (1, "1ed1ff158c912cff4e5ef135aa11da78e8e9f81086282568992bcfa7c164f798", "ba098e8bf9cc31a1", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run1-sample.tgz:hi.db": (1, "4e2178f7b66247653faeb2340741c697a2a5362e318385eabd243dbeccbbeebc", "03087f3069637485", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run1-sample.tgz:merged.db": (1, "cde7716f52c0b518dfd42fa19749d7a0fd361294b53f60f0c908c13077ffd98e", "4f53cda18c2baa0c", "5b5c51288cfea312", "773dd316de347fa1"),
    "docs/data/multi-gpu/run2-moe.tgz:one.db": (1, "5066643126f79ab9b43cdc7c5dde793a6219df39752aefef20fbb5e15009a0d7", "44764d12772912ff", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run2-moe.tgz:two.db": (1, "f8bfe13debd993b8ee73aea85b2a40967aac05dd63f66e6e0e0a141dce7d1201", "64ff2e176e69c424", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run3-dense.tgz:one.db": (1, "3a1d12c977d561860e96c61b2e6cce23ea1eed40e3f2b0ecd2fd20d7feb1ff28", "971d9df903a9837a", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/multi-gpu/run3-dense.tgz:two.db": (1, "527dc70d49dd532ede2184177a3e57bb14ae0545dd81f90949eafcacde4cafab", "ad81cc0f65de0020", "5b5c51288cfea312", "44136fa355b3678a"),
}
#: round-tripped through a fresh cache and both export forms: one cache of each schema, and an export
ROUND_TRIP = ("docs/data/multi-gpu/run1-sample.tgz:one.db", "docs/data/cuda-search-h200/cuda-search.db",
              "docs/data/main-job-h200.db.xz", "docs/data/multi-gpu/run1-sample.tgz:merged.db")


def _digest(x) -> str:
    return hashlib.sha256(canonical_json(x).encode()).hexdigest()[:16]


def _open(name: str, tmp: Path) -> Path:
    """The committed cache `name` as a plain file (decompressed or unpacked into tmp)."""
    path, _, member = name.partition(":")
    p = ROOT / path
    if member:
        with tarfile.open(p) as t:
            out = tmp / member.replace("/", "_")
            out.write_bytes(t.extractfile(member).read())
            return out
    if p.suffix == ".xz":
        out = tmp / p.name[:-3]
        out.write_bytes(lzma.decompress(p.read_bytes()))
        return out
    return p


def test_every_committed_cache_is_listed():
    found = {str(p.relative_to(ROOT)) for p in ROOT.glob("docs/data/**/*.db")}
    found |= {str(p.relative_to(ROOT)) for p in ROOT.glob("docs/data/**/*.db.xz")}
    for p in ROOT.glob("docs/data/**/*.tgz"):
        with tarfile.open(p) as t:
            found |= {f"{p.relative_to(ROOT)}:{m}" for m in t.getnames() if m.endswith(".db")}
    assert found == set(GOLDEN)


def _orm_columns(row) -> set[str]:
    return {c.name for c in row.__table__.columns}


@pytest.mark.parametrize("row, cols, extra", [(TrialRow, columns.TRIAL, columns.TRIAL_EXTRA),
                                              (WinnerRow, columns.WINNER, columns.WINNER_EXTRA),
                                              (MissRow, columns.MISS, columns.MISS_EXTRA)])
def test_orm_columns_equal_the_column_list(row, cols, extra):
    assert _orm_columns(row) == set(columns.names(cols)) | set(extra)
    assert not set(extra) & set(columns.names(cols))


def test_orm_keys_are_the_column_lists_keys():
    uq = [c for c in TrialRow.__table__.constraints if getattr(c, "name", None) == "uq_trial"]
    assert [tuple(c.name for c in u.columns) for u in uq] == [columns.TRIAL_KEY]
    assert tuple(c.name for c in WinnerRow.__table__.primary_key) == columns.WINNER_KEY
    assert tuple(c.name for c in MissRow.__table__.primary_key) == columns.MISS_KEY


def test_each_column_knows_its_form():
    by = {c.name: c for c in columns.WINNER}
    assert "params_json" not in by                       # joined from the tactic row
    assert by["code_key"].since == 3 and by["code_key"].default == "" and not by["code_key"].required
    assert by["problem_key"].since == FIRST_FORM and by["problem_key"].required and by["problem_key"].text
    assert not by["bucket"].text
    assert all(c.since <= SCHEMA_VERSION for cols in (columns.TRIAL, columns.WINNER, columns.MISS) for c in cols)
    with pytest.raises(ValueError):
        added(FIRST_FORM, "")


def test_a_later_column_defaults_on_read_and_stays_out_of_an_export_while_default():
    @dataclasses.dataclass(frozen=True)
    class Rec:
        key: str
        params_json: str = joined()
        later: int = added(9, 0)

    cols = columns.columns_of(Rec)
    assert columns.names(cols) == ("key", "later")
    assert columns.export_dict(Rec("a", "{}"), cols) == {"key": "a"}
    assert columns.export_dict(Rec("a", "{}", 2), cols) == {"key": "a", "later": 2}
    assert columns.from_export({"key": "a"}, cols) == {"key": "a", "later": 0}
    assert columns.from_export({"later": 1}, cols) is None


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_committed_cache_reads_as_before(name, tmp_path):
    schema, want_checksum, trials, devices, meta = GOLDEN[name]
    with Store(_open(name, tmp_path), readonly=True) as s:
        assert s.schema_version == schema
        assert checksum(collect(s)) == want_checksum
        assert _digest([dataclasses.asdict(t) for t in s.trials()]) == trials
        assert _digest(s.devices()) == devices
        assert _digest(s.meta()) == meta


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_committed_cache_round_trips(name, tmp_path):
    with Store(_open(name, tmp_path), readonly=True) as src:
        trials, winners, misses = src.trials(), src.winners(), src.misses()
        devices, payload = src.devices(), collect(src)
        libsets = {w.lib_key: src.libset(w.lib_key) for w in winners}
    copy = tmp_path / "copy.db"
    with Store(copy) as dst:
        dst.put_trials([t for t in trials if t.params_json])
        dst.put_winners(winners, devices, {k: v for k, v in libsets.items() if v is not None})
        dst.record_misses(misses)
    with Store(copy, readonly=True) as back:
        got = back.trials()
        # a trial keeps every column; ids and times are the copy's own
        assert got == [t for t in trials if t.params_json]
        assert back.winners() == winners and back.misses() == misses
        assert collect(back) == payload
    skips = Skips()
    assert len(entries(payload, skips)) == len(payload["winners"]) and not skips.counts
    with open(tmp_path / "x.json", "w") as f:
        write_json(f, payload, None)
    write_sqlite(tmp_path / "x.db", payload, None)
    for out in ("x.json", "x.db"):
        exp = read(tmp_path / out)
        assert exp.payload == payload and exp.checksum == checksum(payload)


def test_an_export_from_before_code_keys_loads_them_empty(tmp_path):
    with Store(_open("docs/data/main-job-h200.db.xz", tmp_path), readonly=True) as s:
        payload = collect(s)
    assert payload["winners"] and all("code_key" not in w or w["code_key"] for w in payload["winners"])
    old = json.loads(json.dumps(payload))
    for w in old["winners"]:
        w.pop("code_key", None)
    got = entries(old, Skips())
    assert len(got) == len(old["winners"]) and {e.winner.code_key for e in got} == {""}
