"""Model → per-GPU FP4 GEMM problems.

    problems_for("glm5", tp=8)                      # preset
    problems_for("/ckpt/GLM-5-NVFP4", tp=8, ep=8)   # HF checkpoint dir or its config.json

Returns one ProblemUse per distinct Problem (layers merged, per_forward summed), sorted by
Problem. Default: only the layers the FP4 checkpoint quantizes. include_attention=True adds
every other linear layer (attention, DSA indexer, MLPs a checkpoint left BF16) in the model's
FP4 weight format — they are tuned as if they were quantized; lm_head and the router never
appear, nor do MTP layers. Sharding rules: see autotune.models.layers.
"""
from __future__ import annotations

import os

from .arch import ArchConfig, ModelError, QuantRule
from .hf_config import load
from .layers import ProblemUse, build_problems
from .presets import PRESETS, list_models, normalize

__all__ = ["ArchConfig", "ModelError", "ProblemUse", "QuantRule", "list_models", "load_model", "problems_for"]


def load_model(model: str | os.PathLike) -> tuple[ArchConfig, QuantRule]:
    """Preset name, config.json path or checkpoint directory → (ArchConfig, QuantRule).

    A plain name (no path separator) that is a preset wins over a same-named file in the cwd."""
    if isinstance(model, str) and os.sep not in model and normalize(model) in PRESETS:
        return PRESETS[normalize(model)]
    if not isinstance(model, (str, os.PathLike)):
        raise ModelError(f"model must be a preset name or a path, got {type(model).__name__}")
    if os.path.exists(model):
        return load(model)
    raise ModelError(f"unknown model {os.fspath(model)!r}: not an existing path nor a preset "
                     f"({', '.join(list_models())})")


def problems_for(model: str | os.PathLike, tp: int = 1, ep: int = 1,
                 include_attention: bool = False, fused_moe: bool = False,
                 fold_shared: bool = False, act=None, fused_mlp: bool = False) -> list[ProblemUse]:
    """Per-GPU GEMM problems of `model` under tensor parallelism tp and expert parallelism ep
    (fused_moe: with the routed experts' fused forms; fold_shared: with the shared expert folded
    into the routed problems; fused_mlp: with the dense and shared gate_up's SwiGLU form FP4MLP
    runs; act: the W4A4 choice, see layers.build_problems)."""
    arch, rule = load_model(model)
    return build_problems(arch, rule, tp=tp, ep=ep, include_attention=include_attention, fused_moe=fused_moe,
                          fold_shared=fold_shared, act=act, fused_mlp=fused_mlp)
