"""How the search draws what it times, where the draw changes the time: a grouped problem's routing.

A grouped-MoE call reads only the experts its tokens are routed to, so its time depends on how
routing is drawn. The search draws it uniformly (`ROUTING_SKEW = 0`: each token's top_k distinct
experts, every expert equally likely), as balanced routers (GLM-5, DeepSeek-V3) spread a batch and as
the step's byte floor assumes. A Zipf popularity with exponent 1.2 (the draw before 2026-12-05)
touches 48 of 256 experts top-8 at M = 16, not 101: winners tuned under it were tuned for half the
bytes the served step reads (docs/decisions/0003-uniform-routing-draw.md).

The draw is part of every code key (codekey.code_key joins it to the sources), so a time measured
under one draw is never served or counted as measured under another.
"""
from __future__ import annotations

from typing import Mapping

#: Zipf exponent of expert popularity in the search's routing draw (0: uniform)
ROUTING_SKEW = 0.0
#: the cache meta key a search writes its draw under (the report's byte counts follow it)
META_KEY = "routing_skew"
#: the draw of every cache written before searches recorded theirs
LEGACY_SKEW = 1.2


def skew_of(meta: Mapping[str, str]) -> float:
    """The routing draw a cache's times were measured under, from its meta rows."""
    v = meta.get(META_KEY)
    if v is None:
        return LEGACY_SKEW
    try:
        skew = float(v)
    except ValueError:
        raise ValueError(f"cache meta {META_KEY}={v!r} is not a number") from None
    if not 0 <= skew < float("inf"):           # NaN fails this too
        raise ValueError(f"cache meta {META_KEY}={v!r} is not a Zipf exponent >= 0")
    return skew


def form() -> str:
    """The draw, as code keys record it."""
    return f"routing-skew {ROUTING_SKEW:g}"
