"""Tactic and Verdict: the values every family, the engine, the runtime and the cache share.

A tactic is a frozen, JSON-serializable set of parameters plus the name of its family. Its
`id` is a hash of the canonical JSON, so it is stable across processes, machines and
releases as long as the parameters mean the same thing; it is never an index into a list.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from autotune.core import jsonread

Scalar = str | int | float | bool | None


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the form that ids are hashed from."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


@dataclass(frozen=True, order=True, init=False)
class Tactic:
    """One point of a family's space. `params` maps names to JSON scalars."""

    family: str
    items: tuple[tuple[str, Scalar], ...] = field(default=())

    def __init__(self, family: str, params: Mapping[str, Scalar] | None = None, **kw: Scalar):
        merged = dict(params or {}, **kw)
        for k, v in merged.items():
            if not isinstance(k, str) or not (v is None or isinstance(v, (str, int, float, bool))):
                raise TypeError(f"tactic parameter {k!r}={v!r} is not a JSON scalar")
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "items", tuple(sorted(merged.items())))

    @property
    def params(self) -> dict[str, Scalar]:
        return dict(self.items)

    def __getitem__(self, name: str) -> Scalar:
        for k, v in self.items:
            if k == name:
                return v
        raise KeyError(name)

    def get(self, name: str, default: Scalar = None) -> Scalar:
        try:
            return self[name]
        except KeyError:
            return default

    def to_json(self) -> str:
        return canonical_json({"family": self.family, "params": self.params})

    @classmethod
    def from_json(cls, text: str | Mapping[str, Any]) -> "Tactic":
        # bounded: a cache row's params may be hostile (deep nesting is a ValueError, not a RecursionError)
        d = jsonread.loads(text, "tactic parameters", max_bytes=1 << 20) if isinstance(text, str) else dict(text)
        if not isinstance(d.get("family"), str) or not isinstance(d.get("params"), dict):
            raise ValueError(f"not a tactic: {str(text)[:80]}")
        return cls(d["family"], d["params"])

    @property
    def id(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def __str__(self) -> str:
        inner = ",".join(f"{k}={v}" for k, v in self.items)
        return f"{self.family}[{inner}]"


#: how an unchecked verdict's reason starts (Verdict.unchecked)
UNKNOWN = "unknown:"


@dataclass(frozen=True)
class Verdict:
    """A static judgement made without compiling or launching.

    ok is True (keep), False (reject) or None (unknown until the family's library checks it on
    the device, e.g. cuBLASLt). `reason` is always set for a rejection or an unknown.
    """

    ok: bool | None
    reason: str = ""
    smem_bytes: int | None = None
    smem_limit: int | None = None
    stages: int | None = None

    @classmethod
    def keep(cls, smem: int | None = None, limit: int | None = None, stages: int | None = None) -> "Verdict":
        return cls(True, "", smem, limit, stages)

    @classmethod
    def reject(cls, reason: str, smem: int | None = None, limit: int | None = None,
               stages: int | None = None) -> "Verdict":
        return cls(False, reason, smem, limit, stages)

    @property
    def rejected(self) -> bool:
        return self.ok is False

    @property
    def unchecked(self) -> bool:
        """Unknown because no checked rule covers the tactic (outside the region a model was
        checked on, no compiler figure): not measured unless the search is told to. Unknowns that
        only the device can settle (cuBLASLt's algorithm check) are measured as usual."""
        return self.ok is None and self.reason.startswith(UNKNOWN)


#: what a schema entry may be: the allowed values, or a type every value must have
Allowed = tuple | type


def check_params(tactic: Tactic, schema: Mapping[str, Allowed], what: str) -> str | None:
    """None when `tactic` has exactly the parameters of `schema`, each allowed; else why not.

    The one "exactly these parameters" check every family uses (`what` names the member in the
    message, e.g. "triton w4a16_dequant"). A value passes only with its allowed value's type: bool
    and float never pass as int (they would hash to another tactic id).
    """
    got = tuple(sorted(tactic.params))
    want = tuple(sorted(schema))
    if got != want:
        return f"{what} tactic needs exactly the parameters {want}, got {got}"
    for k, allowed in schema.items():
        v = tactic[k]
        if isinstance(allowed, type):
            if not isinstance(v, allowed) or (allowed is int and isinstance(v, bool)):
                return f"{what} tactic {k} must be {allowed.__name__}, got {v!r}"
        elif not any(v == a and type(v) is type(a) for a in allowed):   # 8.0 and True are not 8 and 1
            return f"{what} tactic {k}={v!r} not in {allowed}"
    return None


def _scalar(v: str) -> Scalar:
    low = v.strip()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for cast in (int, float):
        try:
            return cast(low)
        except ValueError:
            pass
    return low


def parse_tactic(t: "Tactic | str | Mapping[str, Any]") -> Tactic:
    """A Tactic from itself, its JSON, a {"family", "params"} dict, or the `family[k=v,...]` text
    form that `autotune show` prints and pins use. Parsed as data: nothing is evaluated."""
    if isinstance(t, Tactic):
        return t
    if isinstance(t, Mapping):
        return Tactic.from_json(t)
    s = str(t).strip()
    if s.startswith("{"):
        try:
            return Tactic.from_json(s)
        except (ValueError, TypeError) as e:
            raise ValueError(f"not a tactic: {s[:80]!r} ({e})") from None
    if not (s.endswith("]") and "[" in s):
        raise ValueError(f"not a tactic: {s[:80]!r} (expected family[k=v,...] or JSON)")
    fam, _, inner = s[:-1].partition("[")
    params = {}
    for part in filter(None, (p.strip() for p in inner.split(","))):
        k, eq, v = part.partition("=")
        if not eq or not k.strip():
            raise ValueError(f"not a tactic: {s[:80]!r} (parameter {part!r} is not k=v)")
        params[k.strip()] = _scalar(v)
    return Tactic(fam.strip(), params)
