"""What a command is given, turned into values: models into problems, buckets, target
architectures, families, the cache opened. Bad input raises `BadInput` in one line."""
from __future__ import annotations

import os
from typing import Sequence

from autotune.core import settings
from autotune.core.arch import Arch, detect, get_arch
from autotune.core.buckets import Buckets, hybrid
from autotune.core.env import current
from autotune.core.problem import Problem
from autotune.models import ModelError, ProblemUse, problems_for
from autotune.runtime.misses import search_input_from_misses
from autotune.cache import CacheError, Store

#: the largest M or N/K dimension accepted: int32 indexing in the kernels; beyond it a cache
#: column would overflow (SQLite INTEGER) before anything useful could run
MAX_DIM = 2**31 - 1
DEFAULT_MAX_TOKENS = 8192


class BadInput(ValueError):
    """Input the library refuses, in one line (the CLI exits 2 with it)."""


def _activation_choice(arch: Arch | str | None, activations: str | None):
    """Problem -> Problem: a W4A4 checkpoint's layer as the loaders will run it on `arch` (the
    same rule: autotune.runtime.activations.choose), so what is searched is what is served."""
    target = arch if isinstance(arch, Arch) else target_arch(arch)
    try:
        settings.activations(activations)
    except ValueError as e:
        raise BadInput(str(e)) from None

    def act(p: Problem) -> Problem:
        from autotune.runtime.activations import choose      # loads the families on first use
        return choose(p, checkpoint_w4a4=True, arch=target, activations=activations)
    return act


def model_problems(model: str | os.PathLike, *, tp: int = 1, ep: int = 1, include_attention: bool = False,
             only: str | None = None, fused_moe: bool = False, fold_shared: bool = False,
             activations: str | None = None, arch: Arch | str | None = None,
             fused_mlp: bool = False) -> list[ProblemUse]:
    """The model's problems (fused_moe: with the routed experts' fused forms; fold_shared: with the
    shared expert folded into the routed ones; fused_mlp: with the dense and shared gate_up's SwiGLU
    form FP4MLP runs), narrowed to those whose key or a layer name
    contains one of the comma-separated strings in `only`. A W4A4 checkpoint's layers get the
    activation format the loaders pick on `arch` (default: the live device) under `activations`
    ("auto" | "w4a4" | "w4a16"; default $AUTOTUNE_ACTIVATIONS, else auto)."""
    try:
        uses = problems_for(model, tp=tp, ep=ep, include_attention=include_attention, fused_moe=fused_moe,
                            fold_shared=fold_shared, act=_activation_choice(arch, activations), fused_mlp=fused_mlp)
    except (ModelError, ValueError) as e:
        raise BadInput(str(e)) from None
    for u in uses:
        big = [d for d in ("n", "k") if getattr(u.problem, d) > MAX_DIM]
        if big:
            raise BadInput(f"{u.problem.key}: {big[0].upper()} = {getattr(u.problem, big[0])} is larger than "
                           f"{MAX_DIM}, the largest dimension supported")
    return _only(uses, only) if only else uses


def with_layers(uses: list[ProblemUse]) -> list[ProblemUse]:
    """`uses` and after them one whole-layer problem (autotune.core.layer, kind moe_layer) per routed
    w13 (SwiGLU) problem whose w2 (reduce) is among them too, with the w13's layers: `--moe-layers`."""
    from autotune.core.layer import KIND, LayerProblem
    keys = {u.problem.key for u in uses}
    out, seen = list(uses), set(keys)
    for u in uses:
        p = u.problem
        if p.kind != "grouped_moe" or p.epilogue != "swiglu" or p.a_fmt != "bf16" or p.w_fmt not in ("nvfp4", "mxfp4"):
            continue
        layer = LayerProblem(KIND, p.a_fmt, p.w_fmt, p.out_dtype, p.n, p.k, p.experts, p.top_k)
        if layer.w13 == p and layer.w2.key in keys and layer.key not in seen:
            seen.add(layer.key)
            out.append(ProblemUse(layer, u.layers, u.per_forward))
    return out


def _only(uses: list[ProblemUse], only: str) -> list[ProblemUse]:
    pats = [p.strip() for p in only.split(",") if p.strip()]
    kept = [u for u in uses if any(p in u.problem.key or any(p in layer for layer in u.layers) for p in pats)]
    if not kept:
        raise BadInput(f"--only {only!r} matches none of: " + ", ".join(u.problem.key for u in uses))
    return kept


def parse_buckets(spec: str | None = None, max_tokens: int | None = None) -> tuple[Buckets, str | None]:
    """(bucket set, note). No spec: the hybrid set up to max_tokens (default 8192). A spec is used
    as given; values above an explicit max_tokens are dropped, and the note says which."""
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise BadInput(f"--max-tokens must be a positive integer, got {max_tokens!r}")
    try:
        if spec is None:
            b, note = Buckets(hybrid(max_tokens if max_tokens is not None else DEFAULT_MAX_TOKENS)), None
        elif not spec.strip():
            raise BadInput("--buckets is empty: give M values like 1,2,4 or hybrid:8192 (or leave it out)")
        else:
            b, note = Buckets.parse(spec), None
            if max_tokens is not None and max(b.values) > max_tokens:
                over = [v for v in b.values if v > max_tokens]
                b = Buckets(tuple(v for v in b.values if v <= max_tokens) or (min(b.values),))
                note = f"buckets above --max-tokens {max_tokens} dropped: {', '.join(map(str, over))}"
    except ValueError as e:
        raise BadInput(str(e)) from None
    if max(b.values) > MAX_DIM:
        raise BadInput(f"bucket {max(b.values)} is larger than {MAX_DIM}, the largest M supported")
    return b, note


def target_arch(name: str | None) -> Arch:
    try:
        return get_arch(name) if name else detect()
    except ValueError as e:
        raise BadInput(str(e)) from None


def parse_families(spec: str | Sequence | None) -> list:
    """Family objects for a comma-separated spec; None: every registered family that imports here
    (the search then measures those available on the device and says why each other is left out)."""
    from autotune.tactics import registry      # loads torch
    if spec is None:
        out = []
        for name in registry.names():
            try:
                out.append(registry.get(name))
            except ImportError:
                continue          # its note comes from the family list the search prints
        return out
    if not isinstance(spec, str):
        return list(spec)
    try:
        return registry.parse(spec)
    except (ValueError, ImportError) as e:
        raise BadInput(str(e)) from None


def open_store(url=None, readonly: bool = False) -> Store:
    if hasattr(url, "put_trial"):     # already a Store (or one a caller made)
        return url
    try:
        if not readonly:
            Store.check_writable(url)
        return Store(url, readonly=readonly)
    except CacheError as e:
        raise BadInput(str(e)) from None


def from_misses(cache=None, keys: set[str] | None = None) -> tuple[list[ProblemUse], Buckets]:
    """The problems and M values dispatch recorded as misses on this device ($AUTOTUNE_MISSES,
    else `cache`), narrowed to `keys` when given."""
    store = open_store(settings.misses_url() or cache, readonly=True)
    found, ms, bad = search_input_from_misses(store.misses(), current().device_key, keys)
    store.close()
    if not found:
        raise BadInput(f"no recorded misses for this device in {store.url}" + (f" ({bad} unreadable)" if bad else ""))
    return [ProblemUse(p, ("recorded misses",), 1) for p in found], Buckets(ms)
