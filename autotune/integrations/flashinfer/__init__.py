"""`autotune cache export --format flashinfer`: our `cutlass` winners as FlashInfer's own
autotuner cache file (read by AutoTuner.load_configs / autotune(cache=...)) plus a
FLASHINFER_TACTICS_BLOCKLIST file of the tactics our verdicts rejected or our trials saw fail.

For each dense NVFP4 problem with cutlass winners on the chosen GPU, one entry per FlashInfer M
bucket (keys.m_bucket) holds the tactic we measured best at that bucket's M: the entry FlashInfer
would have written after profiling that shape itself. Where our buckets and FlashInfer's split M
differently the picks can differ inside a FlashInfer bucket; `differences` lists those M ranges.

A tactic in the blocklist (FlashInfer applies it only to what it profiles, never to file hits) is
never written, for any shape. A bucket whose winner is left out gets that bucket's best measured
tactic that is neither blocklisted nor failed; failing that, no entry, so FlashInfer falls back to
-1, after checking that -1 runs a kernel outside the blocklist in every supported release (else the
export is refused). A neighbouring bucket's winner is never written in its place.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from autotune.core.arch import arch_for_cc
from autotune.core.buckets import Buckets
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic
from autotune.integrations.flashinfer import keys as K
from autotune.tactics.cutlass import flashinfer_map as fim
from autotune.tactics.cutlass.candidates import Kernel
from autotune.tactics.cutlass.family import CutlassFamily, kernel_arch_for

SUPPORTED_VERSIONS: tuple[str, ...] = tuple(fim.VERSIONS)
FAMILY = "cutlass"
#: a bucket with no entry: FlashInfer's own fallback (-1) serves it
FALLBACK = -1


class ExportError(ValueError):
    """A refused export, with a one-line message fit for the user."""


@dataclass(frozen=True)
class Difference:
    """An M range inside one FlashInfer bucket where our bucket picks another tactic."""

    problem_key: str
    m_lo: int
    m_hi: int
    fi_bucket: int
    ours: int          # FlashInfer tactic integer our runtime dispatch would run
    flashinfer: int    # the one FlashInfer serves from the exported entry
    note: str = ""


@dataclass
class FlashInferExport:
    cache_path: Path
    blocklist_path: Path
    version: str
    gpu_name: str
    device_key: str
    problems: list[str] = field(default_factory=list)
    entries: int = 0
    blocked: dict[int, str] = field(default_factory=dict)   # tactic -> why
    differences: list[Difference] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    measured_with: dict[str, int] = field(default_factory=dict)   # flashinfer release -> winners
    predicted_left: int = 0          # predicted winners (never timed) left out: no include_predicted


# ------------------------------------------------------------------------------------ selection

def _device(store, gpu: str) -> dict:
    """The one device record `gpu` names (a GPU name, a unique part of one, or a device key)."""
    devs = store.devices()
    g = gpu.strip().lower()
    hit = [d for d in devs if d["device_key"] == gpu or d.get("gpu_name", "").lower() == g]
    hit = hit or [d for d in devs if g and g in d.get("gpu_name", "").lower()]
    if not hit:
        known = ", ".join(sorted({d.get("gpu_name", "?") for d in devs})) or "none"
        raise ExportError(f"no GPU in the cache matches {gpu!r} (known: {known})")
    if len(hit) > 1:
        raise ExportError(f"{gpu!r} matches {len(hit)} GPU identities ({', '.join(d['device_key'] for d in hit)}); "
                          f"pass a device key")
    return hit[0]


def _kernel_arch(dev: dict) -> tuple[str, object]:
    try:
        major, minor = (int(x) for x in str(dev.get("cc", "")).split("."))
        arch = arch_for_cc(major, minor)
    except ValueError:
        raise ExportError(f"{dev.get('gpu_name')} (cc {dev.get('cc')}) is not a GPU FlashInfer's CUTLASS "
                          f"FP4 GEMM runs on") from None
    ka = kernel_arch_for(arch)
    if ka is None:
        raise ExportError(f"{dev.get('gpu_name')} (cc {dev.get('cc')}): FlashInfer's mm_fp4 CUTLASS runner "
                          f"has no tactic list for it")
    return ka, arch


def _exportable(problem: Problem) -> str | None:
    if problem.kind != "dense":
        return "grouped MoE: FlashInfer's fused-MoE runner tunes a whole MoE block, not this GEMM"
    if problem.w_fmt != "nvfp4" or problem.a_fmt not in ("bf16", "nvfp4"):
        return f"{problem.a_fmt} x {problem.w_fmt}: mm_fp4's CUTLASS runner is keyed here for NVFP4 only"
    return None


def _measured_with(store, lib_key: str) -> str:
    libs = store.libset(lib_key) or {}
    return str(libs.get("flashinfer-python") or "unknown")


# ----------------------------------------------------------------------------------- the export

def export_flashinfer(store, out: str | os.PathLike, *, gpu: str, version: str | None = None,
                      metadata: dict[str, str] | None = None, from_env: bool = False,
                      problem_keys: Iterable[str] | None = None,
                      blocklist: str | os.PathLike | None = None,
                      include_predicted: bool = False) -> FlashInferExport:
    """Write FlashInfer's cache file to `out` and its tactic blocklist beside it (or to `blocklist`).

    version: the flashinfer-python release the file is for (with from_env: the installed one,
    which `version` must then equal). metadata: the fields FlashInfer's loader compares
    (keys.META_FIELDS; flashinfer_version and gpu default to the release and the winners' GPU),
    unless from_env. problem_keys: only these problems (a model's). Predicted winners (`--strategy
    predict`: checked, never timed) are left out, and counted, unless `include_predicted`.
    """
    meta = _given_metadata(metadata, from_env)
    release = _release(version or meta.get("flashinfer_version"))
    dev = _device(store, gpu)
    winners, left = _winners(store, dev, problem_keys, include_predicted)
    _complete_metadata(meta, release.version, dev["gpu_name"], from_env)
    kernel_arch, arch = _kernel_arch(dev)
    out, bl = _out_paths(out, blocklist)
    rep = FlashInferExport(out, bl, release.version, dev["gpu_name"], dev["device_key"], predicted_left=left)
    configs = _file_entries(store, rep, winners, arch, kernel_arch)
    _write_files(rep, meta, configs)
    return rep


def _given_metadata(metadata: dict[str, str] | None, from_env: bool) -> dict[str, str]:
    """A copy of the metadata fields given, or with from_env this environment's."""
    if from_env and metadata:
        raise ExportError("give either metadata fields or --metadata-from-env, not both")
    try:
        return K.metadata_from_env() if from_env else dict(metadata or {})
    except ValueError as e:
        raise ExportError(str(e)) from None


def _release(version: str | None) -> fim.FlashInferRelease:
    """The supported FlashInfer release `version` names."""
    if not version:
        raise ExportError(f"name the FlashInfer release ({', '.join(SUPPORTED_VERSIONS)})")
    try:
        return fim.release(version)
    except ValueError as e:
        raise ExportError(str(e)) from None


def _winners(store, dev: dict, problem_keys: Iterable[str] | None,
             include_predicted: bool) -> tuple[list[Winner], int]:
    """This GPU's cutlass winners to export (of `problem_keys` only, when given) and how many
    predicted ones (never timed) are left out; none to export is an ExportError."""
    wanted = set(problem_keys) if problem_keys is not None else None
    every = [w for w in store.winners(dev["device_key"]) if w.family == FAMILY
             and (wanted is None or w.problem_key in wanted)]
    winners = [w for w in every if include_predicted or not w.predicted]
    left = len(every) - len(winners)
    if not winners:
        scope = " for that model" if wanted is not None else ""
        why = f" ({left} predicted, never timed, left out: --include-predicted exports them)" if left else ""
        raise ExportError(f"no cutlass winners for {dev['gpu_name']} ({dev['device_key']}){scope} in {store!r}{why}")
    return winners, left


def _complete_metadata(meta: dict[str, str], version: str, gpu_name: str, from_env: bool) -> None:
    """Fill in (unless from_env) the two fields the release and the GPU fix, then check every field
    FlashInfer's loader compares; a given value is still checked."""
    if not from_env:
        meta.setdefault("flashinfer_version", version)
        meta.setdefault("gpu", gpu_name)
    why = K.check_metadata(meta, version, gpu_name)
    if why:
        raise ExportError(why + (" (this environment)" if from_env else ""))


def _out_paths(out: str | os.PathLike, blocklist: str | os.PathLike | None) -> tuple[Path, Path]:
    """The absolute paths of the cache file and its blocklist (default: beside it), refused if
    either exists or its directory does not."""
    out = Path(os.path.abspath(os.path.expanduser(os.fspath(out))))
    bl = Path(os.path.abspath(os.path.expanduser(os.fspath(blocklist)))) if blocklist else \
        out.with_name(out.stem + ".blocklist.json")
    for p in (out, bl):
        if p.exists():
            raise ExportError(f"refusing to overwrite {p}")
        if not p.parent.is_dir():
            raise ExportError(f"cannot write {p}: {p.parent} is not a directory")
    return out, bl


def _file_entries(store, rep: FlashInferExport, winners: list[Winner], arch,
                  kernel_arch: str) -> dict[str, list]:
    """The cache file's entries (file key -> [runner, tactic, policy]) for the exportable problems
    among `winners`; fills rep's blocked, skipped, measured_with, differences, problems and entries."""
    by_problem: dict[str, dict[int, Winner]] = {}
    for w in winners:
        by_problem.setdefault(w.problem_key, {})[w.bucket] = w
    failures = _trial_failures(store, rep.device_key, rep.version)
    exportable = _exportable_problems(by_problem, rep)
    # the blocklist is per op and runner: a tactic in it is never written, for any shape
    rep.blocked = _blocked(failures, arch, kernel_arch, rep.version, list(exportable.values()))
    measured = _measured(store, rep.device_key, rep.version, kernel_arch, set(exportable))
    fallback = _fallback(kernel_arch, rep.version, rep.blocked)
    configs: dict[str, list] = {}
    for pkey, problem in exportable.items():
        picks = _picks(store, rep, pkey, by_problem[pkey], measured, fallback, kernel_arch)
        if not picks:
            continue
        ours = Buckets(tuple(picks))
        top = max(picks)
        entries, written = _problem_entries(problem, picks, ours, top)
        configs.update(entries)
        rep.differences += _differences(pkey, picks, ours, top)
        if written:
            rep.problems.append(pkey)
            rep.entries += written
    if not configs:
        raise ExportError(f"no exportable cutlass winners for {rep.gpu_name}: " + "; ".join(rep.skipped[:3]))
    if {v[1] for v in configs.values()} & set(rep.blocked):      # never: picks skip every blocked tactic
        raise ExportError("internal: a blocklisted tactic reached the FlashInfer file; nothing written")
    return configs


def _exportable_problems(by_problem: dict[str, dict[int, Winner]], rep: FlashInferExport) -> dict[str, Problem]:
    """The problems (by key, sorted) FlashInfer's mm_fp4 runner serves; each other one is noted in
    rep.skipped."""
    exportable: dict[str, Problem] = {}
    for pkey in sorted(by_problem):
        problem = Problem.from_key(pkey)
        why = _exportable(problem)
        if why:
            rep.skipped.append(f"{pkey}: {why}")
        else:
            exportable[pkey] = problem
    return exportable


def _picks(store, rep: FlashInferExport, pkey: str, winners: dict[int, Winner],
           measured: dict[tuple[str, int], list[tuple[int, float, str]]], fallback: str | None,
           kernel_arch: str) -> dict[int, int]:
    """Our bucket -> the tactic written for it (FALLBACK: none written): the winner's, else the
    bucket's best measured tactic that is neither blocklisted nor failed, else FlashInfer's -1 when
    that runs no blocklisted kernel (else an ExportError). Counts measured_with, notes skipped."""
    picks: dict[int, int] = {}
    for b, w in sorted(winners.items()):
        kernel = Kernel.from_params(Tactic.from_json(w.params_json).params)
        idx = fim.to_index(kernel, rep.version) if kernel.kernel_arch == kernel_arch else None
        if idx is not None and idx not in rep.blocked:
            picks[b] = idx
            mw = _measured_with(store, w.lib_key)
            rep.measured_with[mw] = rep.measured_with.get(mw, 0) + 1
            continue
        why = (f"winner {w.tactic_id} is not in FlashInfer {rep.version}'s {kernel_arch} list"
               if idx is None else f"winner tactic {idx} is blocklisted ({rep.blocked[idx]})")
        alt = next((t for t in measured.get((pkey, b), ()) if t[0] not in rep.blocked), None)
        if alt is not None:
            picks[b] = alt[0]
            rep.measured_with[alt[2]] = rep.measured_with.get(alt[2], 0) + 1
            rep.skipped.append(f"{pkey} bucket {b}: {why}; written: tactic {alt[0]}, this bucket's best "
                               f"measured tactic ({alt[1]:.2f} us) that is neither blocklisted nor failed")
            continue
        if fallback is None:
            fb = ", ".join(f"{v}: tactic {i}" for v, i in _fallback_indices(kernel_arch))
            raise ExportError(f"{pkey} bucket {b}: {why}, no other measured tactic of that bucket is "
                              f"neither blocklisted nor failed, and FlashInfer's fallback -1 runs a "
                              f"blocklisted kernel ({fb}); nothing written")
        picks[b] = FALLBACK
        rep.skipped.append(f"{pkey} bucket {b}: {why}; not written: no other measured tactic of that bucket "
                           f"is neither blocklisted nor failed, so FlashInfer falls back to -1 ({fallback})")
    return picks


def _problem_entries(problem: Problem, picks: dict[int, int], ours: Buckets,
                     top: int) -> tuple[dict[str, list], int]:
    """One problem's file entries, each FlashInfer M bucket (up to the one holding our largest)
    with the tactic our bucket of its M picks, at every alpha shape, and how many buckets got one."""
    entries: dict[str, list] = {}
    written = 0
    for fb in sorted({K.m_bucket(m) for m in range(1, top + 1)}):
        tactic = picks[ours.bucket(min(fb, top))]
        if tactic == FALLBACK:
            continue
        written += 1
        for alpha in K.ALPHA_SHAPES:
            entries[K.file_key(K.nearest_profile(fb, problem.n, problem.k, alpha))] = [K.RUNNER, tactic, K.POLICY]
    return entries, written


def _write_files(rep: FlashInferExport, meta: dict[str, str], configs: dict[str, list]) -> None:
    """Write the cache file (metadata, entries by key, generation) and then the blocklist; a failed
    blocklist write removes the cache file again."""
    file_meta = {f: meta[f] for f in K.META_FIELDS}
    # extra fields are ignored by both loaders (they compare only the fields they collect)
    file_meta["fp4_autotune_device_key"] = rep.device_key
    file_meta["fp4_autotune_measured_with_flashinfer"] = ", ".join(sorted(rep.measured_with))
    ordered: dict = {K.META_KEY: file_meta}
    for k in sorted(configs):
        ordered[k] = configs[k]
    ordered[K.GENERATION_KEY] = K.generation(ordered)
    bl_doc = {K.META_KEY: {**file_meta, "generated_at": datetime.now(timezone.utc).isoformat(),
                           "generator_version": "1.0"},
              "invalid_tactics": {K.BLOCKLIST_KEY: sorted(rep.blocked)}}
    _write_json(rep.cache_path, ordered)
    try:
        _write_json(rep.blocklist_path, bl_doc)
    except BaseException:
        rep.cache_path.unlink(missing_ok=True)
        raise


def _differences(pkey: str, picks: dict[int, int], ours: Buckets, top: int) -> list[Difference]:
    """M ranges (1..FlashInfer's bucket of our largest) where FlashInfer serves another tactic than
    our dispatch would run; above our largest bucket ours is marked as extrapolated."""
    out: list[Difference] = []
    run: Difference | None = None
    for m in range(1, K.m_bucket(top) + 1):
        fb = K.m_bucket(m)
        mine, theirs = picks[ours.bucket(min(m, top))], picks[ours.bucket(min(fb, top))]
        note = "above our largest bucket" if m > top else ""
        if mine == theirs and not note:
            run = None
            continue
        if run and run.m_hi == m - 1 and (run.fi_bucket, run.ours, run.flashinfer, run.note) == (fb, mine, theirs, note):
            run = out[-1] = Difference(pkey, run.m_lo, m, fb, mine, theirs, note)
        else:
            run = Difference(pkey, m, m, fb, mine, theirs, note)
            out.append(run)
    return out


def _trial_failures(store, device_key: str, version: str) -> list[tuple[int, Trial]]:
    """(FlashInfer tactic, trial) for every stored trial of this GPU that rejected or failed a
    cutlass tactic of that release's list."""
    out = []
    for t in store.trials(device_key):
        if t.family != FAMILY or t.status not in ("rejected", "failed"):
            continue
        try:
            idx = fim.to_index(Kernel.from_params(Tactic.from_json(t.params_json).params), version)
        except (ValueError, TypeError, KeyError):
            continue
        if idx is not None:
            out.append((idx, t))
    return out


def _measured(store, device_key: str, version: str, kernel_arch: str,
              problems: set[str]) -> dict[tuple[str, int], list[tuple[int, float, str]]]:
    """(problem, bucket) -> (FlashInfer tactic, median us, flashinfer-python it was measured
    with) of every stored `ok` cutlass trial of this GPU with a time, fastest first."""
    out: dict[tuple[str, int], list[tuple[int, float, str]]] = {}
    for t in store.trials(device_key):
        if t.family != FAMILY or t.status != "ok" or t.median_us is None or t.problem_key not in problems:
            continue
        try:
            k = Kernel.from_params(Tactic.from_json(t.params_json).params)
        except (ValueError, TypeError, KeyError):
            continue
        idx = fim.to_index(k, version) if k.kernel_arch == kernel_arch else None
        if idx is not None:
            out.setdefault((t.problem_key, t.bucket), []).append((idx, float(t.median_us),
                                                                  _measured_with(store, t.lib_key)))
    for v in out.values():
        v.sort(key=lambda e: (e[1], e[0]))
    return out


def _fallback_indices(kernel_arch: str) -> list[tuple[str, int]]:
    """(release, the integer tactic its -1 launches on kernel_arch) for every supported release."""
    return [(v, K.fallback_index(kernel_arch, v)) for v in SUPPORTED_VERSIONS]


def _fallback(kernel_arch: str, version: str, blocked: dict[int, str]) -> str | None:
    """How FlashInfer's -1 resolves in each supported release when none of those kernels is
    blocklisted (as a phrase for the report), else None. The lists are compared kernel for kernel,
    so a release whose integers differed would still be checked by the kernel it runs."""
    lst = fim.configs(kernel_arch, version)
    for v, i in _fallback_indices(kernel_arch):
        if lst.index(fim.configs(kernel_arch, v)[i]) in blocked:
            return None
    return "tactic " + ", ".join(f"{i} in {v}" for v, i in _fallback_indices(kernel_arch)) + ", not blocklisted"


def _blocked(failures: list[tuple[int, Trial]], arch, kernel_arch: str, version: str,
             problems: list[Problem]) -> dict[int, str]:
    """FlashInfer tactics to block: our static verdict rejects them for these problems on this GPU,
    or a stored trial of this GPU was rejected or failed with them."""
    fam = CutlassFamily()
    out: dict[int, str] = {}
    for idx, k in enumerate(fim.configs(kernel_arch, version)):
        for p in problems:
            v = fam.verdict(p, Tactic(FAMILY, k.params()), arch)
            if v.rejected:
                out.setdefault(idx, f"verdict: {v.reason}")
    for idx, t in failures:
        out.setdefault(idx, f"trial {t.status} on {t.problem_key} bucket {t.bucket}: {t.reason}")
    return out


def _write_json(path: Path, doc: dict) -> None:
    """Write through a temporary file linked into place once complete: a full disk (ENOSPC) or
    any other write error leaves no file at `path` and is one ExportError line."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise ExportError(f"cannot write {path}: {e.strerror or e}; nothing written") from None
    try:
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=2)
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            raise ExportError(f"cannot write {path}: {e.strerror or e}; nothing written (no partial file "
                              "left)") from None
        try:
            os.link(tmp, path)        # never clobbers a file that appeared meanwhile
        except FileExistsError:
            raise ExportError(f"refusing to overwrite {path}") from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def render(rep: FlashInferExport, max_lines: int = 20) -> list[str]:
    """The CLI's summary lines."""
    lines = [f"wrote {rep.entries} FlashInfer {rep.version} bucket entries for {len(rep.problems)} problem(s) "
             f"on {rep.gpu_name} to {rep.cache_path}",
             f"blocklist of {len(rep.blocked)} tactic(s) to {rep.blocklist_path} "
             f"(FLASHINFER_TACTICS_BLOCKLIST={rep.blocklist_path})",
             "winners measured with flashinfer-python " +
             ", ".join(f"{v} ({n})" for v, n in sorted(rep.measured_with.items()))]
    if rep.predicted_left:
        lines.append(f"{rep.predicted_left} predicted winners (never timed) left out: --include-predicted exports them")
    if any(v != rep.version for v in rep.measured_with):
        lines.append(f"note: exported for {rep.version}; the SM120 tactic lists match, the kernel launch "
                     f"code differs ({fim.release(rep.version).template_note})")
    def name(t: int) -> str:
        return f"{t}" if t != FALLBACK else "-1 (its fallback: no entry written)"

    for d in rep.differences[:max_lines]:
        if d.note:
            lines.append(f"extrapolated: {d.problem_key} M {d.m_lo}-{d.m_hi} (FlashInfer bucket {d.fi_bucket}) "
                         f"gets tactic {name(d.flashinfer)}, the choice of our largest bucket ({d.note})")
        else:
            lines.append(f"differs: {d.problem_key} M {d.m_lo}-{d.m_hi} (FlashInfer bucket {d.fi_bucket}): "
                         f"our dispatch runs tactic {name(d.ours)}, FlashInfer {name(d.flashinfer)}")
    if len(rep.differences) > max_lines:
        lines.append(f"... {len(rep.differences) - max_lines} more ranges differ")
    lines += [f"skipped: {s}" for s in rep.skipped[:max_lines]]
    return lines
