"""Export winners to a self-contained file, import them back, merge exports: every entry checked.

The file format, its structural entry checks and signatures are the cache layer's
(autotune.cache.exportfile, autotune.cache.rows, autotune.cache.signing); this module adds what needs the families — the
`validate(family, params) -> reason | None` callable an import applies to every tactic (the CLI
passes autotune.tactics.registry.validate) — and the reports the CLI prints. Keys are explicit here:
`autotune.cache.signing.load_key(path)` reads a key file or the environment.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from autotune.core import winner as winner_rule
from autotune.core.records import Trial
from autotune.core.tactic import Tactic
from autotune.cache import exportfile
from autotune.cache.exportfile import Skips
from autotune.cache.files import CacheError
from autotune.cache.signing import SigningKey
from autotune.cache.store import Store

Validate = Callable[[str, dict], "str | None"]
_NAMES_SHOWN = 3


def _skip_text(skips: Skips) -> str:
    """'; skipped 2: bad bucket (p bucket 0 on …, …)' for every reason."""
    out = []
    for reason, n in skips.counts.items():
        rows = skips.rows.get(reason, [])
        more = f", and {len(rows) - _NAMES_SHOWN} more" if len(rows) > _NAMES_SHOWN else ""
        out.append(f"; skipped {n}: {reason} ({', '.join(rows[:_NAMES_SHOWN])}{more})")
    return "".join(out)


@dataclass
class ImportReport:
    imported: int = 0
    signature: str = "unsigned"
    skips: Skips = field(default_factory=Skips)
    stale_code: int = 0         # imported, but measured with other kernel code than this install's

    @property
    def skipped(self) -> dict[str, int]:
        """reason -> count"""
        return self.skips.counts

    def warning(self) -> str | None:
        """The one warning about imported winners this install will not serve, or None."""
        if not self.stale_code:
            return None
        from autotune.tactics import registry
        return (f"warning: {self.stale_code} imported winner(s) were measured with other kernel code than this "
                f"install's (code key mismatch): not served here; {registry.REFRESH}")

    def line(self) -> str:
        return f"imported {self.imported} winners{_skip_text(self.skips)} [{self.signature}]"


@dataclass
class ExportReport:
    written: int = 0
    signature: str = "unsigned"
    skips: Skips = field(default_factory=Skips)   # rows of the source that fail the row checks
    predicted_left: int = 0                       # predicted winners left out (no --include-predicted)

    @property
    def skipped(self) -> dict[str, int]:
        return self.skips.counts

    def line(self, out: str | os.PathLike) -> str:
        sig = self.signature if self.signature != "unsigned" else \
            "unsigned: give --sign-key or set $AUTOTUNE_SIGNING_KEY_FILE / $AUTOTUNE_SIGNING_KEY to sign"
        left = (f"; {self.predicted_left} predicted winners (never timed) left out: --include-predicted "
                "exports them" if self.predicted_left else "")
        return f"exported {self.written} winners to {os.fspath(out)}{_skip_text(self.skips)}{left} [{sig}]"


def _family_checked(entries: list[exportfile.Entry], validate: Validate | None, skips: Skips) -> list:
    if validate is None:
        return entries
    out = []
    for e in entries:
        t = Tactic.from_json(e.winner.params_json)
        try:
            why = validate(t.family, t.params)
        except Exception as ex:  # noqa: BLE001 - a broken validator must not abort the import
            why = f"validator error: {type(ex).__name__}"
        if why:
            skips.add(str(why), exportfile.row_name(e.winner))
        else:
            out.append(e)
    return out


def _one_per_key(entries: list[exportfile.Entry], skips: Skips) -> list[exportfile.Entry]:
    """One entry per (problem, bucket, device): duplicates go through the winner rule as if they
    were that key's trials (fastest beyond noise, the default kept within the margin, ties to the
    smaller id), so the result does not depend on the file's order."""
    groups: dict[tuple, list[exportfile.Entry]] = {}
    for e in entries:
        w = e.winner
        groups.setdefault((w.problem_key, w.bucket, w.device_key), []).append(e)
    out = []
    for group in groups.values():
        if len(group) == 1:
            out.append(group[0])
            continue
        trials = [Trial(w.problem_key, w.bucket, w.tactic_id, w.family, w.params_json, w.device_key, w.lib_key,
                        "ok", median_us=w.median_us) for w in (e.winner for e in group)]
        default = min(e.winner.default_tactic_id for e in group)
        pick = winner_rule.choose(trials, default)
        keep = min((e for e in group if (e.winner.tactic_id, e.winner.lib_key) == (pick.tactic_id, pick.lib_key)),
                   key=lambda e: (e.winner.median_us, e.winner.lib_key))
        out.append(keep)
        for e in group:
            if e is not keep:
                skips.add("duplicate winner, lost to the winner rule", exportfile.row_name(e.winner))
    return out


def export_cache(store: Store, out: str | os.PathLike, *, gpu: str | None = None,
                 problem_keys: Iterable[str] | None = None, fmt: str = "sqlite",
                 key: SigningKey | None = None, include_predicted: bool = False) -> ExportReport:
    """Write the selected winners (and the rows they need) to a new file, signed with `key` if
    given. Rows that fail the structural checks are left out and counted, so the file holds only
    rows an import accepts. Predicted winners (`--strategy predict`: checked, never timed) stay out
    unless `include_predicted`."""
    if fmt not in ("sqlite", "json"):
        raise CacheError(f"export format must be 'sqlite' or 'json', got {fmt!r}")
    out = Path(os.path.abspath(os.path.expanduser(os.fspath(out))))
    if out.exists():
        raise CacheError(f"refusing to overwrite {out}")
    if not out.parent.is_dir():
        raise CacheError(f"cannot export to {out}: {out.parent} is not a directory")
    rep = ExportReport()
    payload = exportfile.collect(store, gpu, problem_keys, include_predicted=include_predicted)
    if not include_predicted:
        rep.predicted_left = len(exportfile.collect(store, gpu, problem_keys, include_predicted=True)["winners"]) \
            - len(payload["winners"])
    good = exportfile.entries(payload, rep.skips)
    payload = exportfile.payload_of(good)
    signature = key.sign(exportfile.checksum(payload)) if key is not None else None
    rep.signature = f"signed ({key.describe()})" if key is not None else "unsigned"
    _write_export(out, fmt, payload, signature)
    rep.written = len(good)
    return rep


def _write_export(out: Path, fmt: str, payload: dict, signature: dict | None) -> None:
    """Write the export file through a temporary file beside it, linked into place once complete:
    a write error (a full disk, ENOSPC) leaves nothing, and a file that appeared at `out`
    meanwhile is never overwritten."""
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    except OSError as e:
        raise CacheError(f"cannot export to {out}: {e.strerror or e}") from None
    tmp = Path(tmp_name)
    try:
        try:
            if fmt == "json":
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    exportfile.write_json(f, payload, signature)
                    f.flush()
                    os.fsync(f.fileno())
            else:
                os.close(fd)
                exportfile.write_sqlite(tmp, payload, signature)
        except OSError as e:       # a full disk (ENOSPC) and the like: the temporary file goes below
            raise CacheError(f"cannot export to {out}: {e.strerror or e}; nothing written (no partial file "
                             "left)") from None
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


def import_cache(store: Store | Callable[[], Store], path: str | os.PathLike, *, validate: Validate | None = None,
                 key: SigningKey | None = None) -> ImportReport:
    """Import the winners of an export (either form) or of another cache file, entry by entry.

    With `key`, the file must carry that key's valid signature (else CacheError, nothing written).
    Every winner passes autotune.cache.rows.check_winner, its device and libset rows must match their keys,
    and `validate(family, params)` (if given) must accept its tactic; anything else is skipped,
    counted and named in the report. Two winners of one (problem, bucket, device) are resolved by
    the winner rule (autotune.core.winner), never by their order in the file; the loser is counted.
    All accepted rows are written in one transaction. `store` may be a callable opening the
    target: it is called only once the file passed its checks (a refused import creates nothing)."""
    p = Path(os.path.abspath(os.path.expanduser(os.fspath(path))))
    if not p.is_file():
        raise CacheError(f"no export at {p}")
    exp = exportfile.read(p)
    rep = ImportReport(signature=exportfile.verify(exp, key))
    good = _one_per_key(_family_checked(exportfile.entries(exp.payload, rep.skips), validate, rep.skips), rep.skips)
    if callable(store) and not hasattr(store, "put_winners"):
        store = store()
    store.put_winners([e.winner for e in good], [e.device for e in good],
                      {e.winner.lib_key: e.versions for e in good})
    rep.imported = len(good)
    if validate is not None:        # the families are loaded: judge each key against this code
        from autotune.tactics import registry
        rep.stale_code = sum(registry.stale_code(e.winner) is not None for e in good)
    return rep


@dataclass
class MergeReport:
    written: int = 0
    replaced: int = 0                                        # same (problem, bucket, device) in a later file
    per_file: dict[str, ImportReport] = field(default_factory=dict)
    signature: str = "unsigned"


def merge_exports(paths: Iterable[str | os.PathLike], out: str | os.PathLike, *, fmt: str = "sqlite",
                  validate: Validate | None = None, verify_key: SigningKey | None = None,
                  sign_key: SigningKey | None = None) -> MergeReport:
    """Combine exports (or whole caches) into one new export. Every file goes through the same
    checks as an import (checksum, signature when verify_key is given, each entry); for the same
    (problem, bucket, device) the later file wins and is counted in `replaced`."""
    rep = MergeReport()
    with Store("sqlite://") as mem:
        for p in paths:
            before = {(w.problem_key, w.bucket, w.device_key) for w in mem.winners()}
            r = import_cache(mem, p, validate=validate, key=verify_key)
            rep.per_file[os.fspath(p)] = r
            after = {(w.problem_key, w.bucket, w.device_key) for w in mem.winners()}
            rep.replaced += r.imported - len(after - before)
        ex = export_cache(mem, out, fmt=fmt, key=sign_key)
        rep.written, rep.signature = ex.written, ex.signature
    return rep
