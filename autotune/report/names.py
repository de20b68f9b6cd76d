"""Names a reader of the report thinks in: the model's layers instead of problem keys, and tactic
names cut to what makes a tactic differ from its family's default."""
from __future__ import annotations

import json
from functools import lru_cache

from autotune.core.problem import Problem


def layer_title(layers: tuple[str, ...], per_forward: int | None) -> str:
    """('mlp.experts.w13[3-77]',), 75 -> 'mlp.experts.w13 [3–77], 75× per forward'."""
    names = ", ".join(_spaced(n) for n in layers)
    return f"{names}, {per_forward}× per forward" if per_forward else names


def layer_label(layers: tuple[str, ...], per_forward: int | None, key: str) -> str:
    """The shorter legend form: 'mlp.experts.w13 [3–77] ×75', or the key when the model is unknown."""
    if not layers:
        return key
    names = ", ".join(_spaced(n) for n in layers)
    return f"{names} ×{per_forward}" if per_forward else names


def _spaced(name: str) -> str:
    base, sep, rng = name.partition("[")
    return f"{base} [{rng.replace('-', '–')}" if sep else name


@lru_cache(maxsize=1024)
def family_default(family: str, problem_key: str, arch_name: str) -> dict | None:
    """The parameters of `family`'s default tactic for the problem on `arch_name`, or None where the
    family or the arch cannot say here (a family not importable on this machine). The families
    (and torch) are imported on the first call only: `autotune show` never asks."""
    try:
        from autotune.core.arch import get_arch
        from autotune.tactics import registry
        return dict(registry.get(family).default(Problem.from_key(problem_key), get_arch(arch_name)).params)
    except Exception:            # noqa: BLE001 - any family failure only costs the shorter name
        return None


def short_tactic(params_json: str, base: dict | None) -> str:
    """family[the parameters that differ from `base`]: 'triton[block_m=16,split_k=8]'; the
    family alone ('triton default') when none differs; every parameter when no base is known."""
    d = json.loads(params_json)
    prm = d["params"]
    if base is None:
        diff = prm
    else:
        diff = {k: v for k, v in prm.items() if base.get(k, object()) != v}
    if base is not None and not diff:
        return f"{d['family']} default"
    return f"{d['family']}[" + ",".join(f"{k}={v}" for k, v in diff.items()) + "]"
