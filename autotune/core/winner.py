"""The winner rule: a pure, deterministic function of the stored trials.

Every process that merges the same trials picks the same tactic, so ranks agree (FlashInfer
#3186, Megatron-LM #6966) and a cache merged from several runs has one winner per
(problem, bucket, GPU). Ties within noise go to the smaller shared-memory footprint, then the
smaller tactic id; a challenger must beat the designated default by `margin` (FlashInfer draft
PR #3555's never-slower-than-default rule) or the default stays.

"Within noise" is 1 %, widened to the two timings' spread (half the sum of their interquartile
ranges, relative to the best) where that is larger, up to `NOISE_CAP`: two runs whose timings of
near-equal tactics swap order inside their own spread pick the same one.
"""
from __future__ import annotations

from typing import Iterable

from autotune.core.records import Trial

DEFAULT_MARGIN = 0.03
TIE_TOLERANCE = 0.01
NOISE_CAP = 0.03


def tied(trials: Iterable, tie_tol: float = TIE_TOLERANCE) -> list:
    """The timed trials (anything with `median_us`, `iqr_us`, `tactic_id`) within noise of the
    fastest: the ones the rule breaks ties among."""
    ok = [t for t in trials if t.median_us is not None]
    if not ok:
        return []
    first = min(ok, key=lambda t: (t.median_us, t.tactic_id))
    best = first.median_us

    def band(t) -> float:
        spread = ((first.iqr_us or 0.0) + (t.iqr_us or 0.0)) / (2 * best) if best > 0 else 0.0
        return max(tie_tol, min(spread, NOISE_CAP))
    return [t for t in ok if t.median_us <= best * (1 + band(t))]


def contenders(trials: Iterable, default_id: str, margin: float = DEFAULT_MARGIN,
               tie_tol: float = TIE_TOLERANCE) -> list:
    """Every trial `choose(trials, default_id, margin)` can return, whichever way its smem and id
    tie-break goes: the tied fastest, and the default unless every tied one beats it by `margin`.
    The search proves these (and only these) under graph replay before the rule picks."""
    trials = [t for t in trials if t.median_us is not None]
    band = tied(trials, tie_tol)
    default = [t for t in trials if t.tactic_id == default_id and t not in band]
    keeps = default and any(t.median_us > default[0].median_us * (1 - margin) for t in band)
    return band + (default if keeps else [])


def choose(trials: Iterable[Trial], default_id: str, margin: float = DEFAULT_MARGIN,
           tie_tol: float = TIE_TOLERANCE) -> Trial | None:
    ok = [t for t in trials if t.status == "ok" and t.median_us is not None]
    if not ok:
        return None
    pick = min(tied(ok, tie_tol), key=lambda t: (t.smem_model or 0, t.tactic_id))
    default = next((t for t in ok if t.tactic_id == default_id), None)
    if default is not None and pick.tactic_id != default_id and pick.median_us > default.median_us * (1 - margin):
        return default
    return pick
