"""`moe_decode`: the decode-shaped grouped MoE member (bf16 activations × stacked NVFP4/MXFP4 experts).

Kernel: moe_decode_kernel.py (grid over routed row groups × N tiles × K splits; direct routing or
moe_align's blocks; split-K reduced deterministically in the same launch; SwiGLU epilogue).

This module is the member: its config space (`space`, a tuple of dict configs), a pure `verdict`
(no Triton import, no compile), the shared-memory model it uses (`smem_bytes`, checked against
Triton 3.9 cross-compiles by tests/test_moe_decode.py through `cross_compile`), and the launcher
factory `make_launcher(problem, config, epilogue="none")` → callable
`(x, w, topk_ids, topk_weights=None, out=None, aligned=None)`.
`MEMBER` (MoEDecodeMember, at the end) is its registration in the `triton` family (family.py).

Epilogues (each is its own problem variant for the search; the problem key cannot say so yet):
"none" → [M, top_k, N]; "swiglu" (w13 with vLLM's [gate; up] rows) → [M, top_k, N/2] =
silu(x·W_gateᵀ)·(x·W_upᵀ); "reduce" (w2) → [M, N] = Σ_slot y[:, slot] (deterministic slot order).
Every epilogue multiplies by the routing weight when topk_weights is given.

Routes: "direct" reads topk_ids as they are (no alignment launch); above DIRECT_MAX_PAIRS pairs a
direct launcher runs the aligned route instead (its programs would each scan every id), so each
config stays valid at every M, like the dense member's split_k. "aligned" takes an `Alignment`
from moe_align (`aligned=`, shared by a layer's w13 and w2 when their BLOCK_M agree) or makes one.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from autotune.core.arch import Arch
from autotune.core.settings import check_ids as _check_ids_setting
from autotune.core.codekey import Code
from autotune.core.operands import x_per_pair
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict

from . import compat as _compat
from . import smem as _smem
from autotune.tactics.base import Caps, LauncherBase
from autotune.tactics.scratch import PoolUser, capturing, stream_key

from .member import FAMILY, SHARED_CODE, check_axes, grid

KERNEL = "moe_decode"
PARAMS = ("block_k", "block_m", "block_n", "kernel", "num_stages", "num_warps", "route", "split_k")
ROUTES = ("direct", "aligned")
EPILOGUES = ("none", "swiglu", "reduce")
#: direct route above this many (token, slot) pairs: the aligned route instead
DIRECT_MAX_PAIRS = 256
#: a split-K launch never takes a workspace larger than this: larger M is cut into token chunks
MAX_WORKSPACE_BYTES = 256 << 20
MIN_BLOCK_K = {"nvfp4": 64, "mxfp4": 128}
_SPLITS = (1, 2, 4, 8, 16)


#: per route, the axes of its grid (the order of enumeration); `TritonFamily.space_axes` replaces axes.
#: Direct: 16-row groups (decode rarely routes more pairs to one expert); aligned: 16–64 rows.
#: 4 warps throughout (the tiles are small); split-K up to 16 for the long-K w13 at small M.
GRIDS: dict[str, dict[str, tuple]] = {
    "direct": {"block_m": (16,), "block_n": (32, 64, 128), "block_k": (128, 256), "split_k": _SPLITS,
               "num_warps": (4,), "num_stages": (3, 4)},
    "aligned": {"block_m": (16, 32, 64), "block_n": (32, 64, 128), "block_k": (128, 256), "split_k": (1, 4, 16),
                "num_warps": (4,), "num_stages": (3, 4)},
}
#: each parameter's allowed values (core.tactic.check_params); `validate` checks the same
SCHEMA: dict[str, tuple] = {"kernel": (KERNEL,), "route": ROUTES, "block_m": (16, 32, 64), "block_n": (32, 64, 128, 256),
                            "block_k": (64, 128, 256), "split_k": _SPLITS, "num_warps": (4, 8),
                            "num_stages": (2, 3, 4, 5, 6)}


def grid_configs(axes: Mapping[str, tuple] | None = None) -> tuple[dict[str, Any], ...]:
    """Every config of each route's grid, with `axes` replacing some of its axes."""
    return tuple(dict(kernel=KERNEL, route=route, **g) for route, axes_of in GRIDS.items() for g in grid(axes_of, axes))


SPACE: tuple[dict[str, Any], ...] = grid_configs()


def space(problem: Any, arch: Any) -> tuple[dict[str, Any], ...]:
    """The configs `verdict` keeps for this problem and arch."""
    return tuple(c for c in SPACE if verdict(problem, c, arch).ok)


def default(problem: Any, arch: Any = None) -> dict[str, Any]:
    """Direct route, 16×64 tiles, K split so a few tokens still spread over the GPU."""
    bk = 256 if problem.k % 256 == 0 else 128
    steps = problem.k // bk
    sk = max((s for s in _SPLITS if s == 1 or steps >= 2 * s and s <= 8), default=1)
    return dict(kernel=KERNEL, route="direct", block_m=16, block_n=64, block_k=bk, split_k=sk, num_warps=4,
                num_stages=3)


def validate(config: Mapping[str, Any]) -> str | None:
    if tuple(sorted(config)) != PARAMS:
        return f"moe_decode config needs exactly the parameters {PARAMS}, got {tuple(sorted(config))}"
    if config["kernel"] != KERNEL:
        return f"kernel must be {KERNEL!r}, got {config['kernel']!r}"
    if config["route"] not in ROUTES:
        return f"route must be one of {ROUTES}, got {config['route']!r}"
    for k in PARAMS:
        v = config[k]
        if k not in ("kernel", "route") and (not isinstance(v, int) or isinstance(v, bool)):
            return f"{k} must be an int, got {v!r}"
    if config["block_m"] not in SCHEMA["block_m"] or config["block_n"] not in SCHEMA["block_n"]:
        return f"block_m must be one of {SCHEMA['block_m']} and block_n one of {SCHEMA['block_n']}"
    if config["block_k"] not in SCHEMA["block_k"] or config["split_k"] not in SCHEMA["split_k"]:
        return f"block_k must be one of {SCHEMA['block_k']} and split_k one of {SCHEMA['split_k']}"
    if config["num_warps"] not in SCHEMA["num_warps"] or config["num_stages"] not in SCHEMA["num_stages"]:
        return f"num_warps must be one of {SCHEMA['num_warps']} and num_stages one of {SCHEMA['num_stages']}"
    return None


def supported(problem: Any) -> str | None:
    if getattr(problem, "kind", None) != "grouped_moe":
        return f"moe_decode runs grouped_moe problems, not {getattr(problem, 'kind', None)!r}"
    if problem.a_fmt != "bf16" or problem.out_dtype != "bf16":
        return f"moe_decode needs bf16 activations and output, not {problem.a_fmt} -> {problem.out_dtype}"
    if problem.w_fmt not in MIN_BLOCK_K:
        return f"moe_decode needs nvfp4/mxfp4 weights, not {problem.w_fmt}"
    return None


def smem_bytes(config: Mapping[str, Any], w_fmt: str, arch: Any) -> int:
    """metadata.shared of the decode kernel. Its main loop is the dense kernel's (kernel.py) with
    gathered x rows, so the pipeline term is smem.smem_bytes's; the epilogues (split-K reduction,
    SwiGLU split, reduce) convert no layout through shared memory. Equal to Triton 3.9's figure on
    every cross-compiled sample (tests/test_moe_decode.py: sm90, sm120; by hand also sm89, sm100).
    Not compared with Triton 3.6's on the H200 (the bench did not record metadata.shared)."""
    return _smem.smem_bytes(config, w_fmt, arch)


def rules(problem: Any, config: Mapping[str, Any], arch: Any) -> str | None:
    """The rejection rules beside memory: scale rows wide enough, K and N tiled exactly, ≥ 2 K-steps
    per split, sm80+. For a validated config and a supported problem."""
    bk, bn = config["block_k"], config["block_n"]
    if bk < MIN_BLOCK_K[problem.w_fmt]:
        return (f"BLOCK_K={bk} < {MIN_BLOCK_K[problem.w_fmt]} for {problem.w_fmt} (scale rows under "
                "4 bytes are not cp.async-pipelined; not covered by the smem model)")
    if problem.k % bk:
        return f"BLOCK_K={bk} does not divide K={problem.k} (the kernel does not mask K)"
    if problem.n % bn:
        return f"BLOCK_N={bn} does not divide N={problem.n} (the kernel does not mask N)"
    steps = problem.k // bk
    if config["split_k"] > 1 and steps < 2 * config["split_k"]:
        return f"split_k={config['split_k']} leaves < 2 of the K/BLOCK_K={steps} steps per split"
    if getattr(arch, "is_gpu", True) and arch.cc[0] < 8:
        return f"{arch.name}: the kernel needs sm80 or newer (bf16 tl.dot)"
    return None


def verdict(problem: Any, config: Mapping[str, Any], arch: Any) -> Verdict:
    why = validate(config) or supported(problem)
    if why:
        return Verdict.reject(why)
    stages = config["num_stages"]
    why = rules(problem, config, arch)
    if why:
        return Verdict.reject(why, stages=stages)
    if not getattr(arch, "is_gpu", True):
        return Verdict.keep(stages=stages)          # cpu pseudo-arch: the interpreter, no smem limit
    why = _compat.rejection(KERNEL, problem.w_fmt, arch)
    if why:
        return Verdict.reject(why, stages=stages)
    need, limit = smem_bytes(config, problem.w_fmt, arch), arch.smem_per_block_optin
    if need > limit:
        return Verdict.reject(f"smem {need} > {limit}", smem=need, limit=limit, stages=stages)
    if _smem.tmem_columns(config, problem.w_fmt, arch) > 512:
        return Verdict.reject("tmem columns > 512", smem=need, limit=limit, stages=stages)
    return Verdict.keep(need, limit, stages)


# ---- compile ------------------------------------------------------------------------------------

def constexprs(problem: Any, config: Mapping[str, Any], epilogue: str = "none", routed: bool = False,
               interpret: bool = False, aligned: bool | None = None, split_k: int | None = None,
               gs_per_expert: bool = False, x_pair: bool | None = None) -> dict[str, int]:
    from .moe_decode_kernel import SCAN
    fmt = problem.w_fmt
    return {"BLOCK_M": int(config["block_m"]), "BLOCK_N": int(config["block_n"]), "BLOCK_K": int(config["block_k"]),
            "SPLIT_K": int(split_k or config["split_k"]), "TOP_K": int(problem.top_k),
            "NUM_EXPERTS": int(problem.experts), "SCALE_GROUP": 16 if fmt == "nvfp4" else 32,
            "SCALE_E4M3": 1 if fmt == "nvfp4" else 0, "GS_STRIDE": int(gs_per_expert),
            "ALIGNED": int(config["route"] == "aligned" if aligned is None else aligned),
            "X_PAIR": int(epilogue == "reduce" if x_pair is None else x_pair),
            "SWIGLU": int(epilogue == "swiglu"), "REDUCE": int(epilogue == "reduce"), "ROUTED_WEIGHT": int(routed),
            "SCAN_W": SCAN,
            "DEQ_ASM": 0 if interpret else 1, "DOT_F32": 1 if interpret else 0}


def source(problem: Any, config: Mapping[str, Any], epilogue: str = "none", routed: bool = True,
           gs_per_expert: bool = False) -> tuple[Any, dict[str, int]]:
    # x one row per pair exactly for "reduce" (what the problem variant takes)
    """(ASTSource, options) of the kernel for `config`: pointers, N and K carry tt.divisibility 16,
    as the launcher's calls do. Imports Triton."""
    from . import moe_decode_kernel as K
    from .compile import ast_source

    consts = constexprs(problem, config, epilogue, routed, gs_per_expert=gs_per_expert)
    src = ast_source(K.moe_decode_kernel, K.ARG_NAMES, K.ARG_TYPES, K.DIVISIBLE, consts)
    return src, {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}


def cross_compile(problem: Any, config: Mapping[str, Any], arch_or_cc: Any, epilogue: str = "none",
                  routed: bool = True, stop_at: str = "llir", gs_per_expert: bool = False) -> int:
    """Compile for a CUDA target without a GPU (compile.py's method and stage hook) and return
    metadata.shared."""
    from .compile import compile_kernel

    src, options = source(problem, config, epilogue, routed, gs_per_expert)
    return int(compile_kernel(src, options, arch_or_cc, stop_at=stop_at).metadata.shared)


# ---- launch -------------------------------------------------------------------------------------

def is_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def make_launcher(problem: Any, config: Mapping[str, Any], epilogue: str | None = None,
                  check_ids: bool | None = None) -> "MoEDecodeLauncher":
    """`epilogue` None: the problem's own (Problem.epilogue); a "none" problem may also be run with
    another epilogue (the bench compares the forms on one problem). check_ids None:
    $AUTOTUNE_CHECK_IDS (off by default: no host read after a call)."""
    own = getattr(problem, "epilogue", "none")
    epilogue = own if epilogue is None else epilogue
    why = validate(config) or supported(problem)
    if not why and own != "none" and epilogue != own:
        why = f"the problem's epilogue is {own}, not {epilogue}"
    if not why and epilogue not in EPILOGUES:
        why = f"epilogue must be one of {EPILOGUES}, got {epilogue!r}"
    if not why and (problem.k % config["block_k"] or problem.n % config["block_n"]):
        why = f"block_k {config['block_k']} / block_n {config['block_n']} must divide K={problem.k} / N={problem.n}"
    if why:
        raise ValueError(why)
    return MoEDecodeLauncher(problem, dict(config), epilogue, _check_ids_setting() if check_ids is None else check_ids)


def chunk_tokens(params: Mapping[str, Any], problem: Any) -> int | None:
    """Tokens per launch of a split-K tactic (None without split-K: one launch takes any M). The
    workspace [SPLIT_K, P, N] fp32 grows with M; past MAX_WORKSPACE_BYTES the call is cut into token
    chunks, each with the tactic's whole split and its own alignment. The split is never lowered
    (it was until 2026-12-01), so a row's K order is the same at every M."""
    sk = params["split_k"]
    if sk == 1:
        return None
    return max(1, MAX_WORKSPACE_BYTES // (sk * problem.top_k * problem.n * 4))


class MoEDecodeLauncher(PoolUser, LauncherBase):
    """(x, w, topk_ids, topk_weights=None, out=None, aligned=None) → bf16 [M, top_k, N] (or N/2 with
    the SwiGLU epilogue). Takes its split-K workspace, counters and reduce rows from a ScratchPool
    (its own, or the dispatcher's after `attach`: one launch at a time per stream) and sets a sticky
    bad-id word (`bad`; its own or the attached one): rows of pairs with ids outside [-1, E) are
    NaN, never a plausible value. Nothing is read on the host by default: the caller reads the word
    when it likes (FP4MoE.routing_errors(), once per step). With check_ids (make_launcher's
    check_ids=True or $AUTOTUNE_CHECK_IDS=1) an eager call reads it after the launch (one 4-byte
    read, a host sync) and raises ValueError; graph capture skips the read."""

    #: capture_safe: no host sync under CUDA-graph capture (alignment on the device, buffers sized
    #: by M, the bad-id read skipped): the runtime may capture it (runtime/nn.py); checks_ids: rows
    #: of ids outside [-1, E) come out NaN and set `bad`: a caller may leave the range check to it
    caps = Caps(capture_safe=True, checks_ids=True)

    def __init__(self, problem: Any, config: dict[str, Any], epilogue: str, check_ids: bool = True):
        self.problem, self.params, self.epilogue, self.check_ids = problem, config, epilogue, check_ids
        self.interpret = is_interpreting()
        self.compiled = None
        self.smem_compiled: int | None = None
        self.smem_model: int | None = None
        self._init_pool()
        self._aligner = None
        self.n_out = problem.n // 2 if epilogue == "swiglu" else problem.n

    def check(self, x, w, topk_ids, topk_weights, out):
        """Operand checks (one-line ValueError); returns (M, out). x: [M, K] (a row per token) or
        [M, top_k, K] (a row per pair)."""
        import torch
        prob = self.problem
        e, n, k = prob.experts, prob.n, prob.k
        # the reduce epilogue reads a row per pair, SwiGLU a row per token, a plain problem either
        dims = 3 if x_per_pair(prob, x) else 2
        if (not torch.is_tensor(x) or x.dim() != dims or x.dtype != torch.bfloat16 or x.shape[-1] != k
                or (dims == 3 and x.shape[1] != prob.top_k)):
            want = f"[M, {prob.top_k}, {k}] (a row per pair)" if dims == 3 else f"[M, {k}]"
            raise ValueError(f"x must be a bf16 {want} tensor for {prob.key}, got "
                             f"{tuple(getattr(x, 'shape', ()))} {getattr(x, 'dtype', type(x))}")
        if x.device.type != "cuda" and not self.interpret:
            raise ValueError(f"x is on {x.device}: the kernel needs a CUDA device")
        if getattr(w, "fmt", None) != prob.w_fmt:
            raise ValueError(f"weight format {getattr(w, 'fmt', None)} does not match the problem's {prob.w_fmt}")
        if tuple(w.packed.shape) != (e, n, k // 2) or tuple(w.scales.shape) != (e, n, k // prob.block):
            raise ValueError(f"weight packed {tuple(w.packed.shape)} / scales {tuple(w.scales.shape)} are not "
                             f"[E={e}, N={n}, K/2={k // 2}] / [E, N, K/{prob.block}]")
        if w.packed.device != x.device:
            raise ValueError(f"weight on {w.packed.device}, x on {x.device}")
        m = x.shape[0]
        if (not torch.is_tensor(topk_ids) or topk_ids.dtype not in (torch.int32, torch.int64)
                or tuple(topk_ids.shape) != (m, prob.top_k) or topk_ids.device != x.device):
            raise ValueError(f"topk_ids must be int32/int64 [{m}, {prob.top_k}] on {x.device}, got "
                             f"{tuple(getattr(topk_ids, 'shape', ()))} {getattr(topk_ids, 'dtype', None)}")
        if topk_weights is not None and (tuple(topk_weights.shape) != (m, prob.top_k)
                                         or not topk_weights.is_floating_point() or topk_weights.device != x.device):
            raise ValueError(f"topk_weights must be a float [{m}, {prob.top_k}] tensor on {x.device}")
        shape = (m, self.n_out) if self.epilogue == "reduce" else (m, prob.top_k, self.n_out)
        if out is None:
            out = torch.empty(shape, dtype=torch.bfloat16, device=x.device)
        elif tuple(out.shape) != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous bf16 tensor of shape {shape}")
        return m, out

    def chunk_tokens(self) -> int | None:
        """Tokens per launch: `chunk_tokens(self.params, self.problem)`."""
        return chunk_tokens(self.params, self.problem)

    def aligned_block_m(self, m: int) -> int | None:
        """BLOCK_M of the alignment a call with M tokens takes in one launch (one a caller may make
        and pass as `aligned=`), or None: the direct route, or token chunks aligned each on their own."""
        rows = self.chunk_tokens()
        if rows is not None and m > rows:
            return None
        return self.params["block_m"] if self._aligned_route(m * self.problem.top_k) else None

    def aligner(self, experts: int, block_m: int):
        """moe_align's Aligner: the alignment `aligned=` takes (shared by a layer's launchers)."""
        from .moe_align import Aligner
        return Aligner(experts, block_m)

    def release(self) -> None:
        """Its own workspace, counters, reduce buffers, bad-id word and aligner (the compiled kernel
        stays; a dispatcher's pool and word are the dispatcher's)."""
        self._own.clear()
        self._bad = self._aligner = None

    def counters(self) -> list:
        """The split-K and reduce counters it launched with (tests: the kernel leaves them zero)."""
        return [b for (_, _, name), b in self.scratch.bufs.items() if name in ("splitk.locks", "reduce.cnt")]

    def _aligned_route(self, pairs: int) -> bool:
        return self.params["route"] == "aligned" or pairs > DIRECT_MAX_PAIRS

    def _scratch(self, sk: int, pairs: int, locks: int, device, s: int | None = None):
        import torch
        s, pool = stream_key(device) if s is None else s, self.scratch
        if sk == 1:             # the kernel touches neither: placeholders that never grow a real buffer
            ws, lk = pool.get(s, "unused.f32", 4, torch.float32, device), pool.get(s, "unused.i32", 4, torch.int32, device)
        else:
            ws = pool.get(s, "splitk.ws", sk * pairs * self.problem.n, torch.float32, device)
            lk = pool.get(s, "splitk.locks", max(4, locks), torch.int32, device, zero=True)
        return ws, lk, self._word(device)

    def _reduce_scratch(self, m: int, device, s: int | None = None):
        """REDUCE: fp32 rows [P, N] and zeroed counters [M, N tiles] (the kernel leaves them zero)."""
        import torch
        s, pool, prob = stream_key(device) if s is None else s, self.scratch, self.problem
        if self.epilogue != "reduce":
            return pool.get(s, "unused.f32", 4, torch.float32, device), pool.get(s, "unused.i32", 4, torch.int32, device)
        rows, cnts = m * prob.top_k * prob.n, m * (prob.n // self.params["block_n"])
        return (pool.get(s, "reduce.rows", rows, torch.float32, device),
                pool.get(s, "reduce.cnt", cnts, torch.int32, device, zero=True))

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, aligned=None):
        import torch
        import triton

        from . import moe_align as _al
        from .args import note_compiled, scales_u8
        from .moe_decode_kernel import moe_decode_kernel

        prob, p = self.problem, self.params
        m, out = self.check(x, w, topk_ids, topk_weights, out)
        pairs = m * prob.top_k
        if pairs == 0:
            return out
        rows = self.chunk_tokens()
        if rows is not None and m > rows:      # token chunks; a whole-batch alignment does not apply
            for t0 in range(0, m, rows):
                sl = slice(t0, min(m, t0 + rows))
                self(x[sl], w, topk_ids[sl], None if topk_weights is None else topk_weights[sl], out=out[sl])
            return out
        ids = topk_ids.contiguous()
        use_aligned = self._aligned_route(pairs) or aligned is not None
        if use_aligned:
            if aligned is None:
                if self._aligner is None:
                    self._aligner = _al.Aligner(prob.experts, p["block_m"])
                aligned = self._aligner(ids)
            elif aligned.block_m != p["block_m"] or aligned.pairs != pairs:
                raise ValueError(f"alignment for BLOCK_M={aligned.block_m}, {aligned.pairs} pairs does not fit "
                                 f"BLOCK_M={p['block_m']}, {pairs} pairs")
            g_main, sorted_ids, expert_ids = aligned.max_blocks, aligned.sorted_ids, aligned.expert_ids
        else:
            g_main, sorted_ids, expert_ids = pairs, ids, ids       # unused by the direct route
        n_tiles = prob.n // p["block_n"]
        sk = p["split_k"]
        stream = stream_key(x.device)
        ws, locks, bad = self._scratch(sk, pairs, g_main * n_tiles, x.device, stream)
        red, cnt = self._reduce_scratch(m, x.device, stream)
        routed = topk_weights is not None
        tw = (topk_weights.to(torch.float32).contiguous() if routed
              else torch.empty(1, dtype=torch.float32, device=x.device))
        # the weight's own fp32 scale tensor (FP4Weight checks dtype and device): no copy per call
        gs = w.global_scale.contiguous()
        if gs.numel() not in (1, prob.experts):
            raise ValueError(f"global_scale has {gs.numel()} values, not 1 or E={prob.experts}")
        groups = g_main + triton.cdiv(pairs, p["block_m"])
        consts = constexprs(prob, p, self.epilogue, routed, self.interpret, use_aligned, sk, gs.numel() > 1,
                            x.dim() == 3)
        ck = moe_decode_kernel[(groups * n_tiles, sk)](
            x.contiguous(), w.packed.contiguous(), scales_u8(w), gs, out, ids, sorted_ids, expert_ids, tw, ws,
            locks, bad, red, cnt, pairs, g_main, prob.n, prob.k, num_warps=p["num_warps"], num_stages=p["num_stages"],
            **consts)
        note_compiled(self, ck, x.device, lambda arch: smem_bytes(p, prob.w_fmt, arch))
        if self.check_ids and not capturing(x.device):
            _al.raise_if_bad(bad, "topk_ids")
        return out


# ---- the family member --------------------------------------------------------------------------

#: the routing `sources` compiles for without a problem (cross-compiles for the smem figure):
#: GLM-5's, 256 experts, top 8. With one (precompile) it compiles the problem's: E and top_k are
#: constexprs, so any other routing's first launch would compile inside the timed worker (the
#: folded e257:top9 problems did: ~20 ms a check on average before 2026-12-06). Either way routing weights
#: and an NVFP4 weight with one global scale per expert, as quantize() gives stacked experts.
COMPILE_EXPERTS, COMPILE_TOP_K = 256, 8
#: every value of each axis of the grids: the region the smem model was compared with the compiler
#: on (module docs: smem_bytes), on these archs
CHECKED_AXES = {k: tuple(sorted({v for g in GRIDS.values() for v in g[k]})) for k in GRIDS["direct"]}
CHECKED_ARCHS = ("sm89", "sm90", "sm100", "sm120")


class MoEDecodeMember:
    """moe_decode as a member of the `triton` family (member.Member). It offers no default:
    moe_w4a16 stays the family's designated default for grouped_moe problems."""

    def batch_invariant(self, params: Mapping[str, Any]) -> bool:
        """A pair's K loop is the same at every M: one tile shape whichever route gathers its rows,
        the tactic's fixed split summed in split order (large M cut into token chunks, never a
        smaller split), the SwiGLU epilogue per element, the top_k slots summed in slot order."""
        return True

    kernel = KERNEL
    compat_kernel = KERNEL
    schema = SCHEMA
    #: this member's sources, keyed into its trials and winners (autotune.core.codekey)
    code = Code.of(f"triton/{KERNEL}", __package__, *SHARED_CODE, ".moe_decode", ".moe_decode_kernel", ".moe_align",
                   ".moe_align_compile", ".kernel", ".smem")

    def supports(self, problem: Problem) -> str | None:
        return supported(problem)

    def space(self, problem: Problem, arch: Arch, axes: Mapping[str, tuple] | None = None) -> list[Tactic]:
        # the grid, not `space()`: the family's verdict judges each tactic (and with widened axes
        # asks the compiler); without axes its kept tactics are exactly space(problem, arch)
        return [Tactic(FAMILY, **c) for c in grid_configs(axes) if c["block_k"] >= MIN_BLOCK_K[problem.w_fmt]]

    def check_axes(self, axes: Mapping[str, tuple]) -> None:
        check_axes(KERNEL, GRIDS["direct"], SCHEMA, axes)

    def default(self, problem: Problem, arch: Arch) -> Tactic | None:
        # the only member with the fused epilogues: their default; for plain problems moe_w4a16's
        return None if problem.epilogue == "none" else Tactic(FAMILY, **default(problem, arch))

    def rules(self, problem: Problem, params: Mapping[str, Any], arch: Arch) -> str | None:
        return rules(problem, params, arch)

    def smem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return smem_bytes(params, fmt, arch)

    def tmem(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> int:
        return _smem.tmem_columns(params, fmt, arch)      # what verdict() checks

    def unchecked(self, params: Mapping[str, Any], fmt: str, arch: Arch) -> str | None:
        for k, vals in CHECKED_AXES.items():
            if params[k] not in vals:
                return f"{k}={params[k]} is outside the grid the moe_decode smem model was checked on ({vals})"
        if arch.name not in CHECKED_ARCHS:
            return f"the moe_decode smem model was checked on {', '.join(CHECKED_ARCHS)} only, not {arch.name}"
        return _smem.unchecked(params, fmt, arch)

    def sources(self, fmt: str, params: Mapping[str, Any], problem: Problem | None = None) -> list[tuple[Any, dict]]:
        # a direct config runs the aligned route above DIRECT_MAX_PAIRS pairs: compile both, its own last
        prob = problem if problem is not None else Problem.moe(256, 256, COMPILE_EXPERTS, COMPILE_TOP_K, fmt)
        epilogue = prob.epilogue
        routes = [dict(params, route="aligned")] if params["route"] == "direct" else []
        gemms = [source(prob, c, epilogue, routed=True, gs_per_expert=fmt == "nvfp4") for c in routes + [dict(params)]]
        if problem is None:
            return gemms
        # the alignment its aligned route launches first (a direct config only above 256 pairs: two-pass)
        from .moe_align_compile import align_sources
        return align_sources(prob.experts, params["block_m"], one_pass=params["route"] == "aligned") + gemms

    def make_launcher(self, problem: Problem, tactic: Tactic, device: str) -> MoEDecodeLauncher:
        return make_launcher(problem, tactic.params)


MEMBER = MoEDecodeMember()
