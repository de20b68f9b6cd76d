"""The library API that users and the `autotune` command call: one function per command.

    autotune.search("glm5", tp=8)                 # or autotune.api.search(...)
    autotune.api.show(cache, model="glm5", tp=8)

Bad input (an unknown model, malformed buckets, an unwritable cache, bad settings) raises
`BadInput` with a one-line message; the CLI prints it and exits 2. The engine and the families
load torch, so they are imported when a search runs, not when this module loads: `autotune
models`, `show` and the `cache` commands stay light.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, replace
from typing import Sequence

from autotune.core.arch import ARCHS, detect
from autotune.core.buckets import Buckets, hybrid
from autotune.core.env import current
from autotune.core.problem import Problem
from autotune import request
from autotune.engine import options, strategies
from autotune.engine.options import OptionError
from autotune.models import ProblemUse
from autotune.cache import CacheError, Store
# after `cache`: importing portable first would run cache/__init__, which imports portable half-made
from autotune.integrations.prune import prune as prune_store, select_devices
from autotune.api.args import (DEFAULT_MAX_TOKENS, MAX_DIM, BadInput, _only, from_misses,  # noqa: F401
                               model_problems, open_store, with_layers, parse_buckets, parse_families, target_arch)
from autotune.api.show import Shown, explain, measure_ceilings, show, summary, write_report  # noqa: F401
from autotune.api.verify import Verified, verify  # noqa: F401


@dataclass
class SearchResult:
    """A search's report with what it was asked: the problems (with their layers), the tactics
    listed per problem key, the cache written (None when nothing was measured), notes on input."""

    report: object                     # autotune.engine.search.SearchReport
    uses: list[ProblemUse]
    listed: dict = field(default_factory=dict)
    cache_url: str | None = None
    input_notes: list[str] = field(default_factory=list)


def run(model: str | os.PathLike | Sequence[Problem] | None = None, **kw) -> SearchResult:
    """One search as the CLI runs it. The keywords are the CLI's flags by name (autotune/request.py's
    `SearchInput`: tp, ep, families, buckets, max_tokens, cache, arch, only, …; and the flags of
    autotune/engine/options.py: budget_s, workers, timeout_s, isolate, …) and `SearchOptions` fields
    (margin, retry_failed, runner=, halving=, timer=, env=, …; a flag given over its group's object
    sets that field). A refused value raises BadInput naming the flag.

    The defaults tune what the runtime serves with its defaults: every family that imports (those
    the device cannot run are left out with the reason), the routed experts' fused forms FP4MoE
    runs (fused_moe) and the SwiGLU gate_up FP4MLP runs (fused_mlp; `only` narrows), one worker per
    visible GPU, and the ranked strategy where a
    rank model covers the arch (else successive halving, and the notes say which).
    fold_shared: also the routed problems with the shared expert folded in (FP4MoE(shared=...))."""
    inp, top, nested = request.split({**kw, **({"model": model} if model is not None else {})})
    if top.get("strategy") is None:     # --batch-invariant needs every candidate timed in every bucket
        top["strategy"] = strategies.default(bool(top.get("batch_invariant")))
    from autotune.engine.search import plan, search as engine_search   # torch: see above

    target = target_arch(inp.arch)
    uses, b, notes = _uses_and_buckets(inp, target)
    fams = parse_families(inp.families)
    env = top.get("env") or current()
    live = detect() if env.device == "cuda" else ARCHS["cpu"]
    measuring = not bool(top.get("dry_run")) and target == live
    o = _search_options(top, nested, target, env, measuring, len(uses) * len(b.values), notes)
    if measuring:
        _check_search_fits(uses, b, env)
    store = _search_store(inp.cache) if measuring else None
    try:
        report = engine_search([u.problem for u in uses], families=fams, store=store, buckets=b, options=o)
    except KeyboardInterrupt as e:
        setattr(e, "uses", uses)       # the CLI prints the partial report
        raise
    report.notes[:0] = notes
    listed = {}
    if inp.list_tactics:
        names = {n.strip() for n in inp.list_tactics.split(",")}
        shown = [f for f in fams if f.name in names]
        listed = {p.key: rows for p, rows in plan([u.problem for u in uses], shown, target).items()}
    return SearchResult(report, uses, listed, store.url if store is not None else None, notes)


def _uses_and_buckets(inp, target) -> tuple[list[ProblemUse], Buckets, list[str]]:
    """What a search measures: the problems (of recorded misses, of the model, or the Problems
    given), its buckets (the misses' own, or --buckets / --max-tokens) and a note on the buckets."""
    notes: list[str] = []
    model, cache = inp.model, inp.cache
    if inp.misses:
        keys = {u.problem.key for u in model_problems(model, tp=inp.tp, ep=inp.ep, include_attention=inp.include_attention,
                                                      fused_moe=inp.fused_moe, fold_shared=inp.fold_shared, fused_mlp=inp.fused_mlp,
                                                      activations=inp.activations, arch=target)} if model else None
        uses, b = from_misses(cache, keys)
        uses = _only(uses, inp.only) if inp.only else uses
    elif model is None:
        raise BadInput("search needs --model (or --from-misses)")
    else:
        if isinstance(model, (str, os.PathLike)):
            uses = model_problems(model, tp=inp.tp, ep=inp.ep, include_attention=inp.include_attention, only=inp.only,
                                  fused_moe=inp.fused_moe, fold_shared=inp.fold_shared, fused_mlp=inp.fused_mlp,
                                  activations=inp.activations,
                                  arch=target)
        else:
            uses = [ProblemUse(p, (), 1) for p in model]
        if inp.moe_layers:
            uses = with_layers(uses)
        buckets = inp.buckets
        if isinstance(buckets, Buckets) or (buckets is not None and not isinstance(buckets, str)):
            b = buckets if isinstance(buckets, Buckets) else _buckets_of(buckets)
        else:
            b, note = parse_buckets(buckets, inp.max_tokens)
            notes += [note] if note else []
    return uses, b, notes


def _search_options(top: dict, nested: dict, target, env, measuring: bool, jobs: int, notes: list[str]):
    """The search's options from its flags, the runner checked and fitted to this machine: CPU
    workers capped at the jobs ((problem, bucket) pairs) and cores (noted in `notes` and warned),
    one worker per GPU when a measuring search on CUDA asks for none."""
    dry_run = bool(top.get("dry_run"))
    own_runner = "runner" not in top       # a caller's own Runner keeps its fields but for the flags given
    if own_runner and nested.get("compile_workers") is None:
        nested["compile_workers"] = os.cpu_count() or 1
    try:
        o = options.build({**top, "arch": target, "dry_run": not measuring}, nested)
    except OptionError as e:
        raise BadInput(e.flag_message) from None
    r = o.runner
    if r.ray and not r.isolate:
        raise BadInput("--ray and --no-isolate exclude each other")
    if r.gpus and not dry_run and env.device != "cuda":
        raise BadInput(f"--gpus {','.join(map(str, r.gpus))}: this machine has no CUDA GPU")
    cores = os.cpu_count() or 1
    cap = max(1, min(jobs, cores))
    if not r.gpus and r.workers > cap:     # more CPU workers than jobs or cores only costs memory
        msg = (f"--workers {r.workers} capped at {cap}: {jobs} job(s) ((problem, bucket) pairs) on {cores} CPU "
               f"core(s)")
        warnings.warn(msg, stacklevel=3)     # at run's caller
        notes.append(msg)
        o = replace(o, runner=replace(r, workers=cap))
        r = o.runner
    if measuring and own_runner and not r.gpus and not r.ray and r.isolate and r.workers == 1 and env.device == "cuda":
        import torch
        o = replace(o, runner=replace(r, gpus=tuple(range(torch.cuda.device_count()))))   # one worker per GPU
    return o


def _search_store(cache) -> Store:
    """The cache a search writes; an in-memory database is refused (the search would keep nothing)."""
    if not hasattr(cache, "put_trial"):
        from autotune.cache.files import is_sqlite, parse, sqlite_file, to_url
        try:
            u = parse(to_url(cache))
        except CacheError as e:
            raise BadInput(str(e)) from None
        if is_sqlite(u) and sqlite_file(u) is None:
            raise BadInput(f"--cache {to_url(cache)} is an in-memory database: a search would measure and keep "
                           "nothing; give a cache file")
    return open_store(cache)


def _check_search_fits(uses: Sequence[ProblemUse], b: Buckets, env) -> None:
    """Refuse up front a problem whose inputs at the largest bucket cannot fit in the measuring
    device's memory (every tactic would fail at setup and be stored failed)."""
    from autotune.core import inputs, layer_inputs
    from autotune.core.operands import out_shape
    avail = _device_bytes(env.device)
    if avail is None:
        return
    m = max(b.values)
    for u in uses:
        p = u.problem
        io = layer_inputs if p.kind == layer_inputs.KIND else inputs
        need = io.set_bytes(p, m) + 10 * _prod((io.out_shape if io is layer_inputs else out_shape)(p, m))  # + out, its float64 ref
        if need > avail:
            raise BadInput(f"{p.key}: its inputs at M={m} take {need / 2**30:,.1f} GiB, more than the "
                           f"{avail / 2**30:,.1f} GiB of {env.device} memory here: nothing could be measured")


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _device_bytes(device: str) -> int | None:
    if device == "cuda":
        import torch
        if not torch.cuda.is_available():
            return None
        return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def fit_rank(cache=None, *, output: str | os.PathLike | None = None, device: str | None = None,
             rounds: int | None = None) -> list[tuple[str, object]]:
    """Fit the ranking model of `--strategy ranked` on a cache's trials, one per device (or the
    named device key / GPU name), saved as JSON next to the cache (`<cache>.rank-<arch>.json`) or
    at `output`. Returns (path, model) pairs. Needs LightGBM (`pip install 'fp4-autotune[rank]'`)."""
    from autotune.engine.strategies.ranked import rows as rankdata, model as rankmodel, plans as strategy
    store = open_store(cache, readonly=True)
    devs = [d for d in store.devices() if device in (None, d.get("device_key"), d.get("gpu_name"))]
    if not devs:
        raise BadInput(f"no device {device!r} in {store.url}" if device else f"no measured device in {store.url}")
    if output is not None and len(devs) > 1:
        raise BadInput(f"{len(devs)} devices in {store.url}: name one (--device) to write one --output file")
    out = []
    for d in devs:
        try:
            m = rankdata.train(store, d["device_key"], rounds=rounds or rankmodel.ROUNDS)
        except ValueError as e:
            raise BadInput(str(e)) from None
        arch = rankdata.device_arch(store, d["device_key"])[0]
        path = output or strategy.model_path(store, arch)
        if path is None:
            raise BadInput(f"{store.url} is not a file: give --output")
        out.append((str(rankmodel.save(m, path)), m))
    return out


def _buckets_of(values: Sequence[int]) -> Buckets:
    try:
        b = Buckets(tuple(values))
    except ValueError as e:
        raise BadInput(str(e)) from None
    if max(b.values) > MAX_DIM:
        raise BadInput(f"bucket {max(b.values)} is larger than {MAX_DIM}, the largest M supported")
    return b


def search(model_or_problems: str | Sequence[Problem], *, buckets: Buckets | Sequence[int] | None = None,
           max_tokens: int = DEFAULT_MAX_TOKENS, **kw):
    """Tune a model preset / config.json path, or an explicit list of Problems.

    Returns the SearchReport; winners land in `cache` (default: $AUTOTUNE_CACHE or the user
    cache directory). The keywords are `run`'s (tp, ep, families, cache, arch, dry_run, …, and
    SearchOptions fields: margin, timer, halving, runner, retry_failed…).
    """
    b = buckets if buckets is not None else Buckets(hybrid(max_tokens))   # explicit buckets are used as given
    return run(model_or_problems, buckets=b, **kw).report


def prune(cache=None, *, keep_gpu: Sequence[str] = (), drop_gpu: Sequence[str] = (), stale_libs: bool = False,
          misses: bool = False, dry_run: bool = False, stale_code: bool = False):
    """Drop trials, winners and misses of GPUs (names or device keys) no longer wanted, of other
    library versions on this machine's GPU (`stale_libs`), measured with other kernel code than
    this install's (`stale_code`, every device), and recorded misses."""
    if not (keep_gpu or drop_gpu or stale_libs or misses or stale_code):
        raise BadInput("nothing to prune: give --keep-gpu, --drop-gpu, --stale-libs, --stale-code or --misses")
    store = open_store(cache, readonly=dry_run)
    try:
        devs = list(store.device_records().values())
        keep = set().union(*(select_devices(devs, g) for g in keep_gpu)) if keep_gpu else None
        drop = set().union(*(select_devices(devs, g) for g in drop_gpu)) if drop_gpu else set()
        return prune_store(store, keep_devices=keep, drop_devices=drop, stale_libs=current() if stale_libs else None,
                           drop_misses=misses, dry_run=dry_run, stale_code=stale_code)
    except CacheError as e:
        raise BadInput(str(e)) from None
