"""FlashInfer's own rules for its autotuner cache, per supported flashinfer-python release.

Re-stated from each release's wheel (flashinfer/autotuner/autotuner.py, flashinfer/fused_moe/utils.py,
flashinfer/gemm/gemm_base.py, flashinfer/tactics_blocklist.py), so that a file can be written on a
machine without FlashInfer; tests/test_flashinfer_export.py checks every rule against the real
loader of both releases. The two supported releases agree on everything below.

- Key: str((custom_op, runner class name, nearest profile, extras)) (ProfilingCacheKey.file_key).
  mm_fp4 calls choose_one("fp4_gemm", ...); the CUTLASS runner class is CutlassFp4GemmRunner and
  adds no extras.
- Nearest profile: the shape of each of mm_fp4's ten inputs (a non-tensor is (0,)), with a's M
  mapped to its bucket and every constrained dimension (a's scales, out, workspace) set to -1.
- M buckets: map_to_hybrid_bucket_uncapped (round up: powers of two to 256, steps of 256 to 2048,
  steps of 512 to 4096, powers of two beyond, with no cap).
- Entry: [runner class, tactic, profiling policy]; mm_fp4 tunes under CUDA graphs with a cold L2,
  policy ("cuda_graph_profile_replays", 1, "l2_cache_policy", "cold").
- Metadata: load_configs compares every field _collect_metadata() returns; "*" is the one wildcard.
"""
from __future__ import annotations

import hashlib
import re
import json
from typing import Any

CUSTOM_OP = "fp4_gemm"
RUNNER = "CutlassFp4GemmRunner"
BLOCKLIST_KEY = f"{CUSTOM_OP}::{RUNNER}"      # TacticsBlocklist.filter: f"{custom_op}::{runner class}"
POLICY = ["cuda_graph_profile_replays", 1, "l2_cache_policy", "cold"]
META_KEY = "_metadata"
GENERATION_KEY = "_generation"
#: the fields load_configs and TacticsBlocklist.load compare, in _collect_metadata() order
META_FIELDS = ("flashinfer_version", "cuda_version", "cublas_version", "cudnn_version",
               "cudnn_frontend_version", "cutlass_dsl_version", "gpu")
WILDCARD = "*"
#: fields that may not be wildcarded: the tactic integers belong to one release, the winners to one GPU
NO_WILDCARD = ("flashinfer_version", "gpu")
#: alpha as the engines pass it: a 0-dim tensor (ModelOpt NVFP4 layers) or ones(1) when alpha is None
ALPHA_SHAPES: tuple[tuple[int, ...], ...] = ((), (1,))

_PHASE1_END, _PHASE2_STEP, _PHASE2_END, _PHASE3_STEP, _PHASE3_END = 256, 256, 2048, 512, 4096


def _next_pow2(x: int) -> int:
    return 1 if x <= 1 else 1 << (x - 1).bit_length()


def _ceil_to(x: int, step: int) -> int:
    return (x + step - 1) // step * step


def m_bucket(m: int) -> int:
    """FlashInfer's bucket for a runtime M (map_to_hybrid_bucket_uncapped)."""
    if m <= 0:
        return 1
    if m <= _PHASE1_END:
        return _next_pow2(m)
    if m <= _PHASE2_END:
        return _ceil_to(m, _PHASE2_STEP)
    if m <= _PHASE3_END:
        return _ceil_to(m, _PHASE3_STEP)
    return _next_pow2(m)


def _pad(x: int, to: int) -> int:
    return _ceil_to(x, to)


def nearest_profile(m: int, n: int, k: int, alpha_shape: tuple[int, ...] = ()) -> tuple[tuple[int, ...], ...]:
    """The profile FlashInfer keys an NVFP4 mm_fp4 call with (128x4 scales, block 16) on: inputs
    [a (M, K/2), b = weightᵀ (K/2, N), a_sf (pad128 M, pad4 K/16), b_sf = weight_sfᵀ (pad4 K/16,
    pad128 N), alpha, out_dtype, out (M, N), block_size, use_nvfp4, workspace]."""
    sf_k = _pad(k // 16, 4)
    return ((m_bucket(m), k // 2), (k // 2, n), (-1, sf_k), (sf_k, _pad(n, 128)), tuple(alpha_shape),
            (0,), (-1, n), (0,), (0,), (-1,))


def file_key(profile: tuple[tuple[int, ...], ...], extras: tuple[Any, ...] = ()) -> str:
    return str((CUSTOM_OP, RUNNER, profile, extras))


def generation(ordered: dict) -> str:
    """save_configs' _generation: sha256 of the file's other keys as compact sorted JSON."""
    return hashlib.sha256(json.dumps(ordered, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_metadata(meta: dict[str, str], version: str, gpu_name: str) -> str | None:
    """Why this metadata cannot go with winners for `gpu_name` under `version`, or None."""
    missing = [f for f in META_FIELDS if f not in meta]
    if missing:
        return f"metadata lacks {', '.join(missing)} (FlashInfer's loader compares {', '.join(META_FIELDS)})"
    for f in META_FIELDS:
        v = meta[f]
        if not isinstance(v, str) or not v:
            return f"metadata field {f} must be a non-empty string, got {v!r}"
        if v == WILDCARD and f in NO_WILDCARD:
            return f"metadata field {f} cannot be the wildcard: the tactics belong to one release and one GPU"
    if meta["flashinfer_version"] != version:
        return f"metadata says flashinfer {meta['flashinfer_version']}, the file is for {version}"
    if meta["gpu"] != gpu_name:
        return f"metadata GPU is {meta['gpu']!r} but the winners were measured on {gpu_name!r}"
    return None


def metadata_from_env() -> dict[str, str]:
    """The installed FlashInfer's own _collect_metadata(): run inside the deployment image."""
    try:
        from flashinfer.autotuner.autotuner import _collect_metadata
    except ImportError as e:
        raise ValueError(f"--metadata-from-env needs FlashInfer importable here ({e})") from None
    meta = _collect_metadata()
    return {f: str(meta.get(f)) for f in META_FIELDS}


def parse_metadata(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """'field=value' pairs (as given on the command line) -> dict; unknown fields refused."""
    out: dict[str, str] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"metadata must be field=value, got {p!r}")
        if key not in META_FIELDS:
            raise ValueError(f"unknown metadata field {key!r}; FlashInfer compares {', '.join(META_FIELDS)}")
        out[key] = value.strip()
    return out


# ------------------------------------------------------------------------------ the -1 fallback

#: what mm_fp4's CUTLASS runner launches for tactic -1 (FlashInfer's fallback: any shape its
#: loaded file has no entry for, outside tuning), per kernel arch, in every supported release:
#: SM120 (fp4_gemm_cutlass_sm120.cu fp4_bmm_impl) builds CutlassGemmConfig(CtaShape128x128x128B,
#: AUTO, AUTO, 1x1x1, swap_ab false) with the DP scheduler; SM100 (fp4_gemm_cutlass.cu runGemm)
#: sets tactic = 0. Values: (tile enum name, swap_ab, stream_k) for SM120, the list index for SM100.
FALLBACK: dict[str, tuple[str, bool, bool] | int] = {"sm120": ("CtaShape128x128x128B", False, False), "sm100": 0}

_SM120_FALLBACK = re.compile(r"\(tactic\s*>=\s*0\)\s*\?\s*getFp4GemmConfig\([^)]*\)\s*:\s*CutlassGemmConfig\("
                             r"\s*CutlassTileConfigSM120::(\w+)\s*,[^;]*?(?:/\*\s*swap_ab\s*\*/\s*)?(true|false)\s*"
                             r"(?:,\s*(true|false)\s*)?\)")
_SM100_FALLBACK = re.compile(r"if\s*\(\s*tactic\s*==\s*-1\s*\)\s*\{\s*tactic\s*=\s*(\d+)\s*;")


def fallback_from_source(text: str, kernel_arch: str) -> tuple[str, bool, bool] | int:
    """FALLBACK's value for one arch, read from a release's runner source (the tests read each
    installed wheel's csrc/fp4_gemm_cutlass_sm120.cu and csrc/fp4_gemm_cutlass.cu)."""
    if kernel_arch == "sm120":
        m = _SM120_FALLBACK.search(text)
        if not m:
            raise ValueError("no tactic -1 config found in the SM120 runner source")
        return (m.group(1), m.group(2) == "true", m.group(3) == "true")
    m = _SM100_FALLBACK.search(text)
    if not m:
        raise ValueError("no tactic -1 mapping found in the SM100 runner source")
    return int(m.group(1))


def fallback_index(kernel_arch: str, version: str) -> int:
    """The integer tactic (of `version`'s list) that FlashInfer's -1 launches on `kernel_arch`."""
    from autotune.tactics.cutlass import flashinfer_map as fim
    fb = FALLBACK[kernel_arch]
    if isinstance(fb, int):
        return fb
    return fim.sm120_names(version).index(fb)
