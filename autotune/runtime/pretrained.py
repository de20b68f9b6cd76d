"""Whole modules from a checkpoint: what `FP4Linear.from_pretrained`, `FP4MLP.from_pretrained`
(a dense layer's MLP, or an MoE block's shared expert run apart from the routed ones),
`FP4MoE.from_pretrained` and the `from_modelopt` constructors call. The bytes come from autotune.core.checkpoint (one
reader); this module decides the layer's problem (W4A4 or W4A16: autotune.runtime.activations)
and the engines' MoE conventions (routed + shared experts, expert_map for EP, gpt-oss's
interleaved clamped SwiGLU with biases).
"""
from __future__ import annotations

import os
import warnings
from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from autotune.core.arch import ARCHS, Arch, detect, get_arch
from autotune.core.checkpoint import MODELOPT_NVFP4, Checkpoint, CheckpointError
from autotune.core.checkpoint_moe import cat_rows, read_experts
from autotune.core.formats import FP4Weight
from autotune.core.problem import Problem
from autotune.runtime.activations import choose

#: module-name endings engines shard row-parallel (K split); everything else is column-parallel
ROW_PARALLEL = ("o_proj", "down_proj", "out_proj", "dense_4h_to_h", "wo", "w2", "fc2", "c_proj")


def open_checkpoint(source, assume_modelopt: bool = False) -> Checkpoint:
    """A path (directory, .safetensors, index.json) or an in-memory state dict."""
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, Mapping):
        return Checkpoint.from_tensors(source, MODELOPT_NVFP4 if assume_modelopt else None)
    if isinstance(source, (str, os.PathLike)):
        return Checkpoint.open(source, assume=MODELOPT_NVFP4 if assume_modelopt else None)
    raise CheckpointError(f"a checkpoint is a path or a state dict, got {type(source).__name__}")


def default_parallel(module: str) -> str:
    return "row" if module.rstrip(".").rsplit(".", 1)[-1] in ROW_PARALLEL else "column"


def _arch(arch: Arch | str | None, device: str) -> Arch:
    if isinstance(arch, Arch):
        return arch
    if isinstance(arch, str):
        return get_arch(arch)
    return detect() if str(device).startswith("cuda") else ARCHS["cpu"]


def _w4a4(ck: Checkpoint, w: FP4Weight) -> bool:
    """The checkpoint quantizes this module's activations (its scheme, or a bare ModelOpt file
    whose module carries an input_scale)."""
    return ck.scheme.w4a4 and (ck.scheme.fmt != "nvfp4" or w.input_scale is not None)


def load_linear(source, module: str, *, tp_rank: int = 0, tp_size: int = 1, parallel: Optional[str] = None,
                activations: Optional[str] = None, arch=None, device: str = "cpu", assume_modelopt: bool = False):
    """(weight, bias, a_fmt) of one quantized linear, this rank's slice."""
    ck = open_checkpoint(source, assume_modelopt)
    module = module.rstrip(".")
    par = parallel or (default_parallel(module) if tp_size > 1 else None)
    w = ck.linear(module, tp_rank=tp_rank, tp_size=tp_size, parallel=par)
    bias = ck.bias(module, tp_rank=tp_rank, tp_size=tp_size, parallel=par)
    p = choose(Problem.dense(w.n, w.k, w_fmt=w.fmt), checkpoint_w4a4=_w4a4(ck, w), arch=_arch(arch, device),
               activations=activations, what=module)
    return w.to(device), None if bias is None else bias.to(device), p.a_fmt


def expert_ids(total: int, experts: Optional[Sequence[int]], ep_rank: int, ep_size: int, what: str) -> tuple[int, ...]:
    """This rank's global expert ids: `experts` as given, else the contiguous E/ep_size block of
    ep_rank (vLLM's linear placement)."""
    if experts is not None:
        if ep_size != 1:
            raise CheckpointError(f"{what}: give experts= or ep_rank/ep_size, not both")
        return tuple(int(e) for e in experts)
    if not (isinstance(ep_size, int) and ep_size >= 1 and 0 <= ep_rank < ep_size):
        raise CheckpointError(f"{what}: ep_rank {ep_rank!r} is not in [0, ep_size={ep_size!r})")
    if total % ep_size:
        raise CheckpointError(f"{what}: {total} experts do not split into {ep_size} equal expert-parallel ranks")
    per = total // ep_size
    return tuple(range(ep_rank * per, (ep_rank + 1) * per))


def _top_k(ck: Checkpoint, top_k: Optional[int], what: str) -> int:
    if top_k is not None:
        return int(top_k)
    cfg = ck.config.get("text_config", ck.config) if isinstance(ck.config.get("text_config"), dict) else ck.config
    for f in ("num_experts_per_tok", "experts_per_token", "moe_topk"):
        v = cfg.get(f)
        if isinstance(v, int) and v > 0:
            return v
    raise CheckpointError(f"{what}: top_k not given and the config has no num_experts_per_tok")


def load_moe(source, block: str, *, top_k: Optional[int] = None, tp_rank: int = 0, tp_size: int = 1,
             experts: Optional[Sequence[int]] = None, ep_rank: int = 0, ep_size: int = 1,
             shared_experts: bool | str | None = None, activations: Optional[str] = None, arch=None,
             device: str = "cpu", assume_modelopt: bool = False) -> dict:
    """FP4MoE's constructor arguments for one MoE block of a checkpoint (this rank's experts and
    intermediate slice). shared_experts: None (auto: take `{block}.shared_experts` as `shared=` when
    it is quantized, FP4MoE runs it apart or folded in; a BF16-kept one is left to the caller, with a
    warning), True (must exist), False (never), or another module name."""
    ck = open_checkpoint(source, assume_modelopt)
    block = block.rstrip(".")
    total = ck.num_experts(block)
    ids = expert_ids(total, experts, ep_rank, ep_size, block)
    ew = read_experts(ck, block, ids, tp_rank=tp_rank, tp_size=tp_size)
    kw: dict = {"top_k": _top_k(ck, top_k, block)}
    if len(ids) != total or ids != tuple(range(total)):
        kw["expert_map"] = _expert_map(total, ids)
    w13, w2 = ew.w13, ew.w2
    if ew.interleaved:                               # gpt-oss: interleaved rows, biases, clamped SwiGLU
        kw.update(activation="swigluoai", bias13=ew.bias13, bias2=ew.bias2)
    else:
        kw["up_scale"] = ew.up_scale
    mod = _shared_module(ck, block, shared_experts)
    if mod is not None:
        kw["shared"] = _read_shared(ck, mod, tp_rank, tp_size)
    on = _arch(arch, device)
    r_w4a4 = ck.scheme.w4a4 and (w13.fmt != "nvfp4" or w13.input_scale is not None)
    p13 = choose(Problem.moe(w13.n, w13.k, w13.num_experts, min(kw["top_k"], w13.num_experts), w_fmt=w13.fmt),
                 checkpoint_w4a4=r_w4a4, arch=on, activations=activations, what=f"{block}.experts")
    kw["a_fmt"] = p13.a_fmt
    if mod is not None:
        kw.update(_shared_format(ck, mod, kw["shared"], r_w4a4, p13.a_fmt, on))
    if p13.a_fmt == "bf16":
        w13, w2 = _drop_input(w13), _drop_input(w2)
    return {"w13": w13.to(device), "w2": w2.to(device), **_on_device(kw, device)}


def _expert_map(total: int, ids: tuple[int, ...]) -> Tensor:
    """[E_global] int32: each of this rank's global ids its local index, every other id -1."""
    m = torch.full((total,), -1, dtype=torch.int32)
    m[list(ids)] = torch.arange(len(ids), dtype=torch.int32)
    return m


def _shared_module(ck: Checkpoint, block: str, shared_experts: bool | str | None) -> str | None:
    """The shared expert's module name to load as `shared=`, or None: load_moe's `shared_experts`
    rule (auto takes a quantized one and warns on a BF16-kept one; True raises the one-line
    missing/not-quantized error)."""
    if shared_experts is False:
        return None
    name = "shared_experts" if shared_experts in (None, True) else str(shared_experts)
    mod = f"{block}.{name}"
    if ck.is_quantized(f"{mod}.gate_proj"):
        return mod
    if shared_experts is None:
        if ck.has(f"{mod}.gate_proj.weight"):
            warnings.warn(f"{mod} is kept {ck.meta(mod + '.gate_proj.weight').dtype} in this checkpoint: "
                          "FP4MoE holds the routed experts only; run the shared expert as a bf16 MLP",
                          stacklevel=4)
        return None
    ck.linear(f"{mod}.gate_proj")          # raises the one-line missing/not-quantized error
    return mod


def _read_shared(ck: Checkpoint, mod: str, tp_rank: int, tp_size: int) -> tuple:
    """`shared=` (w13_s [gate; up], w2_s, up_scale_s): this rank's slice, gate/up column-parallel,
    down row-parallel."""
    col, row = ("column", "row") if tp_size > 1 else (None, None)
    g = ck.linear(f"{mod}.gate_proj", tp_rank=tp_rank, tp_size=tp_size, parallel=col)
    u = ck.linear(f"{mod}.up_proj", tp_rank=tp_rank, tp_size=tp_size, parallel=col)
    d = ck.linear(f"{mod}.down_proj", tp_rank=tp_rank, tp_size=tp_size, parallel=row)
    return cat_rows(g, u), d, u.global_scale


def _shared_format(ck: Checkpoint, mod: str, shared: tuple, r_w4a4: bool, routed_a_fmt: str, arch: Arch) -> dict:
    """The shared expert's own activation format (a checkpoint may differ per layer) as FP4MoE's
    keywords: where it differs from the routed experts', `shared_apart` (why) and `shared_a_fmt`;
    a W4A16 shared expert's weights without their input scales."""
    s13, s2, su = shared
    s_w4a4 = ck.scheme.w4a4 and all(w.fmt != "nvfp4" or w.input_scale is not None for w in (s13, s2))
    s_fmt, out = routed_a_fmt, {}
    if s_w4a4 != r_w4a4:
        s_fmt = choose(Problem.dense(s13.n, s13.k, w_fmt=s13.fmt), checkpoint_w4a4=s_w4a4,
                       arch=arch, activations=None if s_w4a4 else "w4a16", what=mod).a_fmt
        out["shared_apart"] = (f"the checkpoint's routed experts are {'W4A4' if r_w4a4 else 'W4A16'} and its "
                               f"shared expert {'W4A4' if s_w4a4 else 'W4A16'}")
        out["shared_a_fmt"] = s_fmt
    if s_fmt == "bf16":
        out["shared"] = (_drop_input(s13), _drop_input(s2), su)
    return out


def _on_device(kw: dict, device: str) -> dict:
    """load_moe's keywords with every tensor (up_scale, biases, expert_map, the shared expert's) on `device`."""
    mv = lambda t: None if t is None else t.to(device)  # noqa: E731
    for k in ("up_scale", "bias13", "bias2", "expert_map"):
        if k in kw:
            kw[k] = mv(kw[k])
    if "shared" in kw:
        kw["shared"] = tuple(mv(x) for x in kw["shared"])
    return kw


def _drop_input(w: FP4Weight) -> FP4Weight:
    return FP4Weight(w.packed, w.scales, w.global_scale, w.fmt) if w.input_scale is not None else w


def one_linear(source, module: str, device: str = "cpu") -> FP4Weight:
    """One whole linear for the legacy from_modelopt constructors (a bare ModelOpt file or dict)."""
    return open_checkpoint(source, assume_modelopt=True).linear(module).to(device)


def load_mlp(source, module: str, *, tp_rank: int = 0, tp_size: int = 1, device: str = "cpu",
             assume_modelopt: bool = False, activations: Optional[str] = None,
             arch=None) -> tuple[FP4Weight, FP4Weight, Tensor | None, str]:
    """FP4MLP's (gate_up [2I/tp, H], down [H, I/tp], up_scale, a_fmt) for one SwiGLU MLP of a
    checkpoint (`{module}.gate_proj`, `.up_proj`, `.down_proj`: a dense layer's mlp or an MoE
    block's shared_experts), this rank's slice: gate/up column-parallel, down row-parallel.
    a_fmt as FP4Linear chooses it (activations / arch; a W4A4 checkpoint on an arch without a W4A4
    tactic runs W4A16 with a warning): "bf16" drops the activation scales; "nvfp4" keeps them, gate_up
    under the larger of gate's and up's (as vLLM merges them). up_scale: the up half's global scale
    when it differs from the gate's, else None."""
    ck = open_checkpoint(source, assume_modelopt)
    module = module.rstrip(".")
    col, row = ("column", "row") if tp_size > 1 else (None, None)
    g, u = (ck.linear(f"{module}.{p}", tp_rank=tp_rank, tp_size=tp_size, parallel=col) for p in ("gate_proj", "up_proj"))
    d = ck.linear(f"{module}.down_proj", tp_rank=tp_rank, tp_size=tp_size, parallel=row)
    w4a4 = all(_w4a4(ck, w) for w in (g, u, d))
    p = choose(Problem.dense(2 * g.n, g.k, w_fmt=g.fmt), checkpoint_w4a4=w4a4, arch=_arch(arch, device),
               activations=activations, what=module)
    same = g.fmt != "nvfp4" or torch.equal(u.global_scale.float().reshape(-1), g.global_scale.float().reshape(-1))
    gu = cat_rows(g, u)
    if p.a_fmt == "bf16":
        gu, d = _drop_input(gu), _drop_input(d)     # cat_rows keeps the larger input_scale otherwise
    return gu.to(device), d.to(device), None if same else u.global_scale.to(device), p.a_fmt


def clamped_swiglu(y: Tensor, alpha: float, limit: float) -> Tensor:
    """gpt-oss's activation on interleaved [gate, up] rows, as vLLM / HF compute it (fp32):
    gate = y[..., ::2].clamp(max=limit), up = y[..., 1::2].clamp(-limit, limit),
    (up + 1) · gate · sigmoid(alpha · gate)."""
    gate, up = y[..., ::2], y[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * alpha))
