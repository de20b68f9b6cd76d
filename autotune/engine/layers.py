"""Layer problems in a search (autotune.core.layer, `--moe-layers`): measured after their pair
problems, each bucket's job with one more competitor, the pair, made from the two pair problems'
stored winners at that bucket (`registry.pair_tactic`: no family named here).

`search` runs the problems in two passes when layer problems come with others: every other
problem first (their winners stored), then the layer problems by successive halving (the ranking
model has no layer rows); the two reports are summed into one.
"""
from __future__ import annotations

import zlib
from dataclasses import fields, replace
from functools import partial
from typing import Callable, Sequence

from autotune.core import layer_inputs as layer_io
from autotune.core.inputs import TOLERANCE
from autotune.core.layer import KIND, LayerProblem
from autotune.engine import replay as RP
from autotune.core.tactic import Tactic
from autotune.tactics import registry

#: the strategy that measures layer jobs
STRATEGY = "halving"


def split(problems: Sequence) -> tuple[list, list]:
    """(the problems that are not layers, the layer problems), each in the order given."""
    return [p for p in problems if p.kind != KIND], [p for p in problems if p.kind == KIND]


def pair_competitor(store, problem, bucket: int, device_key: str, lib_keys: dict) -> list[Tactic]:
    """[the pair tactic] for a layer job: its w13 and w2 problems' stored winners at `bucket` on this
    device, fresh under this search's libraries and code and not predicted; [] for a problem that is
    not a layer, or while either winner is missing."""
    if not isinstance(problem, LayerProblem):
        return []
    parts = []
    for sub in problem.pair:
        w = next((w for w in store.winners(device_key) if w.problem_key == sub.key and w.bucket == bucket), None)
        if w is None or w.predicted or w.family not in lib_keys or not registry.fresh(lib_keys, w):
            return []
        parts.append(Tactic.from_json(w.params_json))
    return [registry.pair_tactic(*parts)]


def lib_keys(env) -> dict[str, str]:
    """Every registered family's library key under `env` (those that import here)."""
    out = {}
    for name in registry.FAMILIES:
        try:
            out[name] = env.lib_key(registry.get(name).depends_on)
        except ImportError:
            continue
    return out


def for_layers(problems: Sequence, options, families: Sequence):
    """A search of layer problems only: by halving, with the layer family (its torch compositions and
    the pair) and every given family that runs the kind (`Family.kinds`: the cuda layer kernel).
    Anything else: as given, less the families that run layers only (a search without layer
    problems plans, lists and reports as before they existed)."""
    if problems and all(p.kind == KIND for p in problems):
        runs = [f for f in families if KIND in f.kinds and f.name != registry.LAYER]
        return replace(options, strategy=STRATEGY), [registry.get(registry.LAYER), *runs]
    return options, [f for f in families if set(f.kinds) - {KIND}]


def in_order(run: Callable, problems: Sequence, options):
    """`run(problems, options)` for the other problems, then for the layer problems (by halving);
    one report."""
    others, layers = split(problems)
    first = run(others, options)
    second = run(layers, replace(options, strategy=STRATEGY))
    return merged(first, second)


def merged(a, b):
    """Two search reports as one: counts summed, lists and dicts joined, stages merged."""
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, bool) or x is None or isinstance(x, str):
            if x is None:
                setattr(a, f.name, y)
        elif isinstance(x, int):
            setattr(a, f.name, x + y)
        elif isinstance(x, list):
            x.extend(y)
        elif isinstance(x, dict):
            x.update(y)
        elif hasattr(x, "merge") and hasattr(y, "state"):
            x.merge(y.state())
    return a


def replay(problem: LayerProblem, launcher, bucket: int, device: str, seed: int, known: tuple,
           weights: tuple | None = None) -> dict:
    """The replay check (autotune.engine.replay's rule) of a layer tactic: no layer is bound by the
    runtime yet, so the built launcher is called with `out=None` as an engine would, eagerly, then
    captured — a CUDA graph where the launcher is capture-safe on a GPU (the layer kernel), else a
    recorded call (the torch compositions, the pair) — and replayed with x, ids (a -1 slot) and
    weights of a second seed and of the job's set 0 overwritten in place, each replay's rows against
    its float64 reference. `weights`: (w13, w2) as the launcher takes them (the search's packs of
    set 0's), default set 0's own. Raises replay.ReplayFailed."""
    first, first_ref = known
    s = zlib.crc32(f"replay:{seed}:{problem.key}:{bucket}:1".encode())
    second = layer_io.make_inputs(problem, bucket, device, s, weights=[(first.w13, first.w2)])[0]
    if second.topk_ids.numel():
        second.topk_ids[-1, -1] = -1
    sets, refs = (first, second), (first_ref, layer_io.reference(problem, second))
    w13, w2 = weights or (first.w13, first.w2)
    live = layer_io.LayerInputs(first.x.clone(), w13, w2, first.topk_ids.clone(), first.topk_weights.clone())
    call = partial(launcher, live.x, live.w13, live.w2, live.topk_ids, live.topk_weights)
    real = device == "cuda" and launcher.caps.capture_safe
    cap = RP.Graph() if real else RP.Recorded()
    RP.warm(call, real)
    replays, tol, worst = RP.REPLAYS if real else RP.RECORDED_REPLAYS, RP.ROW_SLACK * TOLERANCE[problem.out_dtype], 0.0
    try:
        cap.capture(call)
        for r in range(replays):
            j = (r + 1) % 2                    # the second seed first: values the capture did not see
            live.x.copy_(sets[j].x)
            live.topk_ids.copy_(sets[j].topk_ids)
            live.topk_weights.copy_(sets[j].topk_weights)
            cap.out.fill_(float("nan"))
            cap.replay()
            err = RP.row_error(problem, cap.out, refs[j], None)
            if not err <= tol:
                raise RP.ReplayFailed(f"replay {r + 1} (inputs refreshed in place): largest row relative error "
                                      f"{err:.3g} > {tol:g} against the float64 reference")
            worst = max(worst, err)
    finally:
        cap.release()
    return {"max_row_err": worst, "mode": cap.mode, "replays": replays}
