"""Launching a compiled Triton kernel without Triton's per-call JIT work (its host cost per call).

`kernel[grid](*args, **consts)` binds the arguments, computes the specialisation key, looks the
kernel up, builds launch metadata and asks each tensor for its pointer, on every call (about
16 µs on the H200 for an empty kernel). A bound launcher knows all of that after its first launch
of a (kernel, specialisation): it keeps the CompiledKernel's own launcher (`CompiledKernel.run`,
Triton's generated C `launch`), its CUfunction and packed metadata, and every argument that does
not change between calls (weight pointers as ints, N, K, the constexprs). A call then passes the
grid, the current stream, x's and out's pointers and M, and nothing else.

The positional layout of `CompiledKernel.run` — (grid x, y, z, stream, function, packed metadata,
launch metadata, enter hook, exit hook, *every kernel argument in declaration order, constexprs
included) — is read from Triton's runtime/jit.py and compiler.py (3.6 on the H200, 3.9 here). Other versions are
not trusted: `why_not()` says why and the launchers keep Triton's normal launch. So is the
interpreter (TRITON_INTERPRET=1), any launch hook (a profiler such as Proton installs one; the
empty HookChain Triton starts with calls nothing, so the direct route passes None for it) and
$AUTOTUNE_LAUNCH=triton. Pointers are passed as ints, so the specialisation the kernel was compiled
for (16-byte aligned pointers) must hold for every call: callers check `ptr & 15 == 0` and take the
normal launch otherwise.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

import autotune.core.settings as settings

#: Triton (major, minor) versions whose CompiledKernel.run layout was read and checked bit for bit
#: against Triton's own launch (bench/eager_h200.py): 3.6 on the H200; 3.9's source was read here
VERSIONS = ((3, 6), (3, 9))


@lru_cache(maxsize=1)
def _version_ok() -> bool:
    from .compat import installed_triton
    return installed_triton() in VERSIONS


def why_not() -> str | None:
    """Why launchers may not take the direct route now (None: they may); checked at bind."""
    from .args import is_interpreting
    if is_interpreting():
        return "TRITON_INTERPRET=1"
    if settings.launch_route() != "direct":
        return "AUTOTUNE_LAUNCH=triton"
    if not _version_ok():
        from .compat import installed_triton
        return f"Triton {installed_triton()} is not one of {VERSIONS}"
    from triton import knobs
    for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if h is not None and getattr(h, "calls", True):     # an empty HookChain (3.6+) calls nothing
            return "a Triton launch hook is installed"
    return None


def stream_getter():
    """A function(device index) -> the current raw CUstream (what Triton's own launch uses)."""
    import torch
    return torch._C._cuda_getCurrentRawStream


class Direct:
    """The launch handles of one CompiledKernel (from `compiled`): its launcher (`CompiledKernel.run`),
    CUfunction and packed metadata. A plan calls `run(gx, gy, gz, stream, function, metadata, None,
    None, None, *every kernel argument)`."""

    __slots__ = ("run", "function", "metadata")

    def __init__(self, ck: Any):
        self.run = ck.run                 # the property initialises the module and function handles
        self.function = ck.function
        self.metadata = ck.packed_metadata


def constexprs(fn: Any, first: int, consts: Mapping[str, Any]) -> list[Any]:
    """The values of JIT function `fn`'s arguments from position `first` on (its constexprs), in
    declaration order: the tail `CompiledKernel.run` takes, constexprs included."""
    names = list(fn.arg_names)[first:]
    missing = [n for n in names if n not in consts]
    if missing:
        raise ValueError(f"{fn.__name__}: no value for {', '.join(missing)}")
    return [consts[n] for n in names]


def compiled(fn: Any, grid: tuple, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The CompiledKernel `fn[grid](*args, **kwargs)` would launch, compiled (or found in Triton's
    cache) without launching it."""
    return fn.warmup(*args, grid=grid, **kwargs)
