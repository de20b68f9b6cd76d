"""Every AUTOTUNE_* environment variable, read in one place (at call time, so a test or a
serving process that sets one later is honoured).

    AUTOTUNE_CACHE            the cache: a file path or any SQLAlchemy URL (default: the user cache dir)
    AUTOTUNE_MISSES           where dispatch records misses (a read-only deployment keeps them apart)
    AUTOTUNE_PIN              tactics forced per problem (JSON or KEY=family[k=v,...] items)
    AUTOTUNE_CACHE_IMMUTABLE  1/true: never write to the cache (an image's baked-in file)
"""
from __future__ import annotations

import os

CACHE = "AUTOTUNE_CACHE"
MISSES = "AUTOTUNE_MISSES"
PIN = "AUTOTUNE_PIN"
CACHE_IMMUTABLE = "AUTOTUNE_CACHE_IMMUTABLE"


def cache_url() -> str | None:
    """$AUTOTUNE_CACHE stripped, or None when unset or empty."""
    return os.environ.get(CACHE, "").strip() or None


def misses_url() -> str | None:
    return os.environ.get(MISSES) or None


def pins() -> str:
    return os.environ.get(PIN, "")


def cache_immutable() -> bool:
    return os.environ.get(CACHE_IMMUTABLE, "") in ("1", "true")
