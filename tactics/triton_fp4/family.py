"""The `triton` tactic family for FP4 (NVFP4/MXFP4) GEMMs, composed of one member per kernel:

* `w4a16_dequant` (w4a16.py) — fused dequantize-in-registers + tl.dot, with split-K for decode;
* `dequant_cublas` (dequant_cublas.py) — Triton dequantizes the weight to bf16, cuBLAS multiplies;
* `moe_w4a16` (moe.py) — grouped MoE over stacked experts;
* `moe_decode` (moe_decode.py) — decode-shaped grouped MoE (direct or aligned routing, split-K);
* `w4a4_dot_scaled` (w4a4.py) — W4A4 problems: our activation quantizer, then tl.dot_scaled.

The family picks a member by a tactic's `kernel` parameter, or by the problem (each member says
which problems it runs), and runs the verdict steps all members share: the parameter schema
(core.tactic.check_params), the member's own rules, the compile-compatibility table (compat.py:
Triton version × arch × format), the static shared-memory / tensor-memory model against the arch's
limits. verdict() is pure: it imports nothing from Triton and never compiles. `precompile()`
compiles a config ahead of timing into Triton's cache (the search runs it in many processes); the
launch then finds it there.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, ClassVar, Mapping, Sequence

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.formats import FP4Weight
from autotune.core.operands import check_weight
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict, check_params
from autotune.tactics.base import FamilyBase, Kernel

from .args import U8_LAYOUT, U8Weight, pack_u8
from .bound_dense import Remember
from .compat import rejection
from .compile import compile_kernel
from .member import FAMILY, Member
from .members import BY_KERNEL, KERNELS, MEMBERS, cross_compile, member_of, members_for

NAME = FAMILY

#: a compiler-figure provider: (problem, tactic, arch) -> (shared-memory bytes, tensor-memory
#: columns) the compiler allocates for that config, or None when it cannot say (figures.py has one)
CompilerFigures = Callable[[Problem, Tactic, Arch], "tuple[int, int] | None"]

_NO_CPU = "no CUDA GPU: Triton kernels need one (TRITON_INTERPRET=1 runs them only for tests)"


#: (source hash, arch, options, Triton cache dir) of the kernels precompile compiled in this process
_PRECOMPILED: set[tuple] = set()


def _cache_dir() -> str:
    from triton import knobs
    return str(knobs.cache.dir)


class TritonFamily(FamilyBase):
    """The family. Two options, both keeping tactic ids (the family name stays "triton"):

    * `space_axes` (class attribute): per member kernel, values that replace the axes of its
      default space, e.g. ``{"w4a16_dequant": {"num_warps": (2, 4, 8), "num_stages": (2, 3, 4, 6)}}``
      (a subclass registered with `autotune.tactics.registry.register("triton", "module:Class")` widens the
      space for the search and its workers). Configs outside the region the smem model was
      checked on get the compiler's figure, or an unknown verdict (never an extrapolated "fits").
    * `compiler`: a compiler-figure provider (figures.CompiledFigures) a caller passes in
      (`TritonFamily(compiler=...)` or `family.with_compiler(...)`; the engine passes none); without one, configs outside
      the checked region are `Verdict(ok=None, "unknown: ...")`.
    """

    name = NAME
    depends_on = ("triton",)
    default_rank = 0      # the designated default wherever a GPU runs Triton
    compiles = True
    space_axes: ClassVar[Mapping[str, Mapping[str, tuple]]] = {}

    def __init__(self, compiler: CompilerFigures | None = None):
        for kernel, axes in self.space_axes.items():
            member_of(kernel).check_axes(axes)
        self.compiler = compiler

    def with_compiler(self, compiler: CompilerFigures | None) -> "TritonFamily":
        """This family with `compiler` answering for configs outside the checked region."""
        other = copy.copy(self)
        other.compiler = compiler
        return other

    def with_compiler_figures(self, memo: Any) -> Any:
        """With a cross-compiling provider (figures.CompiledFigures) over `memo`, unless one is set
        or Triton is not installed (then the configs outside the checked region stay unknown)."""
        if self.compiler is not None:
            return self
        from .figures import CompiledFigures, triton_version
        return self.with_compiler(CompiledFigures(memo=memo)) if triton_version() else self

    def available(self, device: str) -> tuple[bool, str]:
        if str(device).startswith("cpu"):
            return False, _NO_CPU
        try:
            import triton  # noqa: F401
        except Exception:
            return False, "triton is not installed"
        return True, ""

    def supports(self, problem: Problem) -> str | None:
        whys = [m.supports(problem) for m in MEMBERS]
        if None in whys:
            return None
        return "; ".join(dict.fromkeys(whys))       # each distinct reason once

    # ---- space --------------------------------------------------------------------------------
    def enumerate(self, problem: Problem, arch: Arch) -> list[Tactic]:
        return [t for m in members_for(problem) for t in m.space(problem, arch, self.space_axes.get(m.kernel))]

    def default(self, problem: Problem, arch: Arch) -> Tactic:
        for m in members_for(problem):
            t = m.default(problem, arch)
            if t is not None:
                return t
        raise ValueError(self.supports(problem) or f"no triton member offers a default for {problem.key}")

    def validate(self, tactic: Tactic) -> str | None:
        if tactic.family != NAME:
            return f"family is {tactic.family!r}, not {NAME!r}"
        try:
            m = member_of(tactic.get("kernel"))
        except ValueError as e:
            return str(e)
        return check_params(tactic, m.schema, f"triton {m.kernel}")

    # ---- static judgement ---------------------------------------------------------------------
    def verdict_checked(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        m, p = member_of(tactic["kernel"]), tactic.params
        why = m.supports(problem)
        if why:
            return Verdict.reject(why)
        stages = p.get("num_stages")
        why = m.rules(problem, p, arch)
        if why:
            return Verdict.reject(why, stages=stages)
        if not arch.is_gpu:
            return Verdict.keep(stages=stages)          # cpu pseudo-arch: interpreter, no smem limit
        why = rejection(m.compat_kernel, problem.w_fmt, arch)
        if why:
            return Verdict.reject(why, stages=stages)
        outside = m.unchecked(p, problem.w_fmt, arch)
        if outside:
            try:
                figure = self.compiler(problem, tactic, arch) if self.compiler is not None else None
            except Exception as e:      # verdict() never raises for a validated tactic
                figure, outside = None, f"{outside}; the compiler-figure provider failed ({type(e).__name__}: {e})"
            if figure is None:
                said = getattr(self.compiler, "why", None)
                said = said(problem, tactic, arch) if callable(said) else None
                return Verdict(None, f"unknown: {outside}; " + (f"the compiler gave no figure ({said})" if said
                                                                else "no compiler figure for it"), stages=stages)
            need, cols = figure
        else:
            need, cols = m.smem(p, problem.w_fmt, arch), m.tmem(p, problem.w_fmt, arch)
        if need is None:
            return Verdict.keep(stages=stages)          # no pipelined loop: no smem to model
        limit = arch.smem_per_block_optin
        if need > limit:
            return Verdict.reject(f"smem {need} > {limit}", smem=need, limit=limit, stages=stages)
        if cols > 512:
            return Verdict.reject(f"tmem {cols} columns > 512", smem=need, limit=limit, stages=stages)
        return Verdict.keep(need, limit, stages)

    # ---- build --------------------------------------------------------------------------------
    def _checked(self, problem: Problem, tactic: Tactic) -> Member:
        why = self.validate(tactic)
        m = None if why else member_of(tactic["kernel"])
        why = why or m.supports(problem)
        if not why and problem.k % tactic["block_k"]:
            # the kernels do not mask K: such a config would read past each weight row
            why = f"block_k {tactic['block_k']} does not divide K={problem.k}"
        if why:
            raise ValueError(why)
        return m

    def build(self, problem: Problem, tactic: Tactic, device: str) -> Kernel:
        return self._checked(problem, tactic).make_launcher(problem, tactic, device)

    def precompile(self, problem: Problem, tactic: Tactic, arch: Arch) -> int | None:
        """Compile the member's kernels for `arch` into Triton's on-disk cache (the launch's JIT
        then finds them) and return the GEMM's compiled `metadata.shared` (None for a member with
        nothing to compile ahead, dequant_cublas)."""
        m = self._checked(problem, tactic)
        shared = None
        # the problem's own constexprs (a grouped member's routing, moe_decode's epilogue)
        srcs = m.sources(problem.w_fmt, tactic.params, problem)
        for i, (src, options) in enumerate(srcs):
            key = (src.hash(), arch.name, tuple(sorted(options.items())), _cache_dir())
            if i < len(srcs) - 1 and key in _PRECOMPILED:
                continue        # a helper kernel many tactics share (moe_decode's alignment): once per process
            shared = int(compile_kernel(src, options, arch, stop_at="cubin").metadata.shared)
            _PRECOMPILED.add(key)
        return shared

    def bind(self, problem: Problem, tactic: Tactic, packed: Any, device: str) -> Any:
        """Dense members: a bound launcher with everything fixed at bind (bound_dense.py: weight
        pointers, constexprs, per-M launch plans, scratch owned per stream); MoE members: the
        shared FamilyBase launcher."""
        check_weight(problem, packed)
        launcher = self.build(problem, tactic, device)
        invariant = self.batch_invariant(problem, tactic)
        if problem.kind != "dense" or not isinstance(launcher, Remember):
            return self.bind_kernel(problem, launcher, packed, batch_invariant=invariant)
        return launcher.bound_cls(problem, launcher, packed if isinstance(packed, U8Weight) else pack_u8(packed),
                                  batch_invariant=invariant)

    # ---- self-description for the search's ranking and --batch-invariant ---------------------
    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
        """Programs, threads and row-tile use of the tactic's launch at M rows (grouped MoE: each
        expert's rows padded to BLOCK_M, the launcher's bound of ceil(P/BM) + min(E, P) row blocks
        for P = M·top_k routed pairs); {} for a member without a row tile (dequant_cublas)."""
        p = tactic.params
        bm, bn, warps = p.get("block_m"), p.get("block_n"), p.get("num_warps")
        if not (isinstance(bm, int) and isinstance(bn, int) and isinstance(warps, int)):
            return {}
        pairs = m * problem.top_k
        row_tiles = -(-pairs // bm) + (min(problem.experts, pairs) if problem.kind == "grouped_moe" else 0)
        ctas = row_tiles * -(-problem.n // bn) * int(p.get("split_k", 1))
        return {"ctas": float(ctas), "threads": float(32 * warps), "m_util": pairs / (row_tiles * bm)}

    def batch_invariant(self, problem: Problem, tactic: Tactic) -> bool:
        """The member's own answer (`batch_invariant(params)`); a member that does not say is not."""
        try:
            m = member_of(tactic.get("kernel"))
        except ValueError:
            return False
        return bool(m.batch_invariant(tactic.params))

    # ---- which code measured a trial (autotune.core.codekey) ---------------------------------
    def code(self, tactic: Tactic) -> Code:
        """The sources of the tactic's member: its kernel, launch and pack code and the family's
        shared parts (member.SHARED_CODE). ValueError for an unknown kernel."""
        return member_of(tactic.get("kernel")).code

    def codes(self) -> tuple[Code, ...]:
        return tuple(m.code for m in MEMBERS)

    # ---- weight layout ------------------------------------------------------------------------
    def layout(self, tactic: Tactic) -> str:
        return U8_LAYOUT

    def pack(self, layout: str, weight: FP4Weight) -> Any:
        if layout != U8_LAYOUT:
            return super().pack(layout, weight)
        return pack_u8(weight)


__all__: Sequence[str] = ("BY_KERNEL", "KERNELS", "MEMBERS", "NAME", "TritonFamily", "cross_compile", "member_of",
                          "members_for")
