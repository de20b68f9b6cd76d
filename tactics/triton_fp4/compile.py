"""Compile a member's kernel for any CUDA target without a GPU, and read `metadata.shared`.

`compile_kernel(src, options, arch)` runs `triton.compile(src, target=GPUTarget(...))`; members
build `src` with `ast_source`, which puts `tt.divisibility` 16 on the arguments the launch path
sees 16-divisible for a deployed problem (torch allocations are 256-byte aligned, N and K multiples
of 16, M is `do_not_specialize`).

`stop_at="llir"` (default) removes the ptx and cubin stages through Triton's
`knobs.runtime.add_stages_inspection_hook` (Triton ≥ 3.5): `metadata.shared` (and `tmem_size`) are
set by `make_llir` from module attributes, so nothing after it is needed. The cubin stage is
replaced by a stub that records the kernel name and returns empty bytes (CompiledKernel needs a
binary entry); the hook's key keeps such partial results apart from full compiles in Triton's cache.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable, Mapping

from autotune.core.arch import Arch, get_arch

_LOCK = threading.Lock()
_STOP_KEY = "fp4-autotune-stop-after-llir"
STOP_AT = ("llir", "cubin")


def cc_of(arch_or_cc: Arch | str | int) -> int:
    """90 from an Arch, "sm90" or 90."""
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


def ast_source(fn: Any, names: Iterable[str], types: Mapping[str, str], divisible: Iterable[int],
               consts: Mapping[str, int]):
    """The ASTSource of JIT function `fn`: positional `names` typed by `types`, constexprs `consts`,
    tt.divisibility 16 on the argument positions in `divisible`."""
    from triton.compiler import ASTSource
    sig = {n: types[n] for n in names}
    sig.update({c: "constexpr" for c in consts})
    attrs = {(i,): [["tt.divisibility", 16]] for i in divisible}
    return ASTSource(fn, sig, constexprs=dict(consts), attrs=attrs)


def compile_kernel(src: Any, options: Mapping[str, Any], arch_or_cc: Arch | str | int, stop_at: str = "llir",
                   cache_dir: str | None = None):
    """triton.compile for `arch_or_cc` (an Arch, "sm90" or 90): the CompiledKernel. At "llir" its
    cubin is an empty stub and `metadata.shared` / `metadata.tmem_size` are set; "cubin" is a full
    compile (ptx in `asm`), what the launch's JIT then finds in Triton's cache."""
    import triton
    from triton.backends.compiler import GPUTarget

    if stop_at not in STOP_AT:
        raise ValueError(f"stop_at must be one of {STOP_AT}, got {stop_at!r}")
    target = GPUTarget("cuda", cc_of(arch_or_cc), 32)
    with _LOCK, _cache_dir(cache_dir):
        if stop_at == "llir":
            with _stop_after_llir(src.fn.__name__):
                return triton.compile(src, target=target, options=dict(options))
        return triton.compile(src, target=target, options=dict(options))
