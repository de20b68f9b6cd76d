"""Plain records that flow from the search into the cache and back (no ORM types here).

Each field of `Trial`, `Winner` and `Miss` is a column of the cache (autotune.cache.columns derives
the one column list from these classes). A field added after the first schema is declared with
`added(since, default)`: the schema (and export form) that brought it. A cache or export of an older
form lacks it and loads it as its default; a writer leaves it out of an export while it holds the
default, so such a row's payload (and checksum) is the one it had before the field. `params_json`
is stored in the tactics table, joined on tactic_id (`joined()`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

#: the schema (and export form) every field not declared with `added` belongs to
FIRST_FORM = 1


def added(since: int, default: Any) -> Any:
    """A field added by schema `since` (> FIRST_FORM): older caches and exports load it as `default`."""
    if since <= FIRST_FORM:
        raise ValueError(f"a field added by schema {since} is no later than the first ({FIRST_FORM})")
    return field(default=default, metadata={"since": since})


def joined() -> Any:
    """A field kept in another table (the tactic's parameters, by tactic_id), not a column of this one."""
    return field(metadata={"joined": True})


Status = Literal["ok", "rejected", "failed", "dropped"]   # dropped: cut by successive halving


@dataclass(frozen=True)
class Trial:
    """One attempt at one (problem, bucket, tactic) in one environment. Every attempt is stored."""

    problem_key: str
    bucket: int
    tactic_id: str
    family: str
    params_json: str = joined()  # Tactic.to_json(), so the tactic can be rebuilt from the cache alone
    device_key: str         # GPU identity hash (name, cc, SM count)
    lib_key: str            # hash of the versions the tactic's family depends on
    status: Status
    reason: str = ""
    median_us: float | None = None
    iqr_us: float | None = None
    reps: int = 0
    rel_err: float | None = None
    smem_model: int | None = None     # verdict's figure
    smem_compiled: int | None = None  # the compiler's figure, where it compiled for the live GPU
    exit_signal: int | None = None    # set when an isolated worker died (its signal says why)
    code_key: str = added(3, "")      # lib_key joined with the member's sources (core.codekey); "" before them
    replay_checked: bool = added(4, False)  # passed the replay check: served path, graph replay (engine.replay)


@dataclass(frozen=True)
class Winner:
    """The chosen tactic for one (problem, bucket, device). Derived from trials, never measured."""

    problem_key: str
    bucket: int
    device_key: str
    tactic_id: str
    family: str
    params_json: str = joined()
    lib_key: str
    median_us: float
    default_tactic_id: str
    default_median_us: float | None
    speedup: float | None     # default_median / median (1.0 when the default won)
    code_key: str = added(3, "")  # the winning trial's code key (core.codekey); "" before code keys
    replay_checked: bool = added(4, False)  # the winning trial passed the replay check (engine.replay)
    predicted: bool = added(5, False)  # the rank model's first choice, checked against float64, never timed
    #                                    (`--strategy predict`; median_us is its one checked call's host time)


@dataclass(frozen=True)
class Miss:
    problem_key: str
    m: int
    device_key: str
    count: int
