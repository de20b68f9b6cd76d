"""ModelOpt NVFP4 checkpoints: tensors <-> FP4Weight, and reading one layer from .safetensors."""
from __future__ import annotations

from typing import Mapping

import torch
from torch import Tensor

from autotune.core.formats import FP4Weight

def _norm_prefix(prefix: str) -> str:
    # "model.layers.0.mlp.down_proj" and "model.layers.0.mlp.down_proj." both name the module
    return prefix + "." if prefix and not prefix.endswith(".") else prefix


def _scalar_f32(t: Tensor, name: str) -> Tensor:
    if not t.is_floating_point() or t.numel() != 1:
        raise ValueError(f"{name} must be a float32 scalar, got {t.dtype} shape {tuple(t.shape)}")
    return t.reshape(()).float()


def from_modelopt(tensors: Mapping[str, Tensor], prefix: str = "") -> FP4Weight:
    """Build an NVFP4 :class:`FP4Weight` from ModelOpt tensors ``{prefix}weight``, ``weight_scale``,
    ``weight_scale_2`` and optional ``input_scale`` (a trailing ``.`` on ``prefix`` is optional)."""
    p = _norm_prefix(prefix)
    names = {k: p + k for k in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
    for k in ("weight", "weight_scale", "weight_scale_2"):
        if names[k] not in tensors:
            raise KeyError(f"ModelOpt NVFP4 tensor {names[k]!r} is missing")
    w, s = tensors[names["weight"]], tensors[names["weight_scale"]]
    if w.dtype != torch.uint8 or w.ndim < 2:
        raise ValueError(f"{names['weight']} must be uint8 [N, K/2], got {w.dtype} shape {tuple(w.shape)}")
    if s.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{names['weight_scale']} must be float8_e4m3fn, got {s.dtype}")
    want = (*w.shape[:-1], w.shape[-1] * 2 // 16)
    if (w.shape[-1] * 2) % 16 or tuple(s.shape) != want:
        raise ValueError(f"{names['weight_scale']} has shape {tuple(s.shape)}, expected {want} "
                         f"for {names['weight']} {tuple(w.shape)} (K={w.shape[-1] * 2})")
    g = _scalar_f32(tensors[names["weight_scale_2"]], names["weight_scale_2"])
    i = tensors.get(names["input_scale"])
    i = None if i is None else _scalar_f32(i, names["input_scale"])
    dev = w.device
    return FP4Weight(w, s.to(dev), g.to(dev), "nvfp4", None if i is None else i.to(dev))


def to_modelopt(w: FP4Weight, prefix: str = "") -> dict[str, Tensor]:
    """Inverse of :func:`from_modelopt` for a 2-D NVFP4 weight; tensors are contiguous CPU copies
    (ready for ``safetensors.torch.save_file``). Use ``w.expert(e)`` for stacked experts."""
    if w.fmt != "nvfp4":
        raise ValueError(f"ModelOpt NVFP4 export needs fmt='nvfp4', got {w.fmt!r}")
    if w.num_experts is not None:
        raise ValueError(f"to_modelopt exports one [N, K] weight; got shape {w.shape} (use w.expert(e))")
    p = _norm_prefix(prefix)
    cpu = lambda t: t.detach().to("cpu").contiguous().clone()  # noqa: E731 - clone: no shared storage
    out = {p + "weight": cpu(w.packed), p + "weight_scale": cpu(w.scales),
           p + "weight_scale_2": cpu(w.global_scale.reshape(()))}
    if w.input_scale is not None:
        out[p + "input_scale"] = cpu(w.input_scale)
    return out


def load_modelopt_safetensors(path: str, prefix: str = "", device: str = "cpu") -> FP4Weight:
    """Read one NVFP4 linear from a ModelOpt ``.safetensors`` file (or checkpoint directory / index),
    loading only its tensors: the checkpoint reader (autotune.core.checkpoint) with ModelOpt NVFP4
    assumed when the checkpoint has no quantization config."""
    from autotune.core.checkpoint import MODELOPT_NVFP4, Checkpoint

    with Checkpoint.open(path, assume=MODELOPT_NVFP4) as ck:
        return ck.linear(prefix.rstrip(".")).to(device)
