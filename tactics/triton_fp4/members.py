"""The family's members in one table, and the two questions asked of it by kernel name: which
member runs a tactic, and what it compiles ahead of time (cross_compile). Apart from family.py so
the compiler-figure provider (figures.py) can use it without importing the family."""
from __future__ import annotations

from typing import Any, Mapping

from autotune.core.arch import Arch
from autotune.core.problem import Problem

from .compile import compile_kernel
from .dequant_cublas import MEMBER as DEQUANT_CUBLAS
from .member import Member
from .moe import MEMBER as MOE
from .moe_decode import MEMBER as MOE_DECODE
from .w4a4 import MEMBER as W4A4
from .w4a16 import MEMBER as W4A16

#: every member, in the order their spaces are enumerated
MEMBERS: tuple[Member, ...] = (W4A16, DEQUANT_CUBLAS, MOE, MOE_DECODE, W4A4)
BY_KERNEL: dict[str, Member] = {m.kernel: m for m in MEMBERS}
KERNELS = tuple(BY_KERNEL)


def member_of(kernel: Any) -> Member:
    """The member whose tactics have `kernel=kernel`; ValueError for an unknown kernel."""
    m = BY_KERNEL.get(kernel) if isinstance(kernel, str) else None
    if m is None:
        raise ValueError(f"unknown triton kernel {kernel!r} (known: {', '.join(KERNELS)})")
    return m


def members_for(problem: Problem) -> list[Member]:
    """The members that run `problem`, in enumeration order."""
    return [m for m in MEMBERS if m.supports(problem) is None]


def cross_compile(fmt: str, params: Mapping[str, Any], arch: Arch | str | int, stop_at: str = "llir",
                  cache_dir: str | None = None):
    """Compile the GEMM of the member `params["kernel"]` for `arch` without a GPU (compile.py):
    the CompiledKernel, whose `metadata.shared` and `metadata.tmem_size` are the compiler's figures."""
    srcs = member_of(params.get("kernel")).sources(fmt, params)
    if not srcs:
        raise ValueError(f"triton {params.get('kernel')} has no pipelined kernel to compile ahead of time")
    src, options = srcs[-1]
    return compile_kernel(src, options, arch, stop_at, cache_dir)
