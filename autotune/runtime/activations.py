"""W4A4 or W4A16: how a checkpoint whose scheme quantizes activations is run, one rule for the
search (`autotune search --model DIR`) and the loaders (`from_pretrained`), so what is searched
is what is served.

A W4A4 checkpoint (ModelOpt NVFP4, compressed-tensors NVFP4 with a static input scale) means
W4A4 in vLLM, SGLang and TensorRT-LLM. Setting (`activations=` / `--activations` /
$AUTOTUNE_ACTIVATIONS):

* "auto" (default): the W4A4 problem where a W4A4 tactic exists for the arch — a family that is
  not an emulation supports the problem and keeps a tactic on an arch with native FP4 tensor
  cores — else the W4A16 problem with a one-time warning naming the difference;
* "w4a4": the W4A4 problem always (where no kernel exists, the torch family's emulated W4A4);
* "w4a16": the W4A16 problem always (bf16 activations; no warning).

A checkpoint without activation scales is W4A16 whatever the setting ("w4a4" is refused there).
"""
from __future__ import annotations

import warnings
from dataclasses import replace
from functools import lru_cache

from autotune.core import settings
from autotune.core.arch import Arch
from autotune.core.problem import Problem

_WARNED: set[tuple] = set()


@lru_cache(maxsize=256)
def w4a4_tactic_exists(problem: Problem, arch: Arch) -> bool:
    """Does a non-emulating family keep a tactic for this W4A4 problem on `arch`? Static verdicts
    only (nothing compiled); an arch without native FP4 tensor cores has none."""
    if problem.a_fmt == "bf16" or arch.fp4 != "native":
        return False
    from autotune.tactics import registry
    for name in registry.names():
        try:
            fam = registry.get(name)
        except ImportError:
            continue
        if getattr(fam, "w4a4_emulated", False) or fam.supports(problem) is not None:
            continue
        if any(not fam.verdict(problem, t, arch).rejected for t in fam.enumerate(problem, arch)):
            return True
    return False


def choose(problem: Problem, *, checkpoint_w4a4: bool, arch: Arch, activations: str | None = None,
           what: str = "") -> Problem:
    """`problem` (its W4A16 form) with the activation format the setting picks for `arch`."""
    mode = settings.activations(activations)
    base = replace(problem, a_fmt="bf16")
    if not checkpoint_w4a4:
        if mode == "w4a4":
            raise ValueError(f"{what or problem.key}: activations='w4a4' but the checkpoint has no static "
                             "activation scales (a W4A16 checkpoint)")
        return base
    w4a4 = replace(problem, a_fmt=problem.w_fmt)
    if mode == "w4a16":
        return base
    if mode == "w4a4" or w4a4_tactic_exists(w4a4, arch):
        return w4a4
    key = (arch.name, problem.kind, problem.w_fmt)
    if key not in _WARNED:
        _WARNED.add(key)
        kind = "grouped-MoE" if problem.kind == "grouped_moe" else "dense"
        warnings.warn(f"{what or problem.key}: the checkpoint is W4A4 (static {problem.w_fmt} activation scales) but "
                      f"{arch.name} has no W4A4 {kind} tactic: running W4A16 (bf16 activations, not quantized), "
                      f"which differs from the engines' W4A4 by the activation quantization error; "
                      f"activations='w4a4' (or ${settings.ACTIVATIONS}=w4a4) runs W4A4 (emulated by the torch "
                      f"family where no kernel has it), 'w4a16' silences this", stacklevel=3)
    return base
