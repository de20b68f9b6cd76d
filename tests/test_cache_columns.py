"""One column list (autotune.cache.columns, derived from autotune.core.records): the ORM declares
exactly its columns, and every committed cache opens, reads and round-trips as it did before the list
(its export payload's checksum and its trials, devices and meta rows unchanged, as recorded with the
code of f4cc350 and of main at 4dc69b2, which spelled the columns by hand)."""
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
from autotune.cache.exportfile import BASE_FORM
from autotune.cache.exportfile import Skips, checksum, collect, entries, read, write_json, write_sqlite
from autotune.cache.schema import SCHEMA_VERSION, MissRow, TrialRow, WinnerRow
from autotune.core.records import FIRST_FORM, Miss, Trial, Winner, added, joined
from autotune.core.tactic import canonical_json

ROOT = Path(__file__).resolve().parents[1]

#: name -> (schema, export checksum, trials digest, devices digest, meta digest), read at f4cc350
GOLDEN = {
    "docs/data/2026-11-30-h200x2-full-search.db.xz": (1, "f782e0f298b2b000c084bff69cbe0f0d2b1026476de57b526a7213d2a95f2ff7", "083145c4322afc0e", "5b5c51288cfea312", "44136fa355b3678a"),
    "docs/data/2026-12-02-h200-main-job.db.xz": (3, "7d783ef850a0586bdb1c916df93a79ad657c9aaf13f0d634f69d20949fe8b1f3", "c037d1970cafff18", "26b3e8ca34ed4a1a", "44136fa355b3678a"),
    "docs/data/2026-12-03-h200-moe-config-sweep.db.xz": (3, "2dc9704b0573efa1132e3655d9277c6c72dc9e68bf2b5ddbd42ee7f3bf09ca62", "e316c19855ee905b", "26b3e8ca34ed4a1a", "44136fa355b3678a"),
    "docs/data/2026-12-05-h200-7a8be9d-main-job.db.xz": (3, "c02acf22ac1a2e636c2d7e6a250789a9ac59a59b6fc52ab54df84896eb9e6648", "b434da685655a7b4", "97d0d2ac7c28e035", "548f1f18422e4f24"),
    "docs/data/2026-12-06-h100-2d14637-main-job.db.xz": (3, "ccdd97b8aba612097ea6064ef58d8d4ffb71ac6b9c33b6a365cdb95d5b738938", "401ee12b3ad6bfd9", "7166258af045dabd", "548f1f18422e4f24"),
}
#: caches of later export forms (their rows set `replay_checked`, 4, or `predicted`, 5), read at 7f1241e (the
#: 5d44fcb ones at c7f6bfa, the 13d6647 ones at 13d6647):
#: name -> (schema, export form, trials, winners, replay-checked winners, predicted winners, export
#: checksum with predicted winners included, trials digest)
LATER = {
    "docs/data/2026-12-07-h100-961f0e7-main-job.db.xz": (5, 4, 7213, 294, 294, 0, "1cca9633433e21ea40a8d9a2e29221300fcc77aa1fea1abaa3387f50bd8541b7", "4c2148572c42547a"),
    "docs/data/2026-12-07-h100-961f0e7-main-job-64.db.xz": (5, 4, 3705, 90, 90, 0, "168a76c94856f6a8c5a4ed0a9b7f80fe31108b45901de95fee1abef3683fead6", "2deba69d5acdb6bc"),
    "docs/data/2026-12-07-h100-961f0e7-predict.db.xz": (5, 5, 2033, 294, 0, 294, "36157942d7516026f9c38f0444b980d4f72ce4f49dbe45acc91506bbecc9bc1e", "90da3e34e0797a4b"),
    "docs/data/2026-12-07-h100-5d44fcb-main-job.db.xz": (5, 4, 5643, 294, 294, 0, "e3055f41142adc86eebc6b2ad7d8e915b4ff2029c5ebef9fe427cbb12329bd31", "abe8b2a8126010fa"),
    "docs/data/2026-12-07-h100-5d44fcb-predict.db.xz": (5, 5, 2033, 294, 294, 294, "816de69b11dbacab0758e590862dcf20eb0cf1a5e0bb6b4ceeb1f5515e210f1b", "f3dbea6bd9025977"),
    "docs/data/2026-12-07-h100-13d6647-main-job.db.xz": (5, 4, 4866, 294, 294, 0, "bfe02f12accecc021d5f34feaa2a23a8bbd35cae3a8e2a6e3b394b91a1a5e00b", "d579ade02b4b7839"),
    "docs/data/2026-12-07-h100-13d6647-main-job-ref.db.xz": (5, 4, 5651, 294, 294, 0, "6652c941c8e8d33a513024a30b95879becbc1b2fd40d972f960f646be4a9275a", "d8fde21c3bfcb093"),
    "docs/data/2026-12-07-h100-13d6647-predict.db.xz": (5, 5, 2033, 294, 294, 294, "20db5d917a2d34cd66cfd822dd8683e176d34cc205252890c75914f04f31c268", "f3dbea6bd9025977"),
}
#: round-tripped through a fresh cache and both export forms: one cache of each schema committed
ROUND_TRIP = ("docs/data/2026-11-30-h200x2-full-search.db.xz", "docs/data/2026-12-02-h200-main-job.db.xz")


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
    assert found == set(GOLDEN) | set(LATER)


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


#: the schema the goldens were read under: a column added later reads as its default in these files,
#: and an export's payload names the schema it is written under
GOLDEN_FORM = 3


def _as_of_golden(t: Trial) -> dict:
    d = dataclasses.asdict(t)
    for c in columns.TRIAL:
        if c.since > GOLDEN_FORM:
            assert d.pop(c.name) == c.default, c.name
    return d


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_committed_cache_reads_as_before(name, tmp_path):
    schema, want_checksum, trials, devices, meta = GOLDEN[name]
    with Store(_open(name, tmp_path), readonly=True) as s:
        assert s.schema_version == schema
        payload = collect(s)
        # no row sets a column added after the base form, so the export says the base form
        assert payload["schema"] == BASE_FORM
        assert checksum({**payload, "schema": GOLDEN_FORM}) == want_checksum
        assert _digest([_as_of_golden(t) for t in s.trials()]) == trials
        assert _digest(s.devices()) == devices
        assert _digest(s.meta()) == meta


@pytest.mark.parametrize("name", sorted(LATER))
def test_later_committed_cache_reads_as_before(name, tmp_path):
    schema, form, n_trials, n_winners, replayed, predicted, want_checksum, trials = LATER[name]
    with Store(_open(name, tmp_path), readonly=True) as s:
        assert s.schema_version == schema
        winners = s.winners()
        assert (len(winners), sum(w.replay_checked for w in winners), sum(w.predicted for w in winners)) == \
            (n_winners, replayed, predicted)
        payload = collect(s, include_predicted=True)
        assert payload["schema"] == form and checksum(payload) == want_checksum
        assert len(s.trials()) == n_trials and _digest([dataclasses.asdict(t) for t in s.trials()]) == trials
        # an export without --include-predicted leaves every predicted winner out
        assert len(collect(s)["winners"]) == n_winners - predicted


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
    with Store(_open("docs/data/2026-12-02-h200-main-job.db.xz", tmp_path), readonly=True) as s:
        payload = collect(s)
    assert payload["winners"] and all("code_key" not in w or w["code_key"] for w in payload["winners"])
    old = json.loads(json.dumps(payload))
    for w in old["winners"]:
        w.pop("code_key", None)
    got = entries(old, Skips())
    assert len(got) == len(old["winners"]) and {e.winner.code_key for e in got} == {""}
