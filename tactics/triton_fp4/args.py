"""Host-side helpers shared by the family's launchers: the U8 weight layout, argument checks and
preparation, and the one-time record of what Triton compiled. No Triton import here."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

from autotune.core.arch import arch_for_cc

#: the weight layout the family's launchers read (Family.layout / Family.pack)
U8_LAYOUT = "fp4-linear-u8"


@dataclass(frozen=True, eq=False)
class U8Weight:
    """Packed codes, block scales as uint8 and the global scale as fp32 [1] on the weight's device:
    what the launchers otherwise convert on every call. Views of a contiguous source: 0 extra bytes.
    Duck-types FP4Weight's packed/scales/global_scale/fmt for the launchers."""

    packed: Any
    scales: Any            # uint8 view of the e4m3 / e8m0 block scales
    global_scale: Any      # fp32 [1] (or [E] for stacked experts)
    fmt: str
    input_scale: Any = None
    n: int = 0
    k: int = 0


def pack_u8(w) -> U8Weight:
    import torch
    g = w.global_scale.to(torch.float32).reshape(-1).contiguous()
    return U8Weight(w.packed.contiguous(), scales_u8(w), g, w.fmt, w.input_scale, w.n, w.k)


def scales_u8(w):
    """The weight's block scales as raw bytes (the kernels decode e4m3 / e8m0 themselves)."""
    import torch
    s = w.scales.contiguous()
    return s if s.dtype == torch.uint8 else s.view(torch.uint8)


def fp32_scale(v, device, n: int = 1):
    """A global scale (float or tensor) as a contiguous fp32 [n] tensor on `device`; a scalar is
    broadcast (one per expert for the MoE kernel)."""
    import torch
    if not torch.is_tensor(v):
        v = torch.tensor(float(v), dtype=torch.float32)
    return v.to(device=device, dtype=torch.float32).reshape(-1).expand(n).contiguous()


def note_compiled(launcher: Any, ck, device, model: Callable[[Any], int] | None = None) -> None:
    """After the first launch: keep the compiled kernel, its `metadata.shared` and, on a GPU, the
    static model's figure for that GPU's arch (`model(arch)`), so the search can compare them."""
    if launcher.compiled is not None or ck is None or not hasattr(ck, "metadata"):
        return
    launcher.compiled = ck
    launcher.smem_compiled = int(ck.metadata.shared)
    if model is not None and getattr(device, "type", None) == "cuda":
        import torch
        try:
            launcher.smem_model = model(arch_for_cc(*torch.cuda.get_device_capability(device)))
        except ValueError:
            launcher.smem_model = None


def is_interpreting() -> bool:
    """TRITON_INTERPRET=1: kernels run on the CPU (plain-op dequantization, fp32 dots)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def weight_args(prob: Any, x, w):
    """(M, N, K, packed, scale bytes, fp32 global scale) of a dense call, after checking that x
    (bf16 [M, K]) and w (FP4Weight or U8Weight, [N, K/2] packed, the problem's format) fit `prob`."""
    import torch
    fmt = getattr(w, "fmt", prob.w_fmt)
    if fmt != prob.w_fmt:
        raise ValueError(f"weight format {fmt} does not match the problem's {prob.w_fmt}")
    if x.dim() != 2 or x.dtype != torch.bfloat16:
        raise ValueError(f"x must be a 2-D bf16 tensor, got {tuple(x.shape)} {x.dtype}")
    m, k = x.shape
    n = w.packed.shape[0]
    if k != prob.k or n != prob.n or tuple(w.packed.shape) != (n, k // 2):
        raise ValueError(f"shapes x{tuple(x.shape)} packed{tuple(w.packed.shape)} do not fit "
                         f"N={prob.n} K={prob.k}")
    return m, n, k, w.packed.contiguous(), scales_u8(w), fp32_scale(w.global_scale, x.device)


def out_tensor(out, shape: tuple[int, ...], x):
    """`out` checked to be a contiguous bf16 tensor of `shape`, or a new one on x's device."""
    import torch
    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16, device=x.device)
    if tuple(out.shape) != tuple(shape) or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous bf16 tensor of shape {tuple(shape)}")
    return out
