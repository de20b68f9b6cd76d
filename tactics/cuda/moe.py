"""The cuda family's grouped-MoE decode member (`kernel="moe_mma"`, moe_mma.cu): stacked NVFP4 or
MXFP4 experts in the family's prepacked layout (layout.pack_experts), topk_ids read directly.

Semantics are the Triton `moe_decode` member's: y[p] for every (token, slot) pair p (row-major
[M, top_k]), id -1 a zero row and no work, an id outside [-1, E) a NaN row and the sticky bad-id
word set (nothing reads it on the host unless `check_ids`: then after an eager call, never under
graph capture; the runtime reads it with FP4MoE.routing_errors()), the routing
weight multiplied in when given; the `swiglu` problem variant writes silu(gate)·up of vLLM's
[gate; up] rows, the `reduce` variant (w2, x one row per pair) each token's routing-weighted sum
over its top_k slots, [M, N], in slot order.

Routes (`route`): up to ALIGN_PAIRS pairs the ids are read as they are (each CTA scans the ids
before its own: O(P) per CTA); above, moe_align's routing alignment (one Triton launch, or one a
caller shares as `aligned=`, BLOCK_M a multiple of 8·m_tiles) gives the same groups with no scan,
cut in token chunks only where the split-K workspace and reduce rows would pass WS_BYTES. A shared
slot (its ids are not in topk_ids) always takes the direct route, MAX_PAIRS pairs per launch.

A second kernel serves the `reduce` variant (w2) at decode: `kernel="moe_tok"` (moe_tok.cu,
moe_tok.py), one CTA per (token, N tile) summing the token's slots in registers (no scratch, no
counters); tactic parameters `warps_k`, `stages`, `tiles_n` (m_tiles 1, split_k 1).

Tactic parameters: `warps_k` (warps splitting K in a CTA), `stages` (cp.async ring depth),
`tiles_n` (16-row weight tiles per CTA; SwiGLU: half gate, half up), `m_tiles` (a group holds up to
8·m_tiles pairs of one expert), `split_k` (CTAs splitting K, summed in split order by the last one
to arrive: deterministic, one launch). Verdicts are exact: the shared memory is the source's static
arrays (build.smem_bytes, = ptxas in CI), the tiling divides the problem or the tactic is rejected.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

import numpy as np
import torch

from autotune.core import settings
from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict, check_params

from autotune.tactics.base import Caps, LauncherBase
from autotune.tactics.scratch import PoolUser, stream_key

from . import build as B
from . import args as A
from . import checked as CK
from . import layout as L
from . import pdl as P
from .moe_plan import Planned, plannable
from .moe_checks import check_alignment, check_apart, check_call, check_prefetch, raise_if_bad  # noqa: F401  (the launchers' argument checks, re-exported)

KERNEL = B.MOE_KERNEL
TOK_KERNEL = B.TOK_KERNEL
WARPS_K = (1, 2, 4, 8)
STAGES = (2, 4)
TILES_N = (1, 2, 4)
M_TILES = (1, 2)
SPLIT_K = (1, 2, 4, 8)
SCHEMA: dict[str, tuple] = {"kernel": (KERNEL,), "warps_k": WARPS_K, "stages": STAGES, "tiles_n": TILES_N,
                            "m_tiles": M_TILES, "split_k": SPLIT_K}
#: moe_tok streams all of a token's slots through one ring (top_k x K / 128 k-pairs per CTA, 18 at GLM-5's
#: w2): a deeper ring keeps more bytes in flight per SM where a CTA has few warps
TOK_STAGES = (2, 4, 8)
#: moe_mma on w2:reduce: N tiles one CTA walks after its route, so the route (id read, rank scan,
#: gather) and the CTA's start are paid once per walk (docs/decisions/0006-n-tile-walk-out-of-search.md); a tactic without
#: the parameter walks one tile, as before it existed (its id unchanged)
N_WALK = (2, 4, 8)
WALK_SCHEMA: dict[str, tuple] = {**SCHEMA, "n_walk": N_WALK}
TOK_SCHEMA: dict[str, tuple] = {"kernel": (TOK_KERNEL,), "warps_k": WARPS_K, "stages": TOK_STAGES, "tiles_n": TILES_N}
EPILOGUES = ("none", "swiglu", "reduce")
FORMATS = ("nvfp4", "mxfp4")
#: direct route, pairs per launch: each CTA scans the ids before its own, so larger calls are cut
#: into token chunks (a shared slot's calls only: others take the aligned route above ALIGN_PAIRS)
MAX_PAIRS = 512
#: the aligned route above this many pairs (moe_decode's DIRECT_MAX_PAIRS, so one alignment can serve
#: a layer's Triton and cuda launchers)
ALIGN_PAIRS = 256
#: BLOCK_M of the alignment the aligned route makes (moe_align's smallest; groups of 8 or 16 rows)
ALIGN_BLOCK_M = 16
#: aligned route: a launch's split-K workspace plus reduce rows stay under this (token chunks above)
WS_BYTES = 256 << 20
STATIC_SMEM_LIMIT = 48 * 1024
#: moe_mma's prefetch arguments (args.MOE_MMA), and their values without a prefetch (null pointers: the
#: kernel prefetches nothing)
PREFETCH_ARGS = ("pfa", "pfb", "pfa_bytes", "pfb_bytes")
NO_PREFETCH = (0, 0, np.int32(0), np.int32(0))


def is_moe(tactic: Tactic) -> bool:
    """A grouped-MoE tactic of the cuda family (either kernel)."""
    return tactic.params.get("kernel") in (KERNEL, TOK_KERNEL)


def is_tok(tactic: Tactic) -> bool:
    return tactic.params.get("kernel") == TOK_KERNEL


def config(problem: Problem, tactic: Tactic) -> B.MoeConfig:
    if is_tok(tactic):
        return B.MoeConfig(1, int(tactic["warps_k"]), int(tactic["stages"]), int(tactic["tiles_n"]), 1,
                           problem.w_fmt, False, True, token=True)
    return B.MoeConfig(int(tactic["m_tiles"]), int(tactic["warps_k"]), int(tactic["stages"]),
                       int(tactic["tiles_n"]), int(tactic["split_k"]), problem.w_fmt, problem.epilogue == "swiglu",
                       problem.epilogue == "reduce", n_walk=n_walk(tactic))


def n_walk(tactic: Tactic) -> int:
    return int(tactic.params.get("n_walk", 1))


def supports(problem: Problem) -> str | None:
    if problem.kind != "grouped_moe":
        return f"moe_mma runs grouped_moe problems, not {problem.kind}"
    if problem.w_fmt not in FORMATS or problem.a_fmt != "bf16" or problem.out_dtype != "bf16":
        return (f"cuda moe_mma: nvfp4/mxfp4 weights, bf16 x and y only, not "
                f"{problem.w_fmt}/{problem.a_fmt}/{problem.out_dtype}")
    if problem.epilogue not in EPILOGUES:
        return f"cuda moe_mma has no {problem.epilogue} epilogue (only {', '.join(EPILOGUES)})"
    return L.check_shape(problem.n, problem.k)


def validate(tactic: Tactic) -> str | None:
    if is_tok(tactic):
        return check_params(tactic, TOK_SCHEMA, "cuda moe_tok")
    return check_params(tactic, WALK_SCHEMA if "n_walk" in tactic.params else SCHEMA, "cuda moe_mma")


def check_tok(problem: Problem) -> str | None:
    """moe_tok runs the reduce variant only, one lane of warp 0 per slot."""
    if problem.epilogue != "reduce":
        return f"cuda moe_tok sums each token's slots: the reduce variant only, not {problem.epilogue}"
    if problem.top_k > B.TOK_MAX_SLOTS:
        return f"cuda moe_tok holds {B.TOK_MAX_SLOTS} slots per token, the problem has top_k={problem.top_k}"
    return None


def check_tiling(problem: Problem, tactic: Tactic) -> str | None:
    """The tiles divide the problem (the kernel drops a K tail and leaves a row tail unwritten)."""
    if is_tok(tactic) and (why := check_tok(problem)):
        return why
    wk, sk, tn = int(tactic["warps_k"]), int(tactic.params.get("split_k", 1)), int(tactic["tiles_n"])
    if problem.k % (L.KPAIR * wk * sk):
        return f"K={problem.k} is not a multiple of {L.KPAIR}*warps_k*split_k={L.KPAIR * wk * sk}"
    if problem.n % (L.ROWS * tn):
        return f"N={problem.n} is not a multiple of {L.ROWS}*tiles_n={L.ROWS * tn}"
    nw = n_walk(tactic)
    if nw > 1 and (sk > 1 or problem.epilogue != "reduce"):
        return f"n_walk={nw} walks the reduce epilogue's N tiles with split_k 1 only"
    if problem.n % (L.ROWS * tn * nw):
        return f"N={problem.n} is not a multiple of {L.ROWS}*tiles_n*n_walk={L.ROWS * tn * nw}"
    if problem.epilogue == "swiglu" and tn % 2:
        return "the swiglu epilogue pairs gate and up tiles: tiles_n must be even"
    if problem.epilogue == "swiglu" and (problem.n // 2) % (L.ROWS * tn // 2):
        return f"N/2={problem.n // 2} is not a multiple of {L.ROWS}*tiles_n/2={L.ROWS * tn // 2}"
    return None


#: a kernel that fits is `unknown` through the family until its text has passed its GPU tests
#: (checked.py: tests/test_cuda_moe_gpu.py, recorded in gpu_checked.json by tools/mark_gpu_checked.py)
UNRUN = CK.unrun(KERNEL)
TOK_UNRUN = CK.unrun(TOK_KERNEL)


def kernel_of(tactic: Tactic) -> str:
    return TOK_KERNEL if is_tok(tactic) else KERNEL


def gpu_checked(tactic: Tactic) -> bool:
    """Whether this tactic's kernel code has passed its GPU tests (checked.py)."""
    return CK.checked(kernel_of(tactic))


def unrun(tactic: Tactic) -> str:
    return CK.unrun(kernel_of(tactic))


def verdict(problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
    if arch.cc_int < 80:
        return Verdict.reject(f"mma.sync bf16 and cp.async need sm_80 or newer, not {arch.name}")
    why = check_tiling(problem, tactic)
    if why:
        return Verdict.reject(why)
    smem = B.smem_bytes(config(problem, tactic))
    limit = min(STATIC_SMEM_LIMIT, arch.smem_per_block_optin)
    if smem > limit:
        return Verdict.reject(f"static shared memory {smem} B > {limit} B", smem, limit, int(tactic["stages"]))
    return Verdict.keep(smem, limit, int(tactic["stages"]))


# --------------------------------------------------------------------------- launch
def route(problem: Problem, cfg: B.MoeConfig, m: int, shared_slot: bool = False) -> tuple[str, int]:
    """How a call with M tokens runs: ('direct' | 'aligned' | 'token', tokens per launch); moe_tok
    ('token') takes any M in one launch."""
    if cfg.token:
        return "token", max(m, 1)
    if shared_slot or m * problem.top_k <= ALIGN_PAIRS:
        return "direct", max(1, MAX_PAIRS // problem.top_k)
    per_token = problem.top_k * problem.n * 4 * ((cfg.split_k if cfg.split_k > 1 else 0) + int(cfg.reduce))
    return "aligned", (max(1, WS_BYTES // per_token) if per_token else max(m, 1))


def grid_x(cfg: B.MoeConfig, pairs: int, g_main: int = 0, block_m: int = 0) -> tuple[int, int]:
    """(grid.x, CTAs that may lead a group) of one launch: direct P and P; aligned g_main · BLOCK_M /
    CAP groups, then ⌈P / SPAN⌉ CTAs for the rows of pairs routed nowhere (moe_mma.cu)."""
    if not g_main:
        return pairs, pairs
    cap = 8 * cfg.m_tiles
    if block_m % cap:
        raise ValueError(f"an alignment for BLOCK_M={block_m} cannot feed groups of {cap} rows")
    groups = g_main * (block_m // cap)
    return groups + -(-pairs // (8 * cfg.threads)), groups


class MoeScratch(PoolUser, LauncherBase):
    """The launcher's scratch and bad-id word (MoeLaunch and the CPU port's runner share it):
    workspaces from a ScratchPool (its own, or the dispatcher's after `attach`), one word."""

    cfg: B.MoeConfig
    problem: Problem

    def _init_scratch(self, check_ids: bool | None) -> None:
        self.check_ids = settings.check_ids() if check_ids is None else check_ids
        self._init_pool()

    def chunk_tokens(self, m: int = 1) -> int:
        """Tokens per launch of a call with M tokens (`route`)."""
        return route(self.problem, self.cfg, m)[1]

    def aligned_block_m(self, m: int) -> int | None:
        """BLOCK_M of the alignment a call with M tokens takes as `aligned=` (the aligned route in
        one launch), or None."""
        kind, rows = route(self.problem, self.cfg, m)
        return ALIGN_BLOCK_M if kind == "aligned" and m <= rows else None

    def out_view(self, m: int, dev: torch.device, stream: int) -> torch.Tensor:
        """The output of an M-token call in the scratch pool (`scratch_out`): one buffer per (device,
        stream, host thread) that every such call reuses — the caller reads it before its next such
        call there (FP4MoE: w13's h, read by w2 on the same stream)."""
        p = self.problem
        shape = (m, p.n) if p.epilogue == "reduce" else (m, p.top_k, p.out_n)
        numel = m * (p.n if p.epilogue == "reduce" else p.top_k * p.out_n)
        # one per host thread too: two threads' layers on one stream must not share an h that lives
        # from one launch to the next (w13 to w2), as a workspace used inside one launch may
        name = f"moe.out.{threading.get_ident()}"
        return self.scratch.get(stream, name, max(numel, 1), torch.bfloat16, dev)[:numel].view(shape)

    def _scratch(self, pairs: int, dev: torch.device, s: int | None = None, groups: int = 0):
        """ws [split_k, P, N] fp32 (split-K only), counters [max(P, groups), N tiles] zeroed once
        (the kernel leaves them zero), bad [1]: from the pool (grown at least by doubling, outgrown
        buffers kept for graphs: tactics/scratch.py)."""
        sk, tiles = self.cfg.split_k, self.problem.n // (L.ROWS * self.cfg.tiles_n)
        s, pool = stream_key(dev) if s is None else s, self.scratch
        if sk == 1:             # the kernel touches neither: placeholders that never grow a real buffer
            return (pool.get(s, "unused.f32", 4, torch.float32, dev), pool.get(s, "unused.i32", 4, torch.int32, dev),
                    self._word(dev))
        ws = pool.get(s, "splitk.ws", sk * pairs * self.problem.n, torch.float32, dev)
        locks = pool.get(s, "splitk.locks", max(pairs, groups) * tiles, torch.int32, dev, zero=True)
        return ws, locks, self._word(dev)

    def _reduce_scratch(self, pairs: int, dev: torch.device, s: int | None = None):
        """REDUCE: fp32 rows [P, N] and zeroed counters [M, N tiles] (left zero by the kernel)."""
        s, pool = stream_key(dev) if s is None else s, self.scratch
        if self.problem.epilogue != "reduce":
            return pool.get(s, "unused.f32", 4, torch.float32, dev), pool.get(s, "unused.i32", 4, torch.int32, dev)
        tiles = self.problem.n // (L.ROWS * self.cfg.tiles_n)
        rows, cnts = pairs * self.problem.n, pairs // self.problem.top_k * tiles
        return (pool.get(s, "reduce.rows", rows, torch.float32, dev),
                pool.get(s, "reduce.cnt", cnts, torch.int32, dev, zero=True))

    def _scratch_pointers(self, pairs: int, dev: torch.device, s: int, groups: int = 0) -> tuple[int, int, int, int]:
        """(ws, counters, reduce rows, reduce counters) pointers of a launch of `pairs` pairs."""
        ws, locks, _ = self._scratch(pairs, dev, s, groups)
        red, cnt = self._reduce_scratch(pairs, dev, s)
        return ws.data_ptr(), locks.data_ptr(), red.data_ptr(), cnt.data_ptr()

    def release(self) -> None:
        """Free its own scratch (workspace, counters, outgrown buffers, its routing aligner; a
        dispatcher's pool is the dispatcher's); the bad-id word is kept. A graph captured before must
        not be replayed after this."""
        self._own.clear()
        self._aligner = None


class MoeLaunch(Planned, MoeScratch):
    """(x, w, topk_ids, topk_weights=None, out=None) → bf16 [M, top_k, N] (SwiGLU: N/2) on a checked
    stacked CudaPacked. Takes its split-K workspace, the per-(pair slot, N tile) counters (left zero
    by every launch) and the reduce rows from a ScratchPool (its own, or the dispatcher's after
    `attach`: one launch at a time per stream) and sets a sticky bad-id word (its own or the
    attached one), read on the host only when `check_ids` (default $AUTOTUNE_CHECK_IDS, off).
    `release()` frees its own scratch (a launch after it allocates anew)."""

    caps = Caps(capture_safe=True,     # current stream, scratch sized by M, no host read by default
                checks_ids=True,       # ids outside [-1, E) give NaN rows and set `bad`
                shared_slot=True,      # shared_slot=True: the kernel adds expert E - 1 as each token's last slot
                prefetches=True,       # prefetch=(a, b): the next kernel's stacked weights, sliced into L2 (direct route)
                scratch_out=True)      # scratch_out=True: the output in the scratch pool, valid until the next such call on the stream

    def __init__(self, problem: Problem, tactic: Tactic, device: str, check_ids: bool | None = None):
        self.problem, self.tactic = problem, tactic
        self.cfg = config(problem, tactic)
        self.device = torch.device(device)
        self.n_out = problem.out_n
        self._runs: dict[int, P.Run] = {}
        self._fns: dict[int, Any] = {}
        self._ints: dict[tuple, tuple] = {}              # the int32 arguments per call form
        self._aligner = None                             # the aligned route's own (without aligned=)
        self._pf: tuple | None = None                    # the last prefetch= checked (`_prefetch`)
        self._init_scratch(check_ids)
        self._init_plans()                               # the repeat path (moe_plan.py)

    def attach(self, scratch=None, bad_word=None) -> None:
        super().attach(scratch, bad_word)
        self._forget()

    def release(self) -> None:
        super().release()
        self._forget()

    def _run(self, dev: torch.device) -> P.Run:
        """How the kernel launches on `dev` (pdl.runner: programmatic dependent launch on sm_90+),
        made once per device."""
        idx = dev.index or 0
        run = self._runs.get(idx)
        if run is None:
            run = self._runs[idx] = P.runner(self.function(dev), B.text(self.cfg), B.kernel_name(self.cfg), idx)
        return run

    def function(self, dev: torch.device) -> Any:
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        fn = self._fns.get(idx)
        if fn is None:
            major, minor = torch.cuda.get_device_capability(idx)
            fn = self._fns[idx] = B.load(self.cfg, f"sm_{major}{minor}", idx)
        return fn

    def check(self, x, w, topk_ids, topk_weights, out, **kw):
        return check_call(self.problem, x, w, topk_ids, topk_weights, out, **kw)

    def aligner(self, experts: int, block_m: int):
        """moe_align's Aligner (the alignment `aligned=` takes; Triton's, shared with its members)."""
        from autotune.tactics.triton_fp4.moe_align import Aligner
        return Aligner(experts, block_m)

    def _prefetch(self, pf, x) -> tuple:
        """The kernel's four prefetch arguments for `prefetch=` (checked: moe_checks.check_prefetch). The
        last pair checked is remembered by its tensors (held weakly: a launcher pins no pack), their
        pointers and device, so a decode step's repeat — any M, any tuple of the same two — skips the check."""
        if pf is None:
            return NO_PREFETCH
        seen = self._pf
        if (seen is not None and isinstance(pf, tuple) and len(pf) == 2 and pf[0] is seen[0]() and pf[1] is seen[1]()
                and pf[0].data_ptr() == seen[2] and pf[1].data_ptr() == seen[3] and x.get_device() == seen[4]):
            return seen[5]
        a, b, ea, eb = check_prefetch(self.problem, pf, x)
        args = (a.data_ptr(), b.data_ptr(), np.int32(ea), np.int32(eb))
        self._pf = (weakref.ref(a), weakref.ref(b), args[0], args[1], x.get_device(), args)
        return args

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None, shared_slot: bool = False, aligned=None,
                 prefetch=None, scratch_out: bool = False):
        # checked once x is a tensor: a non-tensor x gets check_call's one-line error first
        pf = self._prefetch(prefetch, x) if prefetch is not None and torch.is_tensor(x) else NO_PREFETCH
        so = scratch_out and out is None
        if out is None and aligned is None and not self.check_ids:      # a form seen before: its plan
            y = self._planned(x, w, topk_ids, topk_weights, shared_slot, pf, so)
            if y is not None:
                return y
        p = self.problem
        shared = {"shared_slot": True} if shared_slot else {}
        fresh = out is None and aligned is None and not self.check_ids
        m, out = self.check(x, w, topk_ids, topk_weights, out, alloc=not so, **shared)
        if prefetch is not None and pf is NO_PREFETCH:
            pf = self._prefetch(prefetch, x)
        if so:
            out = self.out_view(m, x.device, stream_key(x.device))
            check_apart(p, x, out)
        if m == 0:
            return out
        kind, rows = route(p, self.cfg, m, shared_slot)
        check_alignment(p, self.cfg, m, kind, rows, aligned, x.device)
        if m > rows:                                   # token chunks, each its own launch
            for t0 in range(0, m, rows):
                sl = slice(t0, min(m, t0 + rows))
                self._launch(x[sl], w, topk_ids[sl], None if topk_weights is None else topk_weights[sl], out[sl],
                             shared_slot, kind)
        else:
            self._launch(x, w, topk_ids, topk_weights, out, shared_slot, kind, aligned,
                         remember=fresh and kind == "direct" and plannable(x, topk_ids, topk_weights),
                         pf=pf if kind == "direct" else NO_PREFETCH, so=so)
        if self.check_ids:
            raise_if_bad(self._word(x.device))
        return out

    def _align(self, ids):
        if self._aligner is None:
            self._aligner = self.aligner(self.problem.experts, ALIGN_BLOCK_M)
        return self._aligner(ids)

    def _launch(self, x, w, ids, tw, out, shared_slot: bool = False, kind: str = "direct", al=None,
                remember: bool = False, pf: tuple = None, so: bool = False) -> None:
        """One launch; `remember`: leave its plan (x, ids and tw are launched as given); `pf`: the
        prefetch arguments (`_prefetch`; direct route only, none by default)."""
        pf = NO_PREFETCH if pf is None else pf
        p, c = self.problem, self.cfg
        m = x.shape[0]
        pairs = m * p.top_k
        dev = x.device
        if not x.is_contiguous() or x.data_ptr() % 16:
            x = x.contiguous().clone() if x.data_ptr() % 16 else x.contiguous()
        ids = ids.contiguous()
        bad = self._word(dev)
        if kind == "aligned":
            al = self._align(ids) if al is None else al
            g_main, bm, srt, blk = al.max_blocks, al.block_m, al.sorted_ids.data_ptr(), al.expert_ids.data_ptr()
        else:
            g_main, bm, srt, blk = 0, 8 * c.m_tiles, bad.data_ptr(), bad.data_ptr()   # never read
        gx, groups = grid_x(c, pairs, g_main, bm)
        stream = stream_key(dev)
        ws, locks, red, cnt = self._pointers((pairs, groups, dev, stream), stream,
                                             lambda: self._scratch_pointers(pairs, dev, stream, groups))
        routed = tw is not None
        tw_ = tw.to(torch.float32).contiguous() if routed else bad      # never read unrouted
        gs = w.global_scale
        # pointers go as Python ints (CuPy passes an int as 8 bytes, the kernel's pointer size);
        # the int32 arguments as NumPy scalars made once per form: a NumPy scalar per argument per
        # launch cost ~10 µs of host time per launch on a 2-core CPU (bench/moe_host.py)
        form = (pairs, ids.dtype == torch.int64, x.dim() == 3, routed, gs.numel() > 1, shared_slot, g_main, bm)
        ints = self._ints.get(form)
        if ints is None:
            shared_e, cols = (p.experts - 1, p.top_k - 1) if shared_slot else (-1, p.top_k)
            ints = {k: np.int32(v) for k, v in dict(
                P=pairs, N=p.n, K=p.k, top_k=p.top_k, n_exp=p.experts, ids64=form[1], x_pair=form[2], routed=form[3],
                gs_stride=form[4], shared_e=shared_e, ids_cols=cols, g_main=g_main, bm=bm).items()}
            if len(self._ints) < 256:                   # decode serves a few Ms: beyond, made per call
                self._ints[form] = ints
        args = A.MOE_MMA.pack(wq=w.packed.data_ptr(), sq=w.scales.data_ptr(), x=x.data_ptr(), y=out.data_ptr(),
                              gscale=gs.data_ptr(), ids=ids.data_ptr(), tw=tw_.data_ptr(), ws=ws, locks=locks,
                              bad=bad.data_ptr(), red=red, cnt=cnt, srt=srt, blk_e=blk, **ints,
                              **dict(zip(PREFETCH_ARGS, pf)))
        grid, block, run = (gx, p.n // (L.ROWS * c.tiles_n * c.n_walk), c.split_k), (c.threads, 1, 1), self._run(dev)
        run(grid, block, args, stream)
        if remember:
            self._remember(x, w, ids, tw, shared_slot, out, grid, block, args, stream, run, pf, so)

