"""The `cuda` family: a hand-written NVFP4/MXFP4 W4A16 decode GEMM (w4a16_mma.cu) compiled at run time by
NVRTC through CuPy, reading the weight in its own prepacked layout (layout.py).

Tactic parameters: `warps_k` (warps splitting K inside a CTA, reduced in a fixed order),
`stages` (depth of each thread's cp.async ring), `tiles_n` (16-row weight tiles per CTA: more
bytes per thread and per CTA, the activation loads and loop overhead shared) and, on split-K
tactics only, `split_k` (CTAs splitting K, summed in split order by the last to arrive: dense.py).
Dense problems with the `swiglu` epilogue (FP4MLP's gate_up) run the same kernel with gate/up
tile pairs and the SwiGLU epilogue. The M tile (8, 16, 32 or 64 rows of x per CTA)
is picked per call from M; each is its own compiled variant. Verdicts are exact by construction:
the shared memory is the static array the source declares (`build.smem_bytes`, checked against
`ptxas -v` in CI); registers and spills are only known from a compile, so `precompile` and the
first launch compile every M variant and refuse one that uses local memory, with its numbers.
CuPy is imported only when a kernel is built: without it the family is unavailable, not broken.
"""
from __future__ import annotations

import weakref
from typing import Any, cast

from autotune.core.codekey import Code
from autotune.core.arch import Arch
from autotune.core.formats import FP4Weight
from autotune.core.layer import LayerProblem
from autotune.core.operands import OperandError, check_weight
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import Caps, FamilyBase, LauncherBase, as_launcher

from . import build as B
from . import checked as CK
from .build import m_tiles_for  # noqa: F401  (re-exported: the family's M rule)
from . import dense as D
from . import layout as L
from . import inplace as INPLACE
from . import members as M
from . import moe as MOE
from . import moe_layer as LAYER
from . import moe_search as MOE_SEARCH
from .dense import STAGES, STATIC_SMEM_LIMIT, TILES_N, WARPS_K, config  # noqa: F401  (re-exported)
_NO_CUPY = "CuPy is not installed (pip install fp4-autotune[cuda13] or [cuda12])"
#: while the dense kernel's text has not passed its GPU tests (checked.py, tests/test_cuda_gpu.py) a
#: tactic that fits is `unknown` (its shared memory exact, its results unseen on hardware), so a
#: search measures it only with --measure-unknown
DENSE_UNRUN = CK.unrun(B.KERNEL)


def dense_gpu_checked() -> bool:
    """Whether w4a16_mma's current text has passed its GPU tests (gpu_checked.json)."""
    return CK.checked(B.KERNEL)


def arch_target(arch: Arch) -> str:
    return f"sm_{arch.cc_int}"


def check_tiling(problem: Problem, tactic: Tactic) -> str | None:
    """The tactic's tiles divide the problem (dense.check_tiling): the kernel assumes it, so the
    verdict, build and bind all refuse a problem that breaks it."""
    return D.check_tiling(problem, tactic)


def check_aligned(p: L.CudaPacked) -> str | None:
    """The pack's storage is what the kernel reads: contiguous fragment words at a 16-byte address
    (cp.async.cg 16 B), scale words at 4 bytes (cp.async.ca 4 B), the fp32 global scale at 4. A
    pack wrapped over checkpoint storage (pack_inplace, wrap) is not guaranteed any of it."""
    if not (p.packed.is_contiguous() and p.scales.is_contiguous()):
        return f"the {L.LAYOUT} pack is not contiguous"
    for what, t, a in (("packed", p.packed, 16), ("scales", p.scales, 4), ("global_scale", p.global_scale, 4)):
        if t.data_ptr() % a:
            return f"the {L.LAYOUT} pack's {what} is at address {t.data_ptr():#x}, not {a}-byte aligned " \
                   "(the kernel's cp.async needs it); pack a copy"
    return None


class _PackCache:
    """Plain FP4Weights given to `kernel(x, w)` packed once per weight object (held weakly); the
    search passes the packed form itself (engine.worker packs each input set once per bucket)."""

    def __init__(self) -> None:
        self._items: "weakref.WeakKeyDictionary[Any, L.CudaPacked]" = weakref.WeakKeyDictionary()
        self._aligned: Any = None          # weakref to the last pack found aligned (frozen: its tensors stay those checked)

    def __call__(self, w: Any) -> L.CudaPacked:
        if self._aligned is not None and self._aligned() is w:    # a bound launcher passes one pack every call
            return w
        if isinstance(w, L.CudaPacked):
            why = check_aligned(w)
            if why:
                raise OperandError(f"cuda family: {why}")
            self._aligned = weakref.ref(w)                        # weak: a kernel kept past its job pins no pack
            return w
        if not isinstance(w, FP4Weight):
            raise OperandError(f"cuda family: expected an FP4Weight or its {L.LAYOUT} pack, got {type(w).__name__}")
        p = self._items.get(w)
        if p is None:
            p = self._items[w] = L.pack_experts(w.contiguous()) if w.packed.ndim == 3 else L.pack(w)
        return p

    def clear(self) -> None:
        self._items.clear()
        self._aligned = None


class _Packing(LauncherBase):
    """What `build` returns: `kernel(x, w, ...)`, the runner (dense, or grouped: MoeLaunch, TokLaunch,
    a test family's) on a weight packed once (`_PackCache`: a plain FP4Weight, or the pack itself).
    Its caps, routing, `attach` and bad-id word are the runner's; `release` frees both."""

    __slots__ = ("run", "cache", "caps")

    def __init__(self, run: Any) -> None:
        self.run, self.cache, self.caps = run, _PackCache(), run.caps

    def __call__(self, x: Any, w: Any, *routing: Any, **kw: Any) -> Any:
        return self.run(x, self.cache(w), *routing, **kw)

    def aligned_block_m(self, m: int) -> int | None:
        return self.run.aligned_block_m(m)

    def aligner(self, experts: int, block_m: int) -> Any:
        return self.run.aligner(experts, block_m)

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        self.run.attach(scratch, bad_word)

    def bad_word(self) -> Any:
        return self.run.bad_word()

    def release(self) -> None:
        self.run.release()
        self.cache.clear()


class _LayerPacking(LauncherBase):
    """What `build` returns for a whole MoE layer (kind moe_layer): `kernel(x, w13, w2, topk_ids,
    topk_weights, out=None, shared_slot=False)`, the layer kernel (moe_layer.LayerLaunch on the
    layer's w13 problem) on both weights packed once each (`_PackCache`: plain FP4Weights or their
    packs; FP4MoE hands it the packs its two bindings hold). Built on a GPU, its protocol words are
    allocated and its kernel loaded at once (`LayerLaunch.warm`: refused under capture), so every
    call after is capture-safe. Ids outside [-1, E) come out as NaN rows and set its bad-id word
    (`bad_word`); the folded shared expert is added by the kernel (`shared_slot=True`)."""

    __slots__ = ("run", "w13", "w2", "caps")

    def __init__(self, run: Any, device: str) -> None:
        self.run, self.w13, self.w2 = run, _PackCache(), _PackCache()
        self.caps = Caps(capture_safe=True, checks_ids=True, shared_slot=True)
        if str(device).startswith("cuda"):
            run.warm()

    def __call__(self, x: Any, w13: Any, w2: Any, topk_ids: Any, topk_weights: Any = None, out: Any = None,
                 shared_slot: bool = False) -> Any:
        return self.run(x, self.w13(w13), self.w2(w2), topk_ids, topk_weights, out=out, shared_slot=shared_slot)

    def bad_word(self) -> Any:
        return self.run.words()[3]

    def release(self) -> None:
        self.w13.clear()
        self.w2.clear()


def _layer(problem: Any) -> LayerProblem:
    """A whole MoE layer (kind moe_layer): its pair problems are `.w13` and `.w2`."""
    return cast(LayerProblem, problem)


def _own(problem: Any) -> Problem:
    """The problem a member's rules and configs take: a whole layer's is its w13 (the layer kernel's
    convention), any other problem itself."""
    return _layer(problem).w13 if problem.kind == "moe_layer" else problem


def member_of(tactic: Tactic) -> M.Member | None:
    """The member running `tactic` (members.py: by its `kernel` parameter), None for none."""
    try:
        return M.member_of(tactic)
    except ValueError:
        return None


class CudaFamily(FamilyBase):
    name = "cuda"
    #: each member's sources (autotune.core.codekey): its own text, the shared parts it includes and its
    #: launch Python (members.Member.code), as narrow as its GPU-check record
    CODE, MOE_CODE, TOK_CODE = (M.by_kernel()[k].code for k in (B.KERNEL, B.MOE_KERNEL, B.TOK_KERNEL))
    depends_on = ("cupy", "torch")       # CuPy brings NVRTC (the cubin cache also keys its version)
    default_rank = None
    compiles = True
    dense_epilogues = ("none", "swiglu")
    kinds = ("dense", "grouped_moe", "moe_layer")

    def code(self, tactic: Tactic) -> Code:
        m = member_of(tactic)
        if m is None:
            raise ValueError(f"cuda: no member runs {tactic}")
        return m.code

    def codes(self) -> tuple[Code, ...]:
        return tuple(m.code for m in M.REGISTRY)

    def available(self, device: str) -> tuple[bool, str]:
        if not str(device).startswith("cuda"):
            return False, "the cuda family runs on CUDA devices only"
        try:
            import cupy  # noqa: F401
        except ImportError:
            return False, _NO_CUPY
        return True, ""

    def supports(self, problem: Problem) -> str | None:
        if problem.kind == "moe_layer":       # a whole MoE layer: its w13 (SwiGLU) and w2 as the layer kernel runs them
            return MOE.supports(_layer(problem).w13) or MOE.supports(_layer(problem).w2)
        if problem.kind == "grouped_moe":
            return MOE.supports(problem)
        if problem.kind != "dense":
            return f"cuda family: dense and grouped_moe problems only, not {problem.kind}"
        if problem.w_fmt not in L.FORMAT or problem.a_fmt != "bf16" or problem.out_dtype != "bf16":
            return (f"cuda family: nvfp4/mxfp4 weights, bf16 x and y only, not "
                    f"{problem.w_fmt}/{problem.a_fmt}/{problem.out_dtype}")
        if problem.epilogue not in self.dense_epilogues:
            return f"cuda family: no {problem.epilogue} epilogue on dense problems"
        return L.check_shape(problem.n, problem.k)

    def validate(self, tactic: Tactic) -> str | None:
        m = member_of(tactic)                  # the grouped members name their kernel; dense tactics do not
        if m is None:
            return (f"cuda: kernel={tactic.params.get('kernel')!r} is none of "
                    f"{', '.join(x.tactic_kernel for x in M.REGISTRY if x.tactic_kernel)}")
        return m.impl().validate(tactic)

    def enumerate(self, problem: Problem, arch: Arch) -> list[Tactic]:
        if self.supports(problem):
            return []
        if problem.kind == "moe_layer":       # the layer kernel's kept tactics (its member's space, for a
            # grouped problem, is empty: it is measured where it competes with the pair, a layer's search)
            return [Tactic(self.name, **t.params) for t in LAYER.layer_space(_layer(problem).w13, arch)]
        grouped = problem.kind == "grouped_moe"
        # the members name the family "cuda": the tactics carry this family's name (a subclass's, too)
        return [Tactic(self.name, **t.params) for m in M.REGISTRY if m.impl().grouped == grouped
                for t in m.impl().space(problem, arch)]

    def verdict_checked(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        m = member_of(tactic)
        layer = problem.kind == "moe_layer"
        if layer != (m.kernel == LAYER.KERNEL) or (not layer and m.impl().grouped != (problem.kind == "grouped_moe")):
            return Verdict.reject(f"a {m.kernel if m.tactic_kernel else 'dense'} cuda tactic on a {problem.kind} problem")
        v = m.impl().verdict(_own(problem), tactic, arch)
        if v.ok is True and not CK.checked(m.kernel):
            return Verdict(None, CK.unrun(m.kernel), v.smem_bytes, v.smem_limit, v.stages)
        return v

    def default(self, problem: Problem, arch: Arch) -> Tactic:
        if problem.kind == "moe_layer":
            kept = LAYER.layer_space(_layer(problem).w13, arch)
            if not kept:
                raise ValueError(f"cuda: no layer kernel tactic fits {problem.key} on {arch.name}")
            return Tactic(self.name, **kept[0].params)
        grouped = problem.kind == "grouped_moe"
        for m in M.REGISTRY:
            if m.impl().grouped == grouped and (t := m.impl().default(problem, arch)) is not None:
                return Tactic(self.name, **t.params)
        raise ValueError(f"cuda: no member offers a default for {problem.key}")

    def precompile(self, problem: Problem, tactic: Tactic, arch: Arch) -> int | None:
        """NVRTC-compile every M variant into the cubin cache (no GPU needed); refuse spills."""
        from cupy.cuda import function  # noqa: F401  (import error = not available)
        smem = 0
        for c in member_of(tactic).impl().configs(_own(problem), tactic):
            B.nvrtc_cubin(c, arch_target(arch))
            smem = max(smem, B.smem_bytes(c))
        return smem

    # ---- layout ---------------------------------------------------------------------------------
    def layout(self, tactic: Tactic) -> str:
        """The cuda pack (the layer kernel's two weights each in it)."""
        return L.LAYOUT

    def pack(self, layout: str, weight: FP4Weight) -> Any:
        if layout != L.LAYOUT:
            return super().pack(layout, weight)
        if weight.packed.ndim == 3:                      # stacked experts: the grouped kernel's
            return L.pack_experts(weight.contiguous())
        return L.pack(weight.contiguous())

    def pack_inplace(self, layout: str, weight: FP4Weight, *, already_packed: bool = False) -> Any | None:
        if weight.packed.ndim == 3:           # stacked experts: expert by expert over their own bytes
            if layout != L.LAYOUT or not (weight.packed.is_contiguous() and weight.scales.is_contiguous()):
                return None
            return INPLACE.wrap_experts(weight) if already_packed else INPLACE.pack_experts_inplace(weight)
        if weight.packed.ndim != 2:
            return None
        if layout != L.LAYOUT or not (weight.packed.is_contiguous() and weight.scales.is_contiguous()) \
                or weight.fmt != "nvfp4":
            return None                       # a strided (or MXFP4) weight gets its own packed copy
        return L.wrap(weight) if already_packed else L.pack(weight, inplace=True)

    # ---- kernels --------------------------------------------------------------------------------
    def _runner(self, problem: Problem, tactic: Tactic, device: str):
        """`run(x, packed, out=None)`: the kernel on a checked, aligned CudaPacked (the one thing a
        test family replaces). CuPy is imported here, after every check of build and bind."""
        return member_of(tactic).impl().runner(problem, tactic, device)

    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
        return member_of(tactic).impl().figures(problem, tactic, m, sms)

    def useful(self, problem: Problem, tactic: Tactic, m: int) -> bool:
        if problem.kind == "moe_layer":       # the layer kernel's scope: M·top_k pairs <= its h rows
            return m * problem.top_k <= LAYER.MAX_PAIRS
        return MOE_SEARCH.useful(problem, tactic, m)

    def batch_invariant(self, problem: Problem, tactic: Tactic) -> bool:
        """Both kernels: a row's (pair's) K order is fixed by the tactic (warps in warp order, splits
        in split order) whatever the batch, the M tile, the row chunk, the group or the token chunk;
        the MMA's columns (rows of x, pairs) do not mix (dense.py)."""
        return member_of(tactic).impl().grouped == (problem.kind == "grouped_moe")

    def _moe_runner(self, problem: Problem, tactic: Tactic, device: str):
        """`run(x, packed, topk_ids, topk_weights=None, out=None)` on a checked stacked pack (what a
        test family replaces); CuPy is imported here, after every check of build and bind."""
        return member_of(tactic).impl().runner(problem, tactic, device)

    def _layer_runner(self, problem: Problem, tactic: Tactic, device: str):
        """`run(x, w13, w2, topk_ids, topk_weights=None, out=None)` on two checked stacked packs, for the
        layer whose w13 problem is `problem` (what a test family replaces)."""
        return member_of(tactic).impl().runner(problem, tactic, device)

    def _moe_checks(self, problem: Problem, tactic: Tactic) -> str | None:
        why = self.validate(tactic) or self.supports(problem)
        if not why and not member_of(tactic).impl().grouped:
            why = "a dense cuda tactic on a grouped_moe problem"
        return why or MOE.check_tiling(problem, tactic)

    def build(self, problem: Problem, tactic: Tactic, device: str):
        if problem.kind == "moe_layer":
            why = self.validate(tactic) or self.supports(problem) or (
                None if member_of(tactic).kernel == LAYER.KERNEL else f"a {tactic} tactic on a moe_layer problem")
            if why:
                raise ValueError(f"{problem.key} {tactic}: {why}")
            return _LayerPacking(self._layer_runner(_own(problem), tactic, device), device)
        if problem.kind == "grouped_moe":
            why = self._moe_checks(problem, tactic)
            if why:
                raise ValueError(f"{problem.key} {tactic}: {why}")
            return _Packing(self._moe_runner(problem, tactic, device))
        why = self.validate(tactic) or self.supports(problem) or check_tiling(problem, tactic)
        if why:
            raise ValueError(f"{problem.key} {tactic}: {why}")
        return _Packing(as_launcher(self._runner(problem, tactic, device)))

    def bind(self, problem: Problem, tactic: Tactic, packed: Any, device: str):
        """The weight checked once (its layout, shape, tiling, alignment), then the shared bound
        launcher (FamilyBase.bind_kernel) around the runner: no pack cache on the hot path."""
        if not isinstance(packed, L.CudaPacked):
            raise TypeError(f"cuda: bind needs the {L.LAYOUT} packed weight, got {type(packed).__name__}")
        check_weight(problem, packed)
        if problem.kind == "grouped_moe":
            why = self._moe_checks(problem, tactic) or check_aligned(packed)
            if not why and packed.experts != problem.experts:
                why = f"the pack holds {packed.experts} stacked experts, the problem {problem.experts}"
            if why:
                raise ValueError(f"{problem.key} {tactic}: {why}")
            return self.bind_kernel(problem, self._moe_runner(problem, tactic, device), packed,
                                    batch_invariant=self.batch_invariant(problem, tactic))
        why = self.validate(tactic) or check_tiling(problem, tactic) or check_aligned(packed)
        if why:
            raise ValueError(f"{problem.key} {tactic}: {why}")
        return self.bind_kernel(problem, self._runner(problem, tactic, device), packed,
                                batch_invariant=self.batch_invariant(problem, tactic))
