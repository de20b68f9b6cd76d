"""Structural checks of stored rows: one validator for every reader (dispatch, import, export,
`autotune show`, `autotune report`), so a damaged or hostile row is skipped everywhere for the same
named reason and never reaches a division, a comparison or a kernel.

Structural means: types, ranges and keys, decidable from the row alone. Whether the family is
known, its parameters valid and its verdict fine on the live arch is the family's question
(`autotune.tactics.registry.usable` / `registry.validate`), passed in by the layers above as a callable:
the cache never imports families.

Reasons (stable strings, counted by the readers):
  malformed winner / malformed trial   a field of the wrong type or missing
  unknown tactic                       the tactic row it refers to is missing
  malformed tactic                     its tactic parameters are not a tactic
  tactic does not match its id         id (or family column) differs from the parameters' hash
  bad bucket                           not an int in 1..MAX_BUCKET (0 only for a trial "rejected" on every bucket)
  bad problem key                      does not parse as a Problem or LayerProblem key
  bad device key / bad lib key         not 16 lowercase hex digits (the hash length of core.env)
  bad default tactic id                not 16 lowercase hex digits
  bad median_us / bad default_median_us / bad iqr_us / bad rel_err ...   not finite, out of range
  bad speedup                          not default_median_us / median_us (or set without a default time)
  bad status                           not one of ok, rejected, failed, dropped
  bad m / bad count                    a recorded miss's M or count is not a positive int
"""
from __future__ import annotations

import math
import re
from typing import Any

from autotune.core.env import Env
from autotune.core.layer import parse_key
from autotune.core.records import Miss, Trial, Winner
from autotune.core.tactic import Tactic

from autotune.cache.columns import TRIAL, WINNER

#: a timing above this (µs, 1000 s per call) is not a measurement: the search kills a tactic
#: that runs past --timeout-s (300 s by default) long before it could record one.
MAX_US = 1e9
#: M is an int32 in every kernel launch.
MAX_BUCKET = 2**31 - 1
STATUSES = ("ok", "rejected", "failed", "dropped")
ALL_BUCKETS = 0            # the bucket of a verdict that holds for every M (engine.search.ALL_BUCKETS)
_HEX16 = re.compile(r"[0-9a-f]{16}")
_SPEEDUP_RTOL = 1e-6
# the text columns of the first form, and the tactic's parameters (a later column has its own check)
_WINNER_TEXT = tuple(c.name for c in WINNER if c.text and c.required) + ("params_json",)
_TRIAL_TEXT = tuple(c.name for c in TRIAL if c.text and c.required) + ("params_json",)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def timing_ok(v: Any) -> bool:
    """A measured time in µs: a finite number in (0, MAX_US]."""
    return _real(v) and 0 < v <= MAX_US


def _hex16(v: Any) -> bool:
    return isinstance(v, str) and _HEX16.fullmatch(v) is not None


def _tactic(params_json: Any, tactic_id: Any, family: Any) -> str | None:
    if params_json == "" or params_json is None:
        return "unknown tactic"
    try:
        t = Tactic.from_json(params_json)
    except (ValueError, TypeError, AttributeError):
        return "malformed tactic"
    if t.id != tactic_id or t.family != family:
        return "tactic does not match its id"
    return None


def _problem_key(key: str) -> str | None:
    try:
        parse_key(key)
    except (ValueError, TypeError):
        return "bad problem key"
    return None


def _code_key_ok(k) -> bool:
    """A code key: 16 hex digits, or '' for a row stored before code keys (readable, never served)."""
    return k == "" or _hex16(k)


def check_winner(w: Winner) -> str | None:
    """Why the winner row `w` is structurally unusable (a reason from the module doc), or None.
    Never raises, whatever the field types are (rows come from files anyone can edit)."""
    try:
        if not all(isinstance(getattr(w, k), str) for k in _WINNER_TEXT):
            return "malformed winner"
        bucket, med, dmed, speedup = w.bucket, w.median_us, w.default_median_us, w.speedup
    except AttributeError:
        return "malformed winner"
    why = _tactic(w.params_json, w.tactic_id, w.family)
    if why:
        return why
    if not _int(bucket) or not 1 <= bucket <= MAX_BUCKET:
        return "bad bucket"
    why = _problem_key(w.problem_key)
    if why:
        return why
    if not _hex16(w.device_key):
        return "bad device key"
    if not _hex16(w.lib_key):
        return "bad lib key"
    if not _code_key_ok(getattr(w, "code_key", "")):
        return "bad code key"
    if not _hex16(w.default_tactic_id):
        return "bad default tactic id"
    if not isinstance(getattr(w, "predicted", False), bool):
        return "bad predicted"
    if not timing_ok(med):
        return "bad median_us"
    if dmed is not None and not timing_ok(dmed):
        return "bad default_median_us"
    if dmed is None:
        return None if speedup is None else "bad speedup"
    if not _real(speedup) or abs(speedup - dmed / med) > _SPEEDUP_RTOL * (dmed / med):
        return "bad speedup"
    return None


def check_trial(t: Trial) -> str | None:
    """Why the trial row `t` is structurally unusable (a reason from the module doc), or None."""
    try:
        if not all(isinstance(getattr(t, k), str) for k in _TRIAL_TEXT):
            return "malformed trial"
        status, bucket = t.status, t.bucket
        nums = (t.median_us, t.iqr_us, t.reps, t.rel_err, t.smem_model, t.smem_compiled, t.exit_signal)
    except AttributeError:
        return "malformed trial"
    if status not in STATUSES:
        return "bad status"
    why = _tactic(t.params_json, t.tactic_id, t.family)
    if why:
        return why
    lowest = ALL_BUCKETS if status == "rejected" else 1
    if not _int(bucket) or not lowest <= bucket <= MAX_BUCKET:
        return "bad bucket"
    why = _problem_key(t.problem_key)
    if why:
        return why
    if not _hex16(t.device_key):
        return "bad device key"
    if not _hex16(t.lib_key):
        return "bad lib key"
    if not _code_key_ok(getattr(t, "code_key", "")):
        return "bad code key"
    med, iqr, reps, rel_err, smem_model, smem_compiled, sig = nums
    if (status == "ok" or med is not None) and not timing_ok(med):
        return "bad median_us"
    if iqr is not None and not (_real(iqr) and 0 <= iqr <= MAX_US):
        return "bad iqr_us"
    if reps is not None and not (_int(reps) and reps >= 0):
        return "bad reps"
    if rel_err is not None and not (_real(rel_err) and rel_err >= 0):
        return "bad rel_err"
    for name, v in (("smem_model", smem_model), ("smem_compiled", smem_compiled)):
        if v is not None and not (_int(v) and v >= 0):
            return f"bad {name}"
    if sig is not None and not _int(sig):
        return "bad exit_signal"
    return None


def check_miss(m: Miss) -> str | None:
    """Why a recorded miss is unusable: M and count positive ints, keys of the right form."""
    try:
        key, mm, dev, count = m.problem_key, m.m, m.device_key, m.count
    except AttributeError:
        return "malformed miss"
    if not isinstance(key, str) or _problem_key(key):
        return "bad problem key"
    if not _int(mm) or not 1 <= mm <= MAX_BUCKET:
        return "bad m"
    if not _hex16(dev):
        return "bad device key"
    if not _int(count) or count < 1:
        return "bad count"
    return None


def check_device(rec: Any, device_key: str) -> str | None:
    """Why a device record does not belong to `device_key` (its identity fields must hash to it)."""
    try:
        ok = isinstance(rec, dict) and isinstance(rec["gpu_name"], str) and isinstance(rec["cc"], str) \
            and _int(rec["sm_count"]) and Env(rec["gpu_name"], rec["cc"], rec["sm_count"], "cuda").device_key == device_key
    except (KeyError, TypeError, ValueError):
        ok = False
    return None if ok else "device record does not match its key"


def check_libset(versions: Any, lib_key: str) -> str | None:
    """Why a libset ({dist: version or None}) does not belong to `lib_key`."""
    if not isinstance(versions, dict):
        return "unknown libset"
    if not all(isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in versions.items()):
        return "malformed libset"
    try:
        env = Env("", "", 0, "", cublas=versions.get("cublas"),
                  libs=tuple((k, v) for k, v in versions.items() if k != "cublas"))
        ok = env.lib_key(tuple(versions)) == lib_key
    except (TypeError, ValueError):
        ok = False
    return None if ok else "libset does not match its key"
