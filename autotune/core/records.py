"""Plain records that flow from the search into the cache and back (no ORM types here)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "rejected", "failed", "dropped"]   # dropped: cut by successive halving


@dataclass(frozen=True)
class Trial:
    """One attempt at one (problem, bucket, tactic) in one environment. Every attempt is stored."""

    problem_key: str
    bucket: int
    tactic_id: str
    family: str
    params_json: str        # Tactic.to_json(), so the tactic can be rebuilt from the cache alone
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
    code_key: str = ""                # lib_key joined with the member's sources (core.codekey); "" before them


@dataclass(frozen=True)
class Winner:
    """The chosen tactic for one (problem, bucket, device). Derived from trials, never measured."""

    problem_key: str
    bucket: int
    device_key: str
    tactic_id: str
    family: str
    params_json: str
    lib_key: str
    median_us: float
    default_tactic_id: str
    default_median_us: float | None
    speedup: float | None     # default_median / median (1.0 when the default won)
    code_key: str = ""        # the winning trial's code key (core.codekey); "" before code keys
    predicted: bool = False   # the rank model's first choice, checked against float64, never timed
    #                           (`--strategy predict`; median_us is its one checked call's host time)


@dataclass(frozen=True)
class Miss:
    problem_key: str
    m: int
    device_key: str
    count: int
