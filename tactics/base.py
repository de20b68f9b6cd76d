"""The Family interface: the one way a backend plugs into the engine, the runtime and the cache.

A family turns a Problem into a tactic space, judges each tactic without compiling or launching
(`verdict`), and turns a kept tactic into a kernel (`build`) or a launcher bound to one weight
(`bind`). The engine, prepack and dispatch talk to families only through this interface and never
name one. `FamilyBase` gives the optional parts their defaults, so a family declares what it has
(precompile, a weight layout, a place in the default preference) instead of being probed for it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, ClassVar, Protocol, Sequence, runtime_checkable

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.formats import FP4Weight
from autotune.core.operands import check_out, check_routing, check_weight, out_checker, x_checker
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict

@dataclass(frozen=True, slots=True)
class Caps:
    """What a launcher can do, as one value: every launcher has `caps`, set once when it is made.

    A wrapper (a bound launcher, a checked one, a member's launcher around its kernel) passes its
    inner launcher's `caps` through whole, or a `dataclasses.replace` of it where it changes one,
    so no wrapper re-spells the flags and no caller probes for them. All default to False: a
    launcher says only what it has. Reading one is an attribute load (no allocation, no sync)."""

    #: no host sync and no allocation that a graph could not replay: may run under CUDA-graph capture
    capture_safe: bool = False
    #: a row's result does not depend on how many rows share the call (`Family.batch_invariant`)
    batch_invariant: bool = False
    #: grouped MoE: ids outside [-1, E) come out as NaN rows and a flag, so a caller may leave the
    #: range check (a host read) to the kernel
    checks_ids: bool = False
    #: launches with programmatic dependent launch (overlaps the previous kernel's tail)
    pdl: bool = False
    #: grouped MoE with a shared expert folded in as expert E - 1: takes `shared_slot=True`, then
    #: topk_ids / topk_weights are [M, top_k - 1] and every token's last slot is that expert with
    #: weight 1, added by the kernel (the caller concatenates nothing)
    shared_slot: bool = False
    #: grouped MoE: takes `prefetch=(packed, scales)`, the next kernel's stacked weights (each [E, ...],
    #: contiguous, 16-byte aligned, a multiple of 16 bytes per expert), and puts the slices of the
    #: experts this call routes to into L2 (a hint: results do not change)
    prefetches: bool = False
    #: grouped MoE: takes `scratch_out=True`: its output goes to one buffer of the scratch pool per
    #: (device, stream), reused by the next such call there — for an output the caller consumes at
    #: once on that stream (FP4MoE's h between w13 and w2), not one it returns
    scratch_out: bool = False


#: a launcher that can do none of these (the default)
NO_CAPS = Caps()


@runtime_checkable
class Launcher(Protocol):
    """What build and bind return, and all the engine and runtime may ask of it.

    `kernel(x, w, ...)` (build: the weight comes with every call, the `dispatch((M,N,K))(x, w)`
    form) and `launcher(x, ...)` (bind: one weight fixed and checked once; FP4Linear, FP4MoE,
    bound tables) differ only in the call. Subclass `LauncherBase` for the defaults: every
    launcher has every member below, so no caller probes for one."""

    #: what it can do (`Caps`); a wrapper carries its inner launcher's
    caps: Caps
    #: the compiled kernel's shared memory in bytes once it has compiled, where the family can say
    #: (the Triton family's w4a16 member); None otherwise
    smem_compiled: int | None

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def aligned_block_m(self, m: int) -> int | None:
        """Grouped MoE: BLOCK_M of the routing alignment a call with M tokens takes as `aligned=`
        (one a caller may make once and share), or None: it aligns nothing, or itself."""

    def aligner(self, experts: int, block_m: int) -> Callable[[Any], Any]:
        """`aligner(topk_ids) -> alignment` at `block_m` (asked only after `aligned_block_m`
        named one); `alignment.regroup(bm)` gives it at a smaller BLOCK_M that divides it."""

    def release(self) -> None:
        """Free the scratch it owns (workspaces, retired buffers, cached plans): the caller is done
        with it. A later call makes what it needs again."""

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        """At bind (the runtime): take workspaces from `scratch` (the dispatcher's ScratchPool,
        tactics/scratch.py, shared by every launcher it binds) instead of a private pool, and set
        `bad_word` (an int32 [1] device view) for ids outside [-1, E) instead of a word of its own.
        Either may be None (keep its own). A launcher with neither ignores the call."""

    def bad_word(self) -> Any:
        """Grouped MoE: the sticky int32 word it sets for ids outside [-1, E) (nothing on the
        forward path reads it), or None: it checks no ids (`caps.checks_ids` False)."""


#: the two call forms of one protocol (names kept for what a signature takes)
Kernel = Launcher


class LauncherBase:
    """Defaults for `Launcher`: no capabilities (`NO_CAPS`), no routing of its own, nothing to
    attach or release. Subclasses set `caps` (a class attribute, or per instance) and override
    what they have."""

    caps: Caps = NO_CAPS
    smem_compiled: int | None = None

    def aligned_block_m(self, m: int) -> int | None:
        return None

    def aligner(self, experts: int, block_m: int) -> Callable[[Any], Any]:
        raise NotImplementedError(f"{type(self).__name__} takes no shared routing alignment")

    def release(self) -> None:
        pass

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        pass

    def bad_word(self) -> Any:
        return None


class FunctionKernel(LauncherBase):
    """A plain function as a Launcher (a family's simple kernels, or one from a family that returns
    a function): the call, its caps (capture safety, batch invariance), and an optional `release`
    of what it holds."""

    __slots__ = ("fn", "caps", "_release", "weight")

    def __init__(self, fn: Callable[..., Any], *, capture_safe: bool = False,
                 release: Callable[[], None] | None = None, weight: Any = None, batch_invariant: bool = False):
        self.fn, self._release, self.weight = fn, release, weight
        self.caps = Caps(capture_safe=capture_safe, batch_invariant=batch_invariant)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def release(self) -> None:
        if self._release is not None:
            self._release()


def as_launcher(obj: Any) -> Launcher:
    """`obj` if it is a Launcher already, else a plain callable wrapped (capture-unsafe)."""
    if isinstance(obj, LauncherBase) or isinstance(obj, Launcher):
        return obj
    if not callable(obj):
        raise TypeError(f"a family returned {type(obj).__name__}, not a kernel")
    return FunctionKernel(obj)


class BoundKernel(LauncherBase):
    """`launch(x, out=None)`: a dense kernel(x, w, out=) with its weight fixed (checked at bind);
    a call checks x (and out) only. Its caps are the kernel's, batch invariance the binder's word
    (`Family.batch_invariant`); routing, attach and release are the kernel's."""

    __slots__ = ("problem", "kernel", "weight", "caps", "_call", "_check", "_check_out")

    def __init__(self, problem: Problem, kernel: Kernel, packed: Any, batch_invariant: bool = False):
        self.problem, self.kernel, self.weight = problem, kernel, packed
        self.caps = replace(kernel.caps, batch_invariant=batch_invariant)
        self._call = kernel.fn if isinstance(kernel, FunctionKernel) else kernel    # one call less per launch
        self._check, self._check_out = x_checker(problem, packed), out_checker(problem)

    @property
    def smem_compiled(self) -> int | None:  # type: ignore[override]
        return self.kernel.smem_compiled

    def __call__(self, x: Any, out: Any = None) -> Any:
        self._check(x)
        if out is not None:
            self._check_out(x, out)
        return self._call(x, self.weight, out=out)

    def release(self) -> None:
        self.kernel.release()

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        self.kernel.attach(scratch, bad_word)

    def bad_word(self) -> Any:
        return self.kernel.bad_word()

    def aligned_block_m(self, m: int) -> int | None:
        return self.kernel.aligned_block_m(m)

    def aligner(self, experts: int, block_m: int) -> Callable[[Any], Any]:
        return self.kernel.aligner(experts, block_m)


class BoundMoEKernel(BoundKernel):
    """`launch(x, topk_ids, topk_weights=None, out=None, routing_checked=False, **extra)`: a
    grouped kernel with its weight fixed. routing_checked: the caller (FP4MoE, once per layer)
    checked these ids already; extra: kernel options such as a shared alignment (`aligned=`)."""

    __slots__ = ()

    def __call__(self, x: Any, topk_ids: Any, topk_weights: Any = None, out: Any = None,  # type: ignore[override]
                 routing_checked: bool = False, **extra: Any) -> Any:
        problem, packed = self.problem, self.weight
        self._check(x)
        if not routing_checked and not extra.get("shared_slot"):   # with a shared slot the kernel's own check
            check_routing(problem, x, topk_ids, topk_weights)
        if out is not None:
            check_out(problem, x, out)
        return self._call(x, packed, topk_ids, topk_weights, out=out, **extra)


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
    #: the problem kinds it runs (Problem.kind: "dense", "grouped_moe"; a whole MoE layer's "moe_layer")
    kinds: tuple[str, ...]

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
    def useful(self, problem: Problem, tactic: Tactic, m: int) -> bool: ...
    def first_batch_member(self, problem: Problem) -> bool: ...
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
    #: the problem kinds it runs: `verdict` rejects any other before the family's own checks (a whole
    #: MoE layer, kind "moe_layer", runs in the families that declare it)
    kinds: ClassVar[tuple[str, ...]] = ("dense", "grouped_moe")
    #: the family's declared sources (autotune.core.codekey); None: its own module and this one
    CODE: ClassVar[Code | None] = None
    #: epilogues the family computes on dense problems (FP4MLP's `swiglu` gate_up): any other is
    #: rejected by `verdict` before the family's rules, so a family written before the variant
    #: existed never runs it as a plain GEMM (a silently wrong [M, N] result)
    dense_epilogues: ClassVar[tuple[str, ...]] = ("none",)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def supports(self, problem: Problem) -> str | None:
        raise NotImplementedError

    def validate(self, tactic: Tactic) -> str | None:
        raise NotImplementedError

    def build(self, problem: Problem, tactic: Tactic, device: str) -> Kernel:
        raise NotImplementedError

    def verdict(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        if tactic.family != self.name:
            return Verdict.reject(f"tactic of family {tactic.family!r}, not {self.name!r}")
        why = self.validate(tactic) or (None if problem.kind in self.kinds else
                                        f"the {self.name} family runs {', '.join(self.kinds)} problems, not {problem.kind}")
        why = why or self.supports(problem)
        if not why and problem.kind == "dense" and problem.epilogue not in self.dense_epilogues:
            why = f"the {self.name} family has no {problem.epilogue} epilogue on dense problems"
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

    def useful(self, problem: Problem, tactic: Tactic, m: int) -> bool:
        """Whether timing `tactic` at bucket M can pay (search cost, not correctness: the verdict says
        what runs). A kernel made for decode says False where its design makes it lose by
        construction (e.g. re-reading each expert's weight per token); the search then neither
        measures nor ranks it in that bucket. True unless the family knows."""
        return True

    def first_batch_member(self, problem: Problem) -> bool:
        """Whether the ranked search gives each of this family's kernels a slot of its own in a job's
        first batch (strategy.every_member) when the model ranks none of them there. False for a
        reference that loses by construction: it is then timed only where the model ranks it first
        or it is the designated default. True unless the family knows."""
        return True

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
        return self.bind_kernel(problem, self.build(problem, tactic, device), packed,
                                batch_invariant=self.batch_invariant(problem, tactic))

    def bind_kernel(self, problem: Problem, kernel: Kernel, packed: Any, batch_invariant: bool = False) -> Launcher:
        """`bind` for an already built kernel(x, w, ...): the generic launcher around it."""
        cls = BoundMoEKernel if problem.kind == "grouped_moe" else BoundKernel
        return cls(problem, as_launcher(kernel), packed, batch_invariant)
