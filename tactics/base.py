"""The Family interface: the one way a backend plugs into the engine, the runtime and the cache.

A family turns a Problem into a tactic space, judges each tactic without compiling or launching
(`verdict`), and turns a kept tactic into a kernel (`build`) or a launcher bound to one weight
(`bind`). The engine, prepack and dispatch talk to families only through this interface and never
name one. `FamilyBase` gives the optional parts their defaults, so a family declares what it has
(precompile, a weight layout, a place in the default preference) instead of being probed for it.
"""
from __future__ import annotations

from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.formats import FP4Weight
from autotune.core.operands import check_out, check_routing, check_weight, check_x, out_checker, x_checker
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict

#: kernel(x, w, ...) -> y: the weight comes with every call (the `dispatch((M,N,K))(x, w)` form)
Kernel = Callable[..., Any]
#: launcher(x, ...) -> y: one weight bound once (FP4Linear, FP4MoE, bound tables)
Launcher = Callable[..., Any]

#: the layout every family reads unless it declares another: the FP4Weight as it is, contiguous
PLAIN_LAYOUT = "fp4-linear"


@runtime_checkable
class Family(Protocol):
    """What the engine and runtime may rely on. Implement it by subclassing `FamilyBase`."""

    name: str
    #: distributions whose versions key this family's trials and winners (e.g. ("triton",))
    depends_on: tuple[str, ...]
    #: rank as the designated default (lower first); None: never the default
    default_rank: int | None
    #: True when `precompile` compiles ahead of timing (the engine then runs it in a pool)
    compiles: bool

    def available(self, device: str) -> tuple[bool, str]: ...
    def supports(self, problem: Problem) -> str | None: ...
    def enumerate(self, problem: Problem, arch: Arch) -> Sequence[Tactic]: ...
    def validate(self, tactic: Tactic) -> str | None: ...
    def verdict(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict: ...
    def default(self, problem: Problem, arch: Arch) -> Tactic: ...
    def build(self, problem: Problem, tactic: Tactic, device: str) -> Kernel: ...
    def precompile(self, problem: Problem, tactic: Tactic, arch: Arch) -> int | None: ...
    def layout(self, tactic: Tactic) -> str: ...
    def pack(self, layout: str, weight: FP4Weight) -> Any: ...
    def pack_inplace(self, layout: str, weight: FP4Weight, *, already_packed: bool = False) -> Any | None: ...
    def bind(self, problem: Problem, tactic: Tactic, packed: Any, device: str) -> Launcher: ...
    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]: ...
    def batch_invariant(self, problem: Problem, tactic: Tactic) -> bool: ...
    def code(self, tactic: Tactic) -> Code: ...
    def codes(self) -> Sequence[Code]: ...
    def with_compiler_figures(self, memo: Any) -> "Family": ...


class FamilyBase:
    """Defaults for the optional parts of `Family`; subclasses override what they have.

    Required: `name`, `depends_on`, `supports`, `enumerate`, `validate`, `verdict_checked`,
    `default`, `build`. `verdict` runs the shared steps (parameters valid, problem supported) once,
    so each family writes only its own rules in `verdict_checked`.
    """

    name: ClassVar[str]
    depends_on: ClassVar[tuple[str, ...]] = ()
    default_rank: ClassVar[int | None] = None
    compiles: ClassVar[bool] = False
    #: the family's declared sources (autotune.core.codekey); None: its own module and this one
    CODE: ClassVar[Code | None] = None

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def supports(self, problem: Problem) -> str | None:
        raise NotImplementedError

    def validate(self, tactic: Tactic) -> str | None:
        raise NotImplementedError

    def verdict(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        if tactic.family != self.name:
            return Verdict.reject(f"tactic of family {tactic.family!r}, not {self.name!r}")
        why = self.validate(tactic) or self.supports(problem)
        if why:
            return Verdict.reject(why)
        return self.verdict_checked(problem, tactic, arch)

    def verdict_checked(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        """The family's own rules, for a tactic whose parameters and problem already passed."""
        raise NotImplementedError

    def precompile(self, problem: Problem, tactic: Tactic, arch: Arch) -> int | None:
        """Compile ahead of timing for `arch`; return the compiler's shared-memory bytes, if known."""
        raise NotImplementedError(f"the {self.name} family does not compile ahead of time")

    def layout(self, tactic: Tactic) -> str:
        return PLAIN_LAYOUT

    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
        """What the tactic's launch looks like at M rows on a GPU with `sms` SMs, for the search's
        ranking model: `ctas` (programs launched), `threads` (per program), `m_util` (share of the
        row tiles holding real rows). {} when the family cannot say (cuBLAS picks its own grid)."""
        return {}

    def batch_invariant(self, problem: Problem, tactic: Tactic) -> bool:
        """True when a row's result does not depend on how many rows share the call: the same
        reduction order over K at every M (no split-K lowered by M, no library picking an
        algorithm per shape). False unless the family knows (`--batch-invariant` uses only these)."""
        return False

    def code(self, tactic: Tactic) -> Code:
        """The sources `tactic`'s measured numbers depend on (its member's kernel, launch and pack
        code), keyed into every trial and winner (autotune.core.codekey): `CODE`, else the family's
        own module and this one; a family with members answers per tactic."""
        return self.CODE or Code(self.name, tuple(sorted({type(self).__module__, __name__})))

    def with_compiler_figures(self, memo: Any) -> "Family":
        """This family asking the compiler where a static model cannot answer (a config outside
        the region it was checked on), each figure remembered in `memo` (the search's Store). The
        default: the family itself (it has no such model)."""
        return self

    def codes(self) -> Sequence[Code]:
        """Every member's Code (one per kernel; the default: the family's one)."""
        return (self.code(Tactic(self.name, {})),)

    def pack(self, layout: str, weight: FP4Weight) -> Any:
        """The weight in `layout`, produced once at load (never per call)."""
        if layout != PLAIN_LAYOUT:
            raise ValueError(f"the {self.name} family has no weight layout {layout!r}")
        return weight.contiguous()

    def pack_inplace(self, layout: str, weight: FP4Weight, *, already_packed: bool = False) -> Any | None:
        """The weight in `layout` written over its own storage, so a one-copy layer holds one copy
        (the checkpoint bytes are gone afterwards); None when the family cannot, and the layer
        uses `pack`. already_packed=True: the storage holds the layout already (an earlier
        pack_inplace, then moved by `.to()`): wrap it, never pack twice."""
        return None

    def bind(self, problem: Problem, tactic: Tactic, packed: Any, device: str) -> Launcher:
        """A launcher for one weight: the kernel with its packed weight fixed. The weight is
        checked against the problem here, once; a call checks only what it brings."""
        check_weight(problem, packed)
        return self.bind_kernel(problem, self.build(problem, tactic, device), packed)

    def bind_kernel(self, problem: Problem, kernel: Kernel, packed: Any) -> Launcher:
        """`bind` for an already built kernel(x, w, ...): the generic launcher around it."""
        if problem.kind == "grouped_moe":
            def launch_moe(x, topk_ids, topk_weights=None, out=None, routing_checked=False, **extra):
                # routing_checked: the caller (FP4MoE, once per layer) checked these ids already;
                # extra: kernel options such as a shared alignment (`aligned=`, moe_decode)
                check_x(problem, x, packed)
                if not routing_checked:
                    check_routing(problem, x, topk_ids, topk_weights)
                if out is not None:
                    check_out(problem, x, out)
                return kernel(x, packed, topk_ids, topk_weights, out=out, **extra)
            launch_moe.capture_safe = getattr(kernel, "capture_safe", False)  # type: ignore[attr-defined]
            launch_moe.weight = packed  # type: ignore[attr-defined]
            launch_moe.kernel = kernel  # type: ignore[attr-defined]
            return launch_moe

        check, check_o = x_checker(problem, packed), out_checker(problem)   # issue #17: cheap per-call form

        def launch(x, out=None):
            check(x)
            if out is not None:
                check_o(x, out)
            return kernel(x, packed, out=out)
        launch.capture_safe = getattr(kernel, "capture_safe", False)  # type: ignore[attr-defined]
        launch.weight = packed  # type: ignore[attr-defined]
        return launch
