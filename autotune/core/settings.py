"""Every AUTOTUNE_* environment variable, read in one place (at call time, so a test or a
serving process that sets one later is honoured).

    AUTOTUNE_CACHE            the cache: a file path or any SQLAlchemy URL (default: the user cache dir)
    AUTOTUNE_MISSES           where dispatch records misses (a read-only deployment keeps them apart)
    AUTOTUNE_PIN              tactics forced per problem (JSON or KEY=family[k=v,...] items)
    AUTOTUNE_CACHE_IMMUTABLE  1/true: never write to the cache (an image's baked-in file)
    AUTOTUNE_SIGNING_KEY      an HMAC secret that signs exports and verifies files (autotune.cache.signing)
    AUTOTUNE_SIGNING_KEY_FILE a key file (Ed25519 PEM, or an HMAC secret) for the same
    AUTOTUNE_CLAIM_TTL_S      how long a search's claim on a (problem, bucket) job lives (engine.claims)
    AUTOTUNE_LAUNCH           "triton": bound Triton launchers use Triton's own launch, never the
                              direct route (tactics/triton_fp4/direct.py); default "direct"
    AUTOTUNE_CUDA_CUBINS      where the cuda family caches its NVRTC cubins (default: the user cache dir)
    AUTOTUNE_ACTIVATIONS      how a W4A4 checkpoint runs: "auto" (W4A4 where the arch has a W4A4
                              tactic, else W4A16 with one warning), "w4a4" (always; emulated where
                              no kernel exists), "w4a16" (never); the search and the loaders read it
    AUTOTUNE_BATCH_INVARIANT  1/true: dispatch serves one batch-invariant tactic per problem for
                              every M (runtime/dispatch.py); 0/false: off. Unset: vLLM's
                              VLLM_BATCH_INVARIANT (an integer, non-zero = on), else off
    AUTOTUNE_CHECK_IDS        1/true: every eager grouped-MoE call reads its bad-id word after the
                              launch (a host sync) and raises on expert ids outside [-1, E); default
                              off: the word is sticky on the device, read by FP4MoE.routing_errors() /
                              Dispatcher.routing_errors() (docs/fp4moe.md, "Bad expert ids")
    AUTOTUNE_PDL              the cuda family's launches with programmatic dependent launch (each
                              kernel's start overlaps the previous kernel's end; sm_90+, through
                              cuda-bindings): 1/true on where the GPU has it, 0/false off; unset: on.
                              A search's measuring worker sets 0 unless it is set, so trials time
                              each kernel alone, as every other family's are (docs/cuda-family.md)
"""
from __future__ import annotations

import os

CACHE = "AUTOTUNE_CACHE"
MISSES = "AUTOTUNE_MISSES"
PIN = "AUTOTUNE_PIN"
CACHE_IMMUTABLE = "AUTOTUNE_CACHE_IMMUTABLE"
SIGNING_KEY = "AUTOTUNE_SIGNING_KEY"
SIGNING_KEY_FILE = "AUTOTUNE_SIGNING_KEY_FILE"
CLAIM_TTL_S = "AUTOTUNE_CLAIM_TTL_S"
LAUNCH = "AUTOTUNE_LAUNCH"
CUDA_CUBINS = "AUTOTUNE_CUDA_CUBINS"
BATCH_INVARIANT = "AUTOTUNE_BATCH_INVARIANT"
ACTIVATIONS = "AUTOTUNE_ACTIVATIONS"
ACTIVATION_CHOICES = ("auto", "w4a4", "w4a16")
VLLM_BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
CHECK_IDS = "AUTOTUNE_CHECK_IDS"
PDL = "AUTOTUNE_PDL"
PREFETCH_W2 = "AUTOTUNE_PREFETCH_W2"


def cache_url() -> str | None:
    """$AUTOTUNE_CACHE stripped, or None when unset or empty."""
    return os.environ.get(CACHE, "").strip() or None


def misses_url() -> str | None:
    return os.environ.get(MISSES) or None


def pins() -> str:
    return os.environ.get(PIN, "")


def cache_immutable() -> bool:
    return os.environ.get(CACHE_IMMUTABLE, "") in ("1", "true")


def claim_ttl_s() -> str:
    """$AUTOTUNE_CLAIM_TTL_S as written (engine.claims parses and checks it)."""
    return os.environ.get(CLAIM_TTL_S, "").strip()


def launch_route() -> str:
    """$AUTOTUNE_LAUNCH: "triton" (Triton's own launch) or "direct" (the default)."""
    return "triton" if os.environ.get(LAUNCH, "").strip().lower() == "triton" else "direct"


def cuda_cubins() -> str | None:
    """$AUTOTUNE_CUDA_CUBINS stripped, or None when unset or empty."""
    return os.environ.get(CUDA_CUBINS, "").strip() or None


def _switch(name: str, default: bool) -> bool:
    """A 1/true / 0/false variable; unset or empty: `default`; anything else raises in one line."""
    v = os.environ.get(name, "").strip().lower()
    if v == "":
        return default
    if v in ("1", "true", "0", "false"):
        return v in ("1", "true")
    raise ValueError(f"{name} must be 1, true, 0 or false, got {v!r}")


def check_ids() -> bool:
    """$AUTOTUNE_CHECK_IDS: 1/true on (a host read and a raise per eager MoE call), else off."""
    return _switch(CHECK_IDS, False)


def pdl() -> bool:
    """$AUTOTUNE_PDL: 1/true or unset on (where the GPU and cuda-bindings have it), 0/false off."""
    return _switch(PDL, True)


def prefetch_w2() -> bool:
    """$AUTOTUNE_PREFETCH_W2: 1/true on (FP4MoE's w13 puts w2's routed slices into L2 at small M), unset
    or 0/false off — off: it measured slower (docs/decisions/0004-prefetch-w2-off.md)."""
    return _switch(PREFETCH_W2, False)


def batch_invariant() -> bool:
    """$AUTOTUNE_BATCH_INVARIANT when set (1/true on, 0/false off), else vLLM's switch, read as
    vLLM reads it (an integer, non-zero = on; anything else off)."""
    ours = os.environ.get(BATCH_INVARIANT, "").strip().lower()
    if ours:
        if ours in ("1", "true"):
            return True
        if ours in ("0", "false"):
            return False
        raise ValueError(f"{BATCH_INVARIANT} must be 1, true, 0 or false, got {ours!r}")
    try:
        return int(os.environ.get(VLLM_BATCH_INVARIANT, "0").strip() or "0") != 0
    except ValueError:
        return False


def activations(explicit: str | None = None) -> str:
    """The W4A4 setting: `explicit` (a flag / keyword) when given, else $AUTOTUNE_ACTIVATIONS, else
    "auto". A value outside ACTIVATION_CHOICES raises ValueError in one line."""
    v = explicit if explicit is not None else (os.environ.get(ACTIVATIONS, "").strip().lower() or "auto")
    if v not in ACTIVATION_CHOICES:
        src = "activations" if explicit is not None else f"${ACTIVATIONS}"
        raise ValueError(f"{src} must be one of {', '.join(ACTIVATION_CHOICES)}, got {v!r}")
    return v
