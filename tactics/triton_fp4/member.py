"""The interface each kernel of the `triton` family implements, and the rules W4A16 members share.

A member is one kernel with its own tactic space, parameter schema, verdict rules, static
shared-memory model and launcher. `TritonFamily` (family.py) composes the members: it picks one
by a tactic's `kernel` parameter or by the problem, and runs the steps every member shares (the
parameter check, the compile-compatibility table, the shared-memory limit, the region the model
was checked on). Nothing here imports Triton.
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.problem import Problem
from autotune.core.tactic import Allowed, Tactic, check_params

FAMILY = "triton"
#: sources every member's measured numbers depend on besides its own (autotune.core.codekey): the
#: family's build/bind glue, the shared launcher (autotune.tactics.base), argument and pack helpers, the
#: compile path and the core values they use; relative to this package
SHARED_CODE = (".family", ".members", ".member", ".args", ".compile", ".compat", "..base", "..scratch",
               "autotune.core.arch", "autotune.core.codekey", "autotune.core.formats", "autotune.core.jsonread", "autotune.core.operands",
               "autotune.core.problem", "autotune.core.settings", "autotune.core.tactic")
#: elements per block scale
GROUP = {"nvfp4": 16, "mxfp4": 32}
#: MXFP4 scale rows narrower than 4 bytes (BLOCK_K < 128) are not cp.async-pipelined in Triton
#: 3.9: their layout conversion needs scratch that smem.py does not model, so they are rejected.
MIN_BLOCK_K = {"nvfp4": 64, "mxfp4": 128}
POW2_MN = (16, 32, 64, 128, 256)
POW2_K = (64, 128, 256, 512)
WARPS_OK = (1, 2, 4, 8, 16)
STAGES_OK = tuple(range(1, 9))


@runtime_checkable
class Member(Protocol):
    """One kernel of the family. Parameters reach `rules`, `smem`, `tmem`, `unchecked`, `sources`
    and `make_launcher` only after `schema` accepted them and `supports` accepted the problem."""

    #: the value of the tactic's `kernel` parameter
    kernel: str
    #: exactly the tactic's parameters, each with its allowed values (core.tactic.check_params)
    schema: Mapping[str, Allowed]
    #: the kernel's name in compat.KNOWN (Triton version × arch × format known not to compile)
    compat_kernel: str
    #: the sources its measured numbers depend on (autotune.core.codekey), SHARED_CODE included
    code: Code

    def supports(self, problem: Problem) -> str | None:
        """None when this member runs `problem`, else why not."""
    def space(self, problem: Problem, arch: Arch, axes: Mapping[str, tuple] | None = None) -> Sequence[Tactic]:
        """The member's tactic space for a problem it supports: its default grid, with `axes`
        (parameter -> values, checked by `check_axes`) replacing axes of that grid."""
    def check_axes(self, axes: Mapping[str, tuple]) -> None:
        """ValueError unless `axes` names axes of the member's grid with values its schema allows."""
    def default(self, problem: Problem, arch: Arch) -> Tactic | None:
        """The member's default for `problem`, or None when it offers none."""
    def rules(self, problem: Problem, params: Mapping[str, Any], arch: Arch) -> str | None:
        """The member's own rejection rules (tiling, stages, arch), or None."""
    def smem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int | None:
        """The static model's shared-memory bytes; None: no pipelined loop, nothing to model."""
    def tmem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        """Tensor-memory columns (sm100 tcgen05; 0 elsewhere)."""
    def unchecked(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> str | None:
        """Why the smem/tmem model was not checked against the compiler for this config (then the
        verdict needs the compiler's figure or says unknown), or None inside the checked region."""
    def sources(self, fmt: str, params: Mapping[str, Any], problem: Problem | None = None) -> list[tuple[Any, dict]]:
        """(ASTSource, options) of each kernel a call launches, the GEMM last ([]: nothing to
        compile ahead of time). With `problem` (the search's precompile), exactly the constexprs
        its launches pass — a grouped member's routing and epilogue are constexprs, and a launch
        whose key differs compiles again inside the timed worker; without one, a representative
        problem (shared memory does not depend on it). Imports Triton."""
    def make_launcher(self, problem: Problem, tactic: Tactic, device: str) -> Any:
        """The callable that runs the kernel (FP4Weight or U8Weight weights)."""
    def batch_invariant(self, params: Mapping[str, Any]) -> bool:
        """A row's result does not depend on how many rows share the call (Family.batch_invariant)."""


def w4a16_support(problem: Problem, kernel: str, kind: str) -> str | None:
    """The problem check of the bf16-activation members: `kind` is the problem kind `kernel` runs."""
    if problem.kind not in ("dense", "grouped_moe"):
        return f"triton w4a16 kernels handle dense and grouped_moe problems, not {problem.kind!r}"
    if problem.a_fmt != "bf16":
        return f"triton w4a16 kernel needs bf16 activations, not {problem.a_fmt}"
    if problem.w_fmt not in GROUP:
        return f"triton w4a16 kernel needs nvfp4/mxfp4 weights, not {problem.w_fmt}"
    if problem.out_dtype != "bf16":
        return f"triton w4a16 kernel writes bf16, not {problem.out_dtype}"
    if problem.kind != kind:
        return f"triton kernel {kernel} does not run {problem.kind} problems"
    if kind == "dense" and problem.epilogue != "none":
        return f"triton kernel {kernel} has no {problem.epilogue} epilogue (the cuda and torch families have)"
    return None


def tile_rules(problem: Problem, bk: int) -> str | None:
    """The tiling every kernel of the family needs: K tiled exactly, N specialized to 16."""
    if problem.k % bk:
        return f"BLOCK_K={bk} does not divide K={problem.k} (the kernel does not mask K)"
    if problem.n % 16:
        return f"N={problem.n} is not a multiple of 16 (the kernel is specialized for it)"
    return None


def w4a16_rules(problem: Problem, p: Mapping[str, Any], arch: Arch, pipelined: bool) -> str | None:
    """Rules of the bf16-activation members: scale rows wide enough, tiling, stages, sm80+."""
    bk, fmt = p["block_k"], problem.w_fmt
    if bk < MIN_BLOCK_K[fmt]:
        return (f"BLOCK_K={bk} < {MIN_BLOCK_K[fmt]} for {fmt}: scale rows under 4 bytes are not "
                "cp.async-pipelined (layout-conversion scratch not covered by the smem model)")
    why = tile_rules(problem, bk)
    if why:
        return why
    if pipelined:
        if p["num_stages"] < 2:
            return "num_stages must be >= 2 (the smem model covers pipelined loops only)"
        steps, sk = problem.k // bk, p.get("split_k", 1)
        if sk > 1 and steps < 2 * sk:
            return f"split_k={sk} leaves < 2 of the K/BLOCK_K={steps} steps per split"
    if arch.is_gpu and arch.cc[0] < 8:
        return f"{arch.name}: the kernel needs sm80 or newer (bf16 tl.dot, fma.rn.bf16x2)"
    return None


def scale_consts(fmt: str) -> dict[str, int]:
    """The scale-format constexprs of the W4A16 kernels."""
    return {"SCALE_GROUP": GROUP[fmt], "SCALE_E4M3": 1 if fmt == "nvfp4" else 0}


def grid(default: Mapping[str, tuple], axes: Mapping[str, tuple] | None) -> list[dict[str, Any]]:
    """Every combination of the `default` axes with `axes` replacing some, in the default's order."""
    merged = {k: tuple((axes or {}).get(k, v)) for k, v in default.items()}
    return [dict(zip(merged, vals)) for vals in itertools.product(*merged.values())]


def check_axes(kernel: str, default: Mapping[str, tuple], schema: Mapping[str, tuple],
               axes: Mapping[str, tuple]) -> None:
    """ValueError unless each of `axes` is an axis of `default` whose values `schema` allows."""
    base = {k: allowed[0] for k, allowed in schema.items()}
    for k, vals in axes.items():
        if k not in default:
            raise ValueError(f"triton {kernel}: no space axis {k!r} (axes: {', '.join(default)})")
        for v in vals:
            why = check_params(Tactic(FAMILY, {**base, k: v}), schema, f"triton {kernel}")
            if why:
                raise ValueError(why)
