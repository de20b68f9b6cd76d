"""Host-side helpers shared by the family's launchers: argument preparation and the one-time
record of what Triton compiled. No Triton import here."""
from __future__ import annotations

from typing import Any, Callable


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

        from autotune.core.arch import arch_for_cc
        try:
            launcher.smem_model = model(arch_for_cc(*torch.cuda.get_device_capability(device)))
        except ValueError:
            launcher.smem_model = None
