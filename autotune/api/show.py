"""`show`, `show --explain` and `report`: what a cache holds, read back for a terminal or a page."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from autotune.core import settings
from autotune.core.env import current
from autotune.core.problem import Problem
from autotune.models import ProblemUse
from autotune.report import collect, measure_ceilings as report_ceilings, show_misses, write_html
from autotune.report.model import Summary, static_plans
from autotune.report.sources import StoreUnion
from autotune.report.step import StepJsonError, attach_measured, load_measured
from autotune.cache import CacheError, Store, check_winner
from autotune.api.args import BadInput, model_problems, open_store, parse_buckets, parse_families, target_arch


@dataclass
class Shown:
    """What `show` found: winners (with the report summary) or recorded misses, and GPU names."""

    url: str
    gpu_names: dict
    winners: list = field(default_factory=list)
    summary: Summary | None = None
    misses: list | None = None
    notes: list = field(default_factory=list)     # rows left out by autotune.cache.rows' checks, counted
    stale: list = field(default_factory=list)     # show --stale: (winner, why its code key is not this code's)
    stale_trials: int = 0                         # show --stale: trials measured with other code


def show(cache=None, *, model: str | None = None, tp: int = 1, ep: int = 1, misses: bool = False,
         stale: bool = False) -> Shown:
    """The winners stored in the cache (or the recorded dispatch misses), sorted, optionally only
    `model`'s problems. Misses come from $AUTOTUNE_MISSES when no cache is given (where a
    read-only deployment keeps them). `stale`: the winners (and a count of trials) measured with
    other kernel code than this install's, which dispatch does not serve."""
    if misses and cache is None and settings.misses_url():
        cache = settings.misses_url()
    store = open_store(cache, readonly=True)
    uses = model_problems(model, tp=tp, ep=ep, include_attention=True, fused_moe=True,
                          fold_shared=True, fused_mlp=True) if model else None
    keys = {u.problem.key for u in uses} if uses else None
    names = {k: r.get("gpu_name") for k, r in store.device_records().items()}
    if misses:
        rows, notes = show_misses(store, keys)
        return Shown(store.url, names, misses=rows, notes=notes)
    every = [w for w in store.winners() if keys is None or w.problem_key in keys]
    rows = [w for w in every if check_winner(w) is None]     # the damaged ones are counted in the summary
    rows.sort(key=lambda w: (w.problem_key, w.device_key, w.bucket))
    if stale:
        from autotune.tactics import registry       # loads the families: only --stale judges code keys
        judged = [(w, registry.stale_code(w)) for w in rows]
        n = sum(registry.stale_code(t) is not None for t in store.trials() if keys is None or t.problem_key in keys)
        return Shown(store.url, names, rows, None, stale=[(w, why) for w, why in judged if why], stale_trials=n)
    s = summary(store, keys, uses) if every else None
    return Shown(store.url, names, rows, s, notes=list(s.notes) if s else [])


def explain(cache=None, *, model: str, tp: int = 1, ep: int = 1) -> list:
    """`show --explain`: per problem of `model` (the forms the runtime serves with its defaults) and
    per tuned M, the rung a Dispatcher built here answers on and why (autotune.report.explain.Rung)."""
    from autotune.report.explain import rungs
    uses = model_problems(model, tp=tp, ep=ep, fused_moe=True, fold_shared=True, fused_mlp=True)
    return rungs(open_store(cache, readonly=True), uses, current(), list(parse_buckets(None, None)[0]))


def summary(store: Store, keys: set[str] | None = None, uses: list[ProblemUse] | None = None) -> Summary:
    try:
        return collect(store, keys, uses)
    except CacheError as e:
        raise BadInput(str(e)) from None


def measure_ceilings(cache=None):
    """Measure this machine's copy bandwidth and bf16 matmul rate into the cache.
    Returns (device key, ceilings, whether the cache holds results of this device)."""
    store = open_store(cache)
    try:
        dk, c = report_ceilings(store)
        return dk, c, store.device(dk) is not None
    finally:
        store.close()


def write_report(output: str | os.PathLike, *, cache=None, model: str | None = None, tp: int = 1, ep: int = 1,
                 plan_arch: str | None = None, families: str = "triton,torch",
                 step_json: str | os.PathLike | None = None) -> tuple[Path, int, int]:
    """The HTML report of what the cache holds (with static verdicts for `plan_arch`, e.g.
    "sm100,sm120"). `cache` may be a list: several caches read as one, a later one winning on the
    same row (autotune.report.sources). `step_json`: the MLP-step benchmark's measured step, shown
    beside the estimate (needs `model`). Returns (index.html, winners shown, devices)."""
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise BadInput(f"output {out} exists and is not a directory")
    uses = model_problems(model, tp=tp, ep=ep, include_attention=True, fused_moe=True,
                          fold_shared=True, fused_mlp=True) if model else None
    keys = {u.problem.key for u in uses} if uses else None
    if step_json is not None and not model:
        raise BadInput("--step-json needs --model (the layer counts of the step)")
    archs = [target_arch(a) for a in plan_arch.split(",") if a.strip()] if plan_arch else []
    fams = parse_families(families) if archs else []
    caches = list(cache) if isinstance(cache, (list, tuple)) else [cache]
    stores = [open_store(c, readonly=True) for c in caches or [None]]
    store = stores[0] if len(stores) == 1 else StoreUnion(stores)
    s = summary(store, keys, uses)
    if step_json is not None:
        try:
            attach_measured(s, load_measured(step_json, uses))
        except StepJsonError as e:
            raise BadInput(str(e)) from None
    if archs:
        pkeys = sorted(keys) if keys else [p.key for p in store.problems()]
        s.plans = static_plans([Problem.from_key(k) for k in pkeys], fams, archs)
    try:
        index = write_html(s, out)
    except ModuleNotFoundError as e:
        raise BadInput(f"the report needs {e.name}: pip install 'fp4-autotune[report]'") from None
    except OSError as e:
        raise BadInput(f"cannot write the report to {out}: {e.strerror or e}") from None
    return index, sum(len(v.points) for d in s.devices for v in d.problems), len(s.devices)
