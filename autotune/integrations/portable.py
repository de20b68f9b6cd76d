"""Export winners to a self-contained file and import them back, validating every entry.

Two forms, told apart by content on import:
  * sqlite: a fresh cache database holding only the exported rows, plus `meta` rows
    (format, schema, checksum of the payload);
  * json: {"format": "fp4-autotune-cache", "schema": 1, "winners": [...], "tactics": [...],
    "problems": [...], "devices": [...], "libsets": [...], "checksum": sha256(canonical payload)}.
Nothing is ever unpickled or evaluated; an entry that fails a check is skipped and counted.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Winner
from autotune.core.tactic import Tactic, canonical_json

from cache.schema import SCHEMA_VERSION, Meta
from cache.store import SQLITE_MAGIC, CacheError, Store, _upsert

FORMAT = "fp4-autotune-cache"
_KINDS = ("winners", "tactics", "problems", "devices", "libsets")


@dataclass
class ImportReport:
    imported: int = 0
    skipped: dict[str, int] = field(default_factory=dict)   # reason -> count

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def _checksum(payload: dict) -> str:
    try:
        return hashlib.sha256(canonical_json(payload).encode()).hexdigest()
    except (TypeError, ValueError) as e:
        raise CacheError(f"export payload is not canonical JSON: {e}") from None


def _select_devices(devices: list[dict], gpu: str) -> set[str]:
    g = gpu.strip().lower()
    exact = {d["device_key"] for d in devices if d.get("gpu_name", "").lower() == g or d["device_key"] == gpu}
    if exact:
        return exact
    sub = {d["device_key"] for d in devices if g in d.get("gpu_name", "").lower()}
    if not sub:
        names = sorted({d.get("gpu_name", "?") for d in devices})
        raise CacheError(f"no device in the cache matches GPU {gpu!r} (known: {', '.join(names) or 'none'})")
    return sub


def _devices(store: Store) -> dict[str, dict]:
    """Device records by key; a damaged record is left out (its winners skip as 'unknown device')."""
    from sqlalchemy import select

    from cache.schema import DeviceRow
    out = {}
    for key, rec in store._read(lambda s: s.execute(select(DeviceRow.device_key, DeviceRow.record_json)).all()):
        try:
            d = json.loads(rec)
        except (TypeError, ValueError):
            continue
        if isinstance(d, dict) and d.get("device_key") == key:
            out[key] = d
    return out


def _payload(store: Store, gpu: str | None = None, problem_keys: Iterable[str] | None = None) -> dict:
    devices = _devices(store)
    winners = store.winners()
    if gpu:
        keys = _select_devices(list(devices.values()), gpu)
        winners = [w for w in winners if w.device_key in keys]
    if problem_keys is not None:
        pk = set(problem_keys)
        winners = [w for w in winners if w.problem_key in pk]
    tactics, problems, libsets = {}, {}, {}
    for w in winners:
        try:
            t = Tactic.from_json(w.params_json)
            tactics[w.tactic_id] = {"id": w.tactic_id, "family": t.family, "params": t.params}
        except (ValueError, TypeError):
            # a damaged row travels as it is; the import skips it ("malformed tactic")
            tactics[w.tactic_id] = {"id": w.tactic_id, "family": w.family, "params": str(w.params_json)}
        try:
            problems[w.problem_key] = {"key": w.problem_key, **Problem.from_key(w.problem_key).to_dict()}
        except (ValueError, TypeError):
            pass
        if w.lib_key not in libsets:
            try:
                v = store.libset(w.lib_key)
            except ValueError:          # damaged versions_json: the entry is skipped on import
                v = None
            if v is not None:
                libsets[w.lib_key] = {"lib_key": w.lib_key, "versions": v}
    wl = []
    for w in winners:
        d = asdict(w)
        del d["params_json"]
        wl.append(d)
    dev_keys = {w.device_key for w in winners}
    return {"format": FORMAT, "schema": SCHEMA_VERSION,
            "winners": wl,
            "tactics": [tactics[k] for k in sorted(tactics)],
            "problems": [problems[k] for k in sorted(problems)],
            "devices": [devices[k] for k in sorted(dev_keys) if k in devices],
            "libsets": [libsets[k] for k in sorted(libsets)]}


def export_cache(store: Store, out: str | os.PathLike, *, gpu: str | None = None,
                 problem_keys: Iterable[str] | None = None, fmt: str = "sqlite") -> int:
    """Write the selected winners (and the rows they need) to a new file; return how many."""
    if fmt not in ("sqlite", "json"):
        raise CacheError(f"export format must be 'sqlite' or 'json', got {fmt!r}")
    out = Path(os.path.abspath(os.path.expanduser(os.fspath(out))))
    if out.exists():
        raise CacheError(f"refusing to overwrite {out}")
    if not out.parent.is_dir():
        raise CacheError(f"cannot export to {out}: {out.parent} is not a directory")
    payload = _payload(store, gpu, problem_keys)
    digest = _checksum(payload)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise CacheError(f"cannot export to {out}: {e.strerror or e}") from None
    tmp = Path(tmp_name)
    try:
        if fmt == "json":
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({**payload, "checksum": digest}, f, sort_keys=True, indent=1, allow_nan=False)
                f.flush()
                os.fsync(f.fileno())
        else:
            os.close(fd)
            _write_sqlite(tmp, payload, digest)
        try:
            os.link(tmp, out)           # atomic and never clobbers a file that appeared meanwhile
        except FileExistsError:
            raise CacheError(f"refusing to overwrite {out}") from None
        except OSError:
            if out.exists():
                raise CacheError(f"refusing to overwrite {out}") from None
            os.replace(tmp, out)
    finally:
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm"), Path(f"{tmp}-journal")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass
    return len(payload["winners"])


def _write_sqlite(path: Path, payload: dict, digest: str) -> None:
    dst = Store(path)
    try:
        ok = _apply(dst, payload, None)
        if ok.skipped:
            raise CacheError(f"export would drop entries: {ok.skipped}")

        def meta(s):
            for k, v in (("format", FORMAT), ("schema", str(SCHEMA_VERSION)), ("checksum", digest),
                         ("winners", str(len(payload["winners"])))):
                _upsert(s, Meta, {"key": k, "value": v}, ["key"])
        dst._write(meta)
        with dst.engine.connect() as c:  # one self-contained file, no -wal beside it
            c.exec_driver_sql("PRAGMA journal_mode=DELETE")
    finally:
        dst.close()


def _read_export(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise CacheError(f"cannot read {path}: {e.strerror or e}") from None
    if head.startswith(SQLITE_MAGIC):
        src = Store(path, readonly=True)
        try:
            payload = _payload(src)
            want = src._meta().get("checksum")
        finally:
            src.close()
        if want is not None and want != _checksum(payload):
            raise CacheError(f"{path}: checksum mismatch, the export was modified or is damaged")
        return payload
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise CacheError(f"{path} is not an fp4-autotune export: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CacheError(f"{path} is not an fp4-autotune export: no format {FORMAT!r}")
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise CacheError(f"{path} was written by a newer fp4-autotune (schema {schema} > supported {SCHEMA_VERSION})")
    payload = {k: v for k, v in doc.items() if k != "checksum"}
    if doc.get("checksum") != _checksum(payload):
        raise CacheError(f"{path}: checksum mismatch, the export was modified or is damaged")
    for k in _KINDS:
        if not isinstance(payload.get(k, []), list):
            raise CacheError(f"{path} is not an fp4-autotune export: {k!r} is not a list")
    return payload


def _num(v: Any, optional: bool = False) -> bool:
    return (v is None and optional) or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _winner(e: Any, params_json: str) -> Winner:
    if not isinstance(e, dict):
        raise ValueError
    strs = ("problem_key", "device_key", "tactic_id", "family", "lib_key", "default_tactic_id")
    b = e.get("bucket")
    if not isinstance(b, int) or isinstance(b, bool) or b <= 0:
        raise ValueError
    if not all(isinstance(e.get(k), str) for k in strs) \
            or not _num(e.get("median_us")) or not _num(e.get("default_median_us"), True) \
            or not _num(e.get("speedup"), True):
        raise ValueError
    return Winner(e["problem_key"], e["bucket"], e["device_key"], e["tactic_id"], e["family"], params_json,
                  e["lib_key"], e["median_us"], e["default_tactic_id"], e["default_median_us"], e["speedup"])


def _index(items: Any, key: str) -> dict[str, dict]:
    return {d[key]: d for d in items or [] if isinstance(d, dict) and isinstance(d.get(key), str)}


def _apply(store: Store, payload: dict, validate: Callable[[str, dict], str | None] | None) -> ImportReport:
    rep = ImportReport()
    tactics = _index(payload.get("tactics"), "id")
    devices = _index(payload.get("devices"), "device_key")
    libsets = _index(payload.get("libsets"), "lib_key")
    accepted: list[tuple[Winner, dict, dict]] = []
    for e in payload.get("winners") or []:
        if not isinstance(e, dict):
            rep.skip("malformed winner")
            continue
        tid = e.get("tactic_id")
        t = tactics.get(tid) if isinstance(tid, str) else None
        if t is None:
            rep.skip("unknown tactic")
            continue
        try:
            tac = Tactic(t["family"], t["params"])
        except (KeyError, TypeError, ValueError):
            rep.skip("malformed tactic")
            continue
        if tac.id != tid:
            rep.skip("tactic does not match its id")
            continue
        try:
            w = _winner(e, tac.to_json())
        except ValueError:
            rep.skip("malformed winner")
            continue
        if w.family != tac.family:
            rep.skip("family mismatch")
            continue
        try:
            Problem.from_key(w.problem_key)
        except ValueError:
            rep.skip("bad problem key")
            continue
        dev = devices.get(w.device_key)
        if dev is None:
            rep.skip("unknown device")
            continue
        try:
            same = isinstance(dev["gpu_name"], str) and isinstance(dev["cc"], str) \
                and isinstance(dev["sm_count"], int) and not isinstance(dev["sm_count"], bool) \
                and Env(dev["gpu_name"], dev["cc"], dev["sm_count"], "cuda").device_key == w.device_key
        except (KeyError, TypeError, ValueError):
            same = False
        if not same:
            rep.skip("device record does not match its key")
            continue
        lib = libsets.get(w.lib_key)
        versions = lib.get("versions") if lib else None
        if not isinstance(versions, dict):
            rep.skip("unknown libset")
            continue
        if not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in versions.items()):
            rep.skip("malformed libset")
            continue
        try:
            env = Env("", "", 0, "", cublas=versions.get("cublas"),
                      libs=tuple((k, v) for k, v in versions.items() if k != "cublas"))
            same = env.lib_key(tuple(versions)) == w.lib_key
        except (TypeError, ValueError):
            same = False
        if not same:
            rep.skip("libset does not match its key")
            continue
        if validate is not None:
            try:
                why = validate(tac.family, tac.params)
            except Exception as ex:  # a broken validator must not abort the import
                why = f"validator error: {type(ex).__name__}"
            if why:
                rep.skip(str(why))
                continue
        accepted.append((w, dev, versions))

    def write(s) -> None:
        from cache.schema import LibsetRow
        for w, dev, versions in accepted:
            store._put_device_record(s, dev)
            _upsert(s, LibsetRow, {"lib_key": w.lib_key, "versions_json": canonical_json(versions)},
                    ["lib_key"], "ignore")
            store._put_winner(s, w)
    if accepted:
        store._write(write)
    rep.imported = len(accepted)
    return rep


def import_cache(store: Store, path: str | os.PathLike, *,
                 validate: Callable[[str, dict], str | None] | None = None) -> ImportReport:
    """Import the winners of an export (either form) or of another cache file, entry by entry."""
    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not p.is_file():
        raise CacheError(f"no export at {p}")
    return _apply(store, _read_export(p), validate)


# ------------------------------------------------------------------------------------ merge

@dataclass
class MergeReport:
    written: int = 0
    replaced: int = 0                                        # same (problem, bucket, device) in a later file
    per_file: dict[str, ImportReport] = field(default_factory=dict)


def merge_exports(paths: Iterable[str | os.PathLike], out: str | os.PathLike, *, fmt: str = "sqlite",
                  validate: Callable[[str, dict], str | None] | None = None) -> MergeReport:
    """Combine exports (or whole caches) into one new export. Every file goes through the same
    checks as an import (checksum, schema, each entry); for the same (problem, bucket, device)
    the later file wins and is counted in `replaced`."""
    rep = MergeReport()
    mem = Store("sqlite://")
    try:
        for p in paths:
            before = {(w.problem_key, w.bucket, w.device_key) for w in mem.winners()}
            r = import_cache(mem, p, validate=validate)
            rep.per_file[os.fspath(p)] = r
            after = {(w.problem_key, w.bucket, w.device_key) for w in mem.winners()}
            rep.replaced += r.imported - len(after - before)
        rep.written = export_cache(mem, out, fmt=fmt)
    finally:
        mem.close()
    return rep


# ------------------------------------------------------------------------------------ prune

@dataclass
class PruneReport:
    trials: int = 0
    winners: int = 0
    misses: int = 0
    devices: int = 0


def prune(store: Store, *, keep_devices: set[str] | None = None, drop_devices: set[str] = frozenset(),
          stale_libs: Env | None = None, drop_misses: bool = False, dry_run: bool = False) -> PruneReport:
    """Drop trials, winners and misses of environments no longer wanted.

    keep_devices: device keys to keep (everything else goes); drop_devices: device keys to drop;
    stale_libs: an Env whose device keeps only rows measured under its current library versions
    (per family); drop_misses: also clear recorded misses of the kept devices.
    """
    from sqlalchemy import and_, delete, func, not_, or_, select, true

    from cache.schema import DeviceRow, MissRow, TrialRow, WinnerRow
    from tactics import registry

    def cond(table):
        parts = []
        if keep_devices is not None:
            parts.append(not_(table.device_key.in_(sorted(keep_devices))))
        if drop_devices:
            parts.append(table.device_key.in_(sorted(drop_devices)))
        if stale_libs is not None and hasattr(table, "lib_key"):
            fams = {f for (f,) in store._read(lambda s: s.execute(select(table.family).distinct()).all())}
            for f in fams:
                try:
                    want = stale_libs.lib_key(registry.get(f).depends_on)
                except (ValueError, ImportError):
                    want = None                       # a family this install does not know: stale
                parts.append(and_(table.device_key == stale_libs.device_key, table.family == f,
                                  table.lib_key != want) if want else
                             and_(table.device_key == stale_libs.device_key, table.family == f))
        if drop_misses and table is MissRow:
            parts.append(true())
        return or_(*parts) if parts else None

    rep = PruneReport()
    plan = [(t, cond(t)) for t in (TrialRow, WinnerRow, MissRow)]
    dev_cond = None
    if keep_devices is not None or drop_devices:
        dev_cond = or_(*([not_(DeviceRow.device_key.in_(sorted(keep_devices)))] if keep_devices is not None else [])
                       + ([DeviceRow.device_key.in_(sorted(drop_devices))] if drop_devices else []))
    counts = {}
    for t, c in plan + [(DeviceRow, dev_cond)]:
        counts[t] = 0 if c is None else store._read(lambda s, t=t, c=c: s.execute(
            select(func.count()).select_from(t).where(c)).scalar())
    rep.trials, rep.winners, rep.misses, rep.devices = (counts[TrialRow], counts[WinnerRow], counts[MissRow],
                                                        counts[DeviceRow])
    if dry_run or not any(counts.values()):
        return rep

    def go(s) -> None:
        for t, c in plan + [(DeviceRow, dev_cond)]:
            if c is not None:
                s.execute(delete(t).where(c))
    store._write(go)
    return rep
