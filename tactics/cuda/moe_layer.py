"""The cuda family's MoE layer member (`kernel="moe_layer"`, moe_layer.cu): a routed (+ folded shared)
MoE layer's w13 (SwiGLU) and w2 (top_k summed) in one launch at small M, M · top_k ≤ 256 pairs (the
shared slot included: GLM-5's buckets 1, 2, 4, 8, 16). The w13 role is moe_mma's direct route with the
SwiGLU epilogue (m_tiles 1, split_k 1), the w2 role moe_tok's token-major formulation; CTAs take their
role by ticket after the wait, h is published per expert on epoch words, the last CTA advances the
epoch (moe_layer_protocol.py specifies and models the protocol; docs/cuda-family.md section 16).

Not in the default space: `LayerMember.space` is empty until a GPU measurement shows the kernel wins a
bucket; enable it with an explicit tactic, `Tactic("cuda", kernel="moe_layer", warps_k=…, stages=…,
tiles_n=…)` (`layer_space(problem)` lists the kept ones), run on the layer's w13 problem (its
`swiglu` variant; w2's problem is derived: `w2_problem`).

The launcher owns its protocol words (state [4], one counter per expert), its h rows [256, I] bf16 and
its bad-id word, allocated zeroed and warmed by an eager call (`warm`) before any capture: a call
under capture without them is refused; nothing is written on the host between replays. One launch
at a time per launcher (one stream): concurrent launches on two streams would share the words.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from autotune.core.arch import Arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic, Verdict, check_params

from . import args as A
from . import build as B
from . import layout as L
from . import moe as MOE
from . import moe_search as MOE_SEARCH
from . import moe_layer_protocol as PR

KERNEL = "moe_layer"
SCHEMA: dict[str, tuple] = {"kernel": (KERNEL,), "warps_k": (1, 2, 4, 8), "stages": (2, 4, 8), "tiles_n": (2, 4)}
MAX_PAIRS = PR.MAX_PAIRS
MAX_SLOTS = 32                       # moe_layer.cu's MAXK
STATE_WORDS = 4                      # tick, done, epoch, error


@dataclass(frozen=True)
class LayerConfig:
    """moe_layer.cu's compiled variant: one ring config for both roles (MT 1; SWIGLU 1 is w13's)."""
    warps_k: int
    stages: int
    tiles_n: int
    fmt: str = "nvfp4"
    kernel: ClassVar[str] = KERNEL
    m_tiles: ClassVar[int] = 1

    @property
    def threads(self) -> int:
        return 32 * self.warps_k

    def defines(self) -> dict[str, str]:
        mul, add, sw, shift = L.FORMAT[self.fmt]
        return {"MT": "1", "WK": str(self.warps_k), "STAGES": str(self.stages), "TN": str(self.tiles_n),
                "SWIGLU": "1", "SW": str(sw), "SCALE_MUL": f"0x{mul:x}u", "SCALE_ADD": f"0x{add * 0x10001:08x}u",
                "EPI_SCALE": f"{float(2 ** shift)!r}f"}

    def smem(self) -> int:
        """The static arrays the text declares: the larger of the ring and the warps' sums (both roles
        use one ring), the group's rows and lead flag (CAP + 1 ints), the slots' x rows, experts and
        scales (3 x MAXK words), the role words (3 ints)."""
        pipe = self.stages * self.threads * 36 * self.tiles_n
        red = self.warps_k * self.tiles_n * 4 * 32 * 4
        return max(pipe, red) + 4 * (PR.CAP + 1) + 3 * 4 * MAX_SLOTS + 4 * 3


def w2_problem(problem: Problem) -> Problem:
    """w2 of the layer whose w13 is `problem` (N = 2I, K = H): N = H, K = I, top_k summed."""
    return Problem.moe(problem.k, problem.n // 2, problem.experts, problem.top_k, w_fmt=problem.w_fmt,
                       epilogue="reduce")


def config(problem: Problem, tactic: Tactic) -> LayerConfig:
    return LayerConfig(int(tactic["warps_k"]), int(tactic["stages"]), int(tactic["tiles_n"]), problem.w_fmt)


def validate(tactic: Tactic) -> str | None:
    return check_params(tactic, SCHEMA, "cuda moe_layer")


def check_tiling(problem: Problem, tactic: Tactic) -> str | None:
    """Why the layer kernel cannot run `problem` (w13's swiglu problem) with `tactic`, or None."""
    why = validate(tactic)
    if why:
        return why
    if problem.kind != "grouped_moe" or problem.epilogue != "swiglu" or problem.w_fmt not in MOE.FORMATS:
        return "the layer kernel runs a grouped MoE layer given by its w13 swiglu problem"
    if problem.top_k > MAX_SLOTS:
        return f"top_k {problem.top_k} > {MAX_SLOTS} slots per token"
    wk, tn = int(tactic["warps_k"]), int(tactic["tiles_n"])
    h, i = problem.k, problem.n // 2
    if h % (128 * wk) or i % (128 * wk):
        return f"H={h} and I={i} must be multiples of 128·warps_k={128 * wk} (both roles split K over the warps)"
    if i % (8 * tn) or h % (16 * tn):
        return f"I={i} must be a multiple of 8·tiles_n={8 * tn} and H={h} of 16·tiles_n={16 * tn}"
    if -(-MAX_PAIRS // PR.CAP) * (i // (8 * tn)) > PR.ARRIVALS_MAX:
        return f"{i // (8 * tn)} w13 tiles x groups exceed one counter's {PR.ARRIVALS_MAX} arrivals"
    return None


def verdict(problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
    """Exact: the tiling divides both GEMMs, and the static shared memory (`LayerConfig.smem`, = ptxas)
    fits the static limit."""
    why = (f"mma.sync bf16, cp.async and ld.acquire need sm_80 or newer, not {arch.name}" if arch.cc_int < 80
           else check_tiling(problem, tactic))
    if why:
        return Verdict.reject(why)
    smem, limit, stages = config(problem, tactic).smem(), min(MOE.STATIC_SMEM_LIMIT, arch.smem_per_block_optin), \
        int(tactic["stages"])
    if smem <= limit:
        return Verdict.keep(smem, limit, stages)
    return Verdict.reject(f"static shared memory {smem} B > {limit} B", smem, limit, stages)


def layer_space(problem: Problem, arch: Arch) -> list[Tactic]:
    """The kept layer tactics for `problem` (w13's swiglu problem): what the search would time once enabled."""
    out = []
    for wk in SCHEMA["warps_k"]:
        for st in SCHEMA["stages"]:
            for tn in SCHEMA["tiles_n"]:
                t = Tactic("cuda", kernel=KERNEL, warps_k=wk, stages=st, tiles_n=tn)
                if not verdict(problem, t, arch).rejected:
                    out.append(t)
    return out


def grid(problem: Problem, cfg: LayerConfig, m: int) -> tuple[int, int, int]:
    """(w13 tiles per pair slot, w2 tiles per token, CTAs): tickets below P·n13 are w13 roles."""
    i, h = problem.n // 2, problem.k
    n13, n2 = i // (8 * cfg.tiles_n), h // (16 * cfg.tiles_n)
    return n13, n2, m * problem.top_k * n13 + m * n2


class LayerLaunch:
    """(x, w13, w2, topk_ids, topk_weights=None, out=None, shared_slot=False) → bf16 [M, H]: the layer
    on checked stacked CudaPacked weights (w13 [E, 2I, H] as vLLM's [gate; up], w2 [E, H, I])."""

    def __init__(self, problem: Problem, tactic: Tactic, device: str, check_ids: bool = False):
        why = check_tiling(problem, tactic)
        if why:
            raise ValueError(f"{problem.key} {tactic}: {why}")
        self.problem, self.tactic, self.p2 = problem, tactic, w2_problem(problem)
        self.cfg = config(problem, tactic)
        self.device = torch.device(device)
        self.check_ids = check_ids
        self._words: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._run_by_dev: dict[int, Any] = {}

    def warm(self, dev: torch.device | None = None) -> None:
        """Allocate (zeroed) the protocol words, h and the bad word on `dev` and load the kernel: done
        by the first eager call, needed before a capture."""
        dev = torch.device(dev or self.device)
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if idx in self._words:
            return
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"{self.problem.key}: cuda moe_layer: call it once eagerly (or warm()) before "
                               "capturing: its protocol words are allocated and zeroed then")
        d = torch.device("cuda", idx)
        state = torch.zeros(STATE_WORDS, dtype=torch.int32, device=d)
        cnt = torch.zeros(self.problem.experts, dtype=torch.int32, device=d)
        h = torch.empty(MAX_PAIRS, self.problem.n // 2, dtype=torch.bfloat16, device=d)
        bad = torch.zeros(1, dtype=torch.int32, device=d)
        major, minor = torch.cuda.get_device_capability(idx)
        fn = B.load(self.cfg, f"sm_{major}{minor}", idx)
        from . import pdl as P
        self._run_by_dev[idx] = P.runner(fn, B.text(self.cfg), KERNEL, idx)
        self._words[idx] = (state, cnt, h, bad)

    def words(self, dev: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(state [tick, done, epoch, error], counters [E], h [256, I], bad [1]) on `dev`."""
        dev = torch.device(dev or self.device)
        return self._words[dev.index if dev.index is not None else torch.cuda.current_device()]

    def protocol_error(self, dev: torch.device | None = None) -> str | None:
        """The error word's message (a host read: not under capture), None when clear."""
        err = int(self.words(dev)[0][3].item())
        return None if err == 0 else PR.describe(err)

    def __call__(self, x, w13, w2, topk_ids, topk_weights=None, out=None, shared_slot: bool = False):
        p = self.problem
        if torch.is_tensor(x) and x.dim() != 2:
            raise ValueError(f"{p.key}: cuda moe_layer takes x one row per token, bf16 [M, {p.k}], got {tuple(x.shape)}")
        m, _ = MOE.check_call(p, x, w13, topk_ids, None, None, shared_slot=shared_slot, alloc=False)
        if m * p.top_k > MAX_PAIRS:
            raise ValueError(f"{p.key}: M·top_k = {m * p.top_k} pairs > {MAX_PAIRS} (the layer kernel's scope)")
        self.warm(x.device)
        state, cnt, h, bad = self.words(x.device)
        hv = h[:m * p.top_k].view(m, p.top_k, p.n // 2)
        _, out = MOE.check_call(self.p2, hv, w2, topk_ids, topk_weights, out, shared_slot=shared_slot)
        if m == 0:
            return out
        if not x.is_contiguous() or x.data_ptr() % 16:
            raise ValueError(f"{p.key}: x must be contiguous and 16-byte aligned")
        ids = topk_ids.contiguous()
        routed = topk_weights is not None
        tw = topk_weights.to(torch.float32).contiguous() if routed else bad
        gs13, gs2 = w13.global_scale, w2.global_scale
        if gs13.numel() != gs2.numel():
            raise ValueError(f"{p.key}: w13 and w2 global scales must both be per expert or both one value")
        n13, n2, ctas = grid(p, self.cfg, m)
        shared_e, cols = (p.experts - 1, p.top_k - 1) if shared_slot else (-1, p.top_k)
        ints = {k: np.int32(v) for k, v in dict(
            M=m, H=p.k, I=p.n // 2, n13_tiles=n13, n2_tiles=n2, top_k=p.top_k, n_exp=p.experts,
            ids64=ids.dtype == torch.int64, routed=routed, gs_stride=gs13.numel() > 1, shared_e=shared_e,
            ids_cols=cols).items()}
        args = A.MOE_LAYER.pack(wq13=w13.packed.data_ptr(), sq13=w13.scales.data_ptr(), gs13=gs13.data_ptr(),
                                wq2=w2.packed.data_ptr(), sq2=w2.scales.data_ptr(), gs2=gs2.data_ptr(),
                                x=x.data_ptr(), y=out.data_ptr(), h=h.data_ptr(), ids=ids.data_ptr(),
                                tw=tw.data_ptr(), state=state.data_ptr(), cnt=cnt.data_ptr(), bad=bad.data_ptr(),
                                **ints)
        dev = x.device
        run = self._run_by_dev[dev.index if dev.index is not None else torch.cuda.current_device()]
        run((ctas, 1, 1), (self.cfg.threads, 1, 1), args, torch.cuda.current_stream(dev).cuda_stream)
        if self.check_ids and not torch.cuda.is_current_stream_capturing():
            MOE.raise_if_bad(bad)
            err = self.protocol_error(dev)
            if err:
                raise RuntimeError(err)
        return out


class LayerMember(MOE_SEARCH.MoeMember):
    """The layer kernel as a member of the cuda family (members.py): tactics name kernel="moe_layer",
    parameters SCHEMA, run on the layer's w13 swiglu problem. Not in the default space (`space` is
    empty); enable it with an explicit tactic (`layer_space` lists the kept ones)."""

    def validate(self, tactic: Tactic) -> str | None:
        return validate(tactic)

    def space(self, problem: Problem, arch: Arch) -> list[Tactic]:
        return []

    def default(self, problem: Problem, arch: Arch) -> Tactic | None:
        return None

    def verdict(self, problem: Problem, tactic: Tactic, arch: Arch) -> Verdict:
        return verdict(problem, tactic, arch)

    def configs(self, problem: Problem, tactic: Tactic) -> list[LayerConfig]:
        return [config(problem, tactic)]

    def runner(self, problem: Problem, tactic: Tactic, device: str) -> Any:
        return LayerLaunch(problem, tactic, device)

    def figures(self, problem: Problem, tactic: Tactic, m: int, sms: int) -> dict[str, float]:
        return {}


__all__ = ["LayerConfig", "LayerLaunch", "LayerMember", "config", "grid", "layer_space", "verdict",
           "w2_problem"]
