"""Cross-compile the W4A16 kernel for any CUDA target without a GPU, and read `metadata.shared`.

`cross_compile(fmt, params, arch)` runs `triton.compile(ASTSource(...), target=GPUTarget(...))`
with `tt.divisibility` 16 on every pointer and on N and K — the specialization the JIT launch path
sees for a deployed problem (torch allocations are 256-byte aligned, N and K multiples of 16, M is
`do_not_specialize`).

`stop_at="llir"` (default) removes the ptx and cubin stages through Triton's
`knobs.runtime.add_stages_inspection_hook` (Triton ≥ 3.5): `metadata.shared` is set by `make_llir`
from the `ttg.shared` module attribute, so nothing after it is needed. The cubin stage is replaced by
a stub that records the kernel name and returns empty bytes (CompiledKernel needs a binary entry);
the hook's key keeps such partial results apart from full compiles in Triton's cache.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Mapping

from autotune.core.arch import Arch, get_arch

_LOCK = threading.Lock()
_STOP_KEY = "fp4-autotune-stop-after-llir"


def _cc_of(arch_or_cc: Arch | str | int) -> int:
    if isinstance(arch_or_cc, Arch):
        return arch_or_cc.cc_int
    if isinstance(arch_or_cc, int):
        return arch_or_cc
    return get_arch(str(arch_or_cc)).cc_int


class _StopAfterLLIR:
    """Hook for knobs.runtime.add_stages_inspection_hook: called with no argument for the cache key,
    and with (backend, stages, options, language, capability) to edit the stage dict."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, *args):
        if not args:
            return _STOP_KEY, _STOP_KEY
        stages = args[1]
        stages.pop("ptx", None)
        stages.pop("cubin", None)
        name = self.name

        def _stub(src, metadata):
            metadata.setdefault("name", name)
            return b""

        stages["cubin"] = _stub


@contextlib.contextmanager
def _stop_after_llir(name: str):
    from triton import knobs
    old = knobs.runtime.add_stages_inspection_hook
    knobs.runtime.add_stages_inspection_hook = _StopAfterLLIR(name)
    try:
        yield
    finally:
        knobs.runtime.add_stages_inspection_hook = old


@contextlib.contextmanager
def _cache_dir(path: str | None):
    if path is None:
        yield
        return
    from triton import knobs
    old = knobs.cache.dir
    knobs.cache.dir = path
    try:
        yield
    finally:
        knobs.cache.dir = old


def constexprs_for(fmt: str, params: Mapping[str, Any]) -> dict[str, int]:
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"weight format must be nvfp4 or mxfp4, got {fmt!r}")
    return {"BLOCK_M": int(params["block_m"]), "BLOCK_N": int(params["block_n"]),
            "BLOCK_K": int(params["block_k"]), "GROUP_M": int(params.get("group_m", 1)),
            "SPLIT_K": int(params.get("split_k", 1)),
            "SCALE_GROUP": 16 if fmt == "nvfp4" else 32, "SCALE_E4M3": 1 if fmt == "nvfp4" else 0,
            "DEQ_ASM": 1, "DOT_F32": 0}


def _source(problem_fmt: str, params: Mapping[str, Any]):
    """The ASTSource and options the deployed kernel is compiled from: pointers and N, K are
    16-divisible (kernel.DIVISIBLE / MOE_DIVISIBLE), as the launchers see them; M (dense) and P
    (MoE pairs) are not specialized. The MoE kernel is compiled for top_k 8 with routed weights
    (GLM-5's routing); other top_k values compile the same loop and shared memory."""
    from triton.compiler import ASTSource

    from . import kernel as K

    if params.get("kernel") == "moe_w4a16":
        fn, names, types, divisible = K.moe_w4a16_kernel, K.MOE_ARG_NAMES, K.MOE_ARG_TYPES, K.MOE_DIVISIBLE
        consts = {"BLOCK_M": int(params["block_m"]), "BLOCK_N": int(params["block_n"]),
                  "BLOCK_K": int(params["block_k"]), "TOP_K": 8, "SCALE_GROUP": 16 if problem_fmt == "nvfp4" else 32,
                  "SCALE_E4M3": 1 if problem_fmt == "nvfp4" else 0, "ROUTED_WEIGHT": 1,
                  "DEQ_ASM": 1, "DOT_F32": 0}
    else:
        fn, names, types, divisible = K.w4a16_dequant_kernel, K.ARG_NAMES, K.ARG_TYPES, K.DIVISIBLE
        consts = constexprs_for(problem_fmt, params)
    sig = {n: types[n] for n in names}
    sig.update({c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in divisible}
    src = ASTSource(fn, sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": int(params["num_warps"]), "num_stages": int(params["num_stages"])}
    return src, options, fn.__name__


def cross_compile(problem_fmt: str, params: Mapping[str, Any], arch_or_cc: Arch | str | int,
                  stop_at: str = "llir", cache_dir: str | None = None) -> tuple[int, str | None]:
    """Compile the kernel for `arch_or_cc` (an Arch, "sm90", or 90) and return
    (metadata.shared, ptx or None). `stop_at` is "llir" (fast, no PTX) or "cubin" (full)."""
    import triton
    from triton.backends.compiler import GPUTarget

    if stop_at not in ("llir", "cubin"):
        raise ValueError(f"stop_at must be 'llir' or 'cubin', got {stop_at!r}")
    src, options, name = _source(problem_fmt, params)
    target = GPUTarget("cuda", _cc_of(arch_or_cc), 32)
    with _LOCK, _cache_dir(cache_dir):
        if stop_at == "llir":
            with _stop_after_llir(name):
                ck = triton.compile(src, target=target, options=options)
            return int(ck.metadata.shared), None
        ck = triton.compile(src, target=target, options=options)
        return int(ck.metadata.shared), ck.asm.get("ptx")


def tmem_columns(problem_fmt: str, params: Mapping[str, Any], arch_or_cc: Arch | str | int,
                 cache_dir: str | None = None) -> int:
    """Tensor-memory size (columns) the compiler allocated (sm100 only; 0 elsewhere)."""
    import triton
    from triton.backends.compiler import GPUTarget

    src, options, name = _source(problem_fmt, params)
    with _LOCK, _cache_dir(cache_dir), _stop_after_llir(name):
        ck = triton.compile(src, target=GPUTarget("cuda", _cc_of(arch_or_cc), 32), options=options)
    return int(getattr(ck.metadata, "tmem_size", 0) or 0)
