"""The portable export format: what a file holds, how it is written, read and checked entry by entry.

Two forms, told apart by content on read:
  * sqlite: a fresh cache database holding only the exported rows, plus `meta` rows
    (format, schema, checksum of the payload, signature);
  * json: {"format": "fp4-autotune-cache", "schema": 1, "winners": [...], "tactics": [...],
    "problems": [...], "devices": [...], "libsets": [...], "checksum": sha256(canonical payload),
    "signature": {...} (signed exports only)}.
Nothing is ever unpickled or evaluated. The payload is recomputed from a SQLite file's rows, so
its checksum (and a signature over it) covers exactly what a reader of that file gets.

This lives in the cache layer (not with the import/merge integration) because serving verifies a
signed file before trusting it, and the runtime may import the cache, never the integrations.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from autotune.core import jsonread
from autotune.core.layer import KIND as LAYER_KIND
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic, canonical_json

from autotune.cache.columns import WINNER, export_dict, from_export
from autotune.cache.files import SQLITE_MAGIC, CacheError, is_sqlite, parse, sqlite_file, to_url
from autotune.cache.rows import check_device, check_libset, check_winner
from autotune.cache.schema import SCHEMA_VERSION
from autotune.cache.signing import SigningKey, describe, load_key
from autotune.cache.store import Store

FORMAT = "fp4-autotune-cache"
#: a JSON export larger than this is refused before parsing (~1e6 winners)
MAX_JSON_BYTES = 1 << 30
KINDS = ("winners", "tactics", "problems", "devices", "libsets")


@dataclass
class Skips:
    """Skipped entries: a count per reason and the name of every skipped row."""

    counts: dict[str, int] = field(default_factory=dict)
    rows: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, row: str) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + 1
        self.rows.setdefault(reason, []).append(row)


@dataclass(frozen=True)
class Entry:
    """One winner of an export that passed every structural check, with the rows it needs."""

    winner: Winner
    device: dict
    versions: dict


@dataclass(frozen=True)
class Export:
    path: str
    payload: dict
    checksum: str | None          # as stored in the file (None: a whole cache, never exported)
    signature: Any                # as stored (None: unsigned)


def checksum(payload: dict) -> str:
    try:
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    except (TypeError, ValueError) as e:
        raise CacheError(f"export payload is not canonical JSON: {e}") from None


def select_devices(devices: Iterable[dict], gpu: str) -> set[str]:
    """Device keys matching a GPU name (exactly, else as a substring) or a device key."""
    devices = list(devices)
    g = gpu.strip().lower()
    exact = {d["device_key"] for d in devices if str(d.get("gpu_name", "")).lower() == g or d["device_key"] == gpu}
    if exact:
        return exact
    sub = {d["device_key"] for d in devices if g in str(d.get("gpu_name", "")).lower()}
    if not sub:
        names = sorted({str(d.get("gpu_name", "?")) for d in devices})
        raise CacheError(f"no device in the cache matches GPU {gpu!r} (known: {', '.join(names) or 'none'})")
    return sub


def row_name(w: Any) -> str:
    """How a skipped winner is named in reports: problem, bucket, device (as stored, whatever the types)."""
    get = w.get if isinstance(w, dict) else (lambda k: getattr(w, k, None))
    return f"{get('problem_key')!s} bucket {get('bucket')!r} on {str(get('device_key'))[:16]}"


# ------------------------------------------------------------------------------------- payload

#: the form of every export written before a later column (schema 3: code keys, carried when set)
BASE_FORM = 3


def _payload(winners: list[Winner], devices: dict[str, dict], libsets: dict[str, dict]) -> dict:
    tactics, problems = {}, {}
    for w in winners:
        if w.params_json:            # "" = no tactic row: the winner travels alone ("unknown tactic")
            try:
                t = Tactic.from_json(w.params_json)
                tactics[w.tactic_id] = {"id": w.tactic_id, "family": t.family, "params": t.params}
            except (ValueError, TypeError, AttributeError):
                tactics[w.tactic_id] = {"id": w.tactic_id, "family": w.family, "params": str(w.params_json)}
        try:
            problems[w.problem_key] = {"key": w.problem_key, **Problem.from_key(w.problem_key).to_dict()}
        except (ValueError, TypeError):
            pass
    # a column added after the first form is left out while it holds its default: a row from before
    # it keeps the payload (and checksum) it had (autotune.cache.columns)
    wl = [export_dict(w, WINNER) for w in winners]
    dev_keys = {w.device_key for w in winners}
    lib_keys = {w.lib_key for w in winners}
    # the form the payload needs: a later column set in some row raises it (a reader of an older
    # form refuses the file instead of dropping the column); otherwise the form every export had
    form = max([BASE_FORM, *(c.since for c in WINNER if c.since > BASE_FORM for d in wl if c.name in d)])
    return {"format": FORMAT, "schema": form, "winners": wl,
            "tactics": [tactics[k] for k in sorted(tactics, key=str)],
            "problems": [problems[k] for k in sorted(problems)],
            "devices": [devices[k] for k in sorted(dev_keys, key=str) if k in devices],
            "libsets": [{"lib_key": k, "versions": libsets[k]} for k in sorted(lib_keys, key=str) if k in libsets]}


def collect(store: Store, gpu: str | None = None, problem_keys: Iterable[str] | None = None,
            include_predicted: bool = False) -> dict:
    """The payload of `store`'s winners (optionally one GPU's / some problems'), every row as stored;
    predicted winners (never timed) only with `include_predicted`."""
    devices = store.device_records()
    # a whole MoE layer's winners (kind moe_layer) stay in the cache that measured them: no engine's
    # format has the problem, and a pair tactic's key does not cover the code of the tactics it runs
    winners = [w for w in store.winners() if (include_predicted or not w.predicted)
               and not w.problem_key.startswith(LAYER_KIND + ":")]
    if gpu:
        keys = select_devices(devices.values(), gpu)
        winners = [w for w in winners if w.device_key in keys]
    if problem_keys is not None:
        pk = set(problem_keys)
        winners = [w for w in winners if w.problem_key in pk]
    libsets = {}
    for k in {w.lib_key for w in winners}:
        try:
            v = store.libset(k) if isinstance(k, str) else None
        except ValueError:          # damaged versions_json: its winners skip as "unknown libset"
            v = None
        if v is not None:
            libsets[k] = v
    return _payload(winners, devices, libsets)


def payload_of(entries: list[Entry]) -> dict:
    """The payload holding exactly these (checked) entries."""
    return _payload([e.winner for e in entries], {e.winner.device_key: e.device for e in entries},
                    {e.winner.lib_key: e.versions for e in entries})


def _index(items: Any, key: str) -> dict[str, dict]:
    return {d[key]: d for d in items or [] if isinstance(d, dict) and isinstance(d.get(key), str)}


def entries(payload: dict, skips: Skips) -> list[Entry]:
    """The payload's winners that pass every structural check (autotune.cache.rows), with their device and
    libset rows; every other winner is added to `skips` with its reason and name."""
    tactics = _index(payload.get("tactics"), "id")
    devices = _index(payload.get("devices"), "device_key")
    libsets = _index(payload.get("libsets"), "lib_key")
    out = []
    for i, e in enumerate(payload.get("winners") or []):
        cols = from_export(e, WINNER) if isinstance(e, dict) else None
        if cols is None:
            skips.add("malformed winner", f"winners[{i}]")
            continue
        tid = e["tactic_id"]
        t = tactics.get(tid) if isinstance(tid, str) else None
        if t is None:
            skips.add("unknown tactic", row_name(e))
            continue
        try:
            params_json = Tactic(t["family"], t["params"]).to_json()
        except (KeyError, TypeError, ValueError, AttributeError):
            skips.add("malformed tactic", row_name(e))
            continue
        w = Winner(**cols, params_json=params_json)
        why = check_winner(w)
        if why is None:
            dev = devices.get(w.device_key)
            why = "unknown device" if dev is None else check_device(dev, w.device_key)
        if why is None:
            versions = (libsets.get(w.lib_key) or {}).get("versions")
            why = check_libset(versions, w.lib_key)
        if why:
            skips.add(why, row_name(e))
            continue
        out.append(Entry(w, dev, versions))
    return out


# --------------------------------------------------------------------------------------- files

def read(path: str | os.PathLike) -> Export:
    """An export (either form) or a whole cache file; raises CacheError for anything else or a
    checksum that does not match. Signatures are read, not checked (see `verify`)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise CacheError(f"cannot read {path}: {e.strerror or e}") from None
    if head.startswith(SQLITE_MAGIC):
        with Store(path, readonly=True) as src:
            return read_store(src, str(path))
    try:
        doc = jsonread.read(path, max_bytes=MAX_JSON_BYTES)
    except jsonread.JSONLimitError as e:
        raise CacheError(f"{path} is not an fp4-autotune export: {str(e).removeprefix(f'{path}: ')}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CacheError(f"{path} is not an fp4-autotune export: no format {FORMAT!r}")
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise CacheError(f"{path} was written by a newer fp4-autotune (schema {schema} > supported {SCHEMA_VERSION})")
    payload = {k: v for k, v in doc.items() if k not in ("checksum", "signature")}
    if doc.get("checksum") != checksum(payload):
        raise CacheError(f"{path}: checksum mismatch, the export was modified or is damaged")
    for k in KINDS:
        if not isinstance(payload.get(k, []), list):
            raise CacheError(f"{path} is not an fp4-autotune export: {k!r} is not a list")
    return Export(str(path), payload, doc["checksum"], doc.get("signature"))


def read_store(store: Store, where: str | None = None) -> Export:
    """The export held by an open cache (a SQLite export, or any cache: then no checksum)."""
    where = where or store.url
    payload = collect(store)
    meta = store.meta()
    want = meta.get("checksum")
    if want is not None and want != checksum(payload):
        raise CacheError(f"{where}: checksum mismatch, the export was modified or is damaged")
    sig = meta.get("signature")
    if sig is not None:
        try:
            sig = jsonread.loads(sig, f"{where}: meta signature", max_bytes=1 << 16)
        except ValueError:
            sig = "malformed"
    return Export(where, payload, want, sig)


def verify(export: Export, key: SigningKey | None) -> str:
    """How the export is signed, checked against `key` when one is configured: returns a short
    status ("unsigned", "verified (ed25519, key …)", "signed (…), not verified: no key configured");
    raises CacheError when a key is configured and the file is unsigned or its signature is bad."""
    if key is None:
        status = describe(export.signature)
        return status if export.signature is None else status + ", not verified: no key configured"
    if export.signature is None or export.checksum is None:
        raise CacheError(f"{export.path} is not signed, and a signing key is configured ({key.describe()})")
    why = key.check(export.signature, export.checksum)
    if why:
        raise CacheError(f"{export.path}: bad signature: {why}")
    return f"verified ({key.describe()})"


def write_json(f, payload: dict, signature: dict | None) -> None:
    doc = {**payload, "checksum": checksum(payload)}
    if signature is not None:
        doc["signature"] = signature
    json.dump(doc, f, sort_keys=True, indent=1, allow_nan=False)


def write_sqlite(path: Path, payload: dict, signature: dict | None) -> None:
    """A new cache file holding exactly the payload's entries (all must pass: check them first)."""
    skips = Skips()
    got = entries(payload, skips)
    if skips.counts:
        raise CacheError(f"export would drop entries: {skips.counts}")
    meta = {"format": FORMAT, "schema": str(SCHEMA_VERSION), "checksum": checksum(payload),
            "winners": str(len(got))}
    if signature is not None:
        meta["signature"] = canonical_json(signature)
    with Store(path) as dst:
        dst.put_winners([e.winner for e in got], [e.device for e in got],
                        {e.winner.lib_key: e.versions for e in got})
        dst.put_meta_items(meta)
        dst.make_self_contained()


def verify_for_serving(source: str | os.PathLike | Store | None, key: SigningKey | None = None, *,
                       environ: dict[str, str] | None = None) -> tuple[bool, str]:
    """May a serving process use the rows of `source` (a cache path/URL, an open Store, or None =
    the default cache)? An export's checksum must match its rows in every case (as import
    requires). With no key given or configured ($AUTOTUNE_SIGNING_KEY_FILE,
    $AUTOTUNE_SIGNING_KEY): (True, "unsigned: ...") for a whole cache (nothing read) or an intact
    export. With a key: (True, "verified (...)") only for an export file whose checksum matches
    its rows and whose signature is that key's; otherwise (False, one-line reason), and the caller
    serves the designated defaults, never a row of that file. Never raises."""
    try:
        key = key if key is not None else load_key(environ=environ)
    except CacheError as e:
        return False, f"signing key not usable: {e}"
    unsigned = "unsigned: no signing key configured"
    try:
        if isinstance(source, Store):
            if key is None and source.meta().get("checksum") is None:
                return True, unsigned          # a whole cache, not an export: nothing to check
            exp = read_store(source)           # an export's checksum is checked with or without a key
        else:
            u = parse(to_url(source))
            path = sqlite_file(u) if is_sqlite(u) else None
            if path is None:
                if key is None:
                    return True, unsigned
                return False, f"{u.render_as_string(hide_password=True)} is not an export file: it cannot be signed"
            exp = read(path)
        return True, (unsigned if key is None else verify(exp, key))
    except CacheError as e:
        return False, str(e)
    except Exception as e:  # noqa: BLE001 - a damaged file must not take the serving process down
        return False, f"cannot verify {source}: {type(e).__name__}: {e}"
