"""The library API that users and the `autotune` command call: one function per command.

    autotune.search("glm5", tp=8)                 # or autotune.api.search(...)
    autotune.api.show(cache, model="glm5", tp=8)

Bad input (an unknown model, malformed buckets, an unwritable cache, bad settings) raises
`BadInput` with a one-line message; the CLI prints it and exits 2. The engine and the families
load torch, so they are imported when a search runs, not when this module loads: `autotune
models`, `show` and the `cache` commands stay light.
"""
from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from autotune.core import settings
from autotune.core.arch import ARCHS, Arch, detect, get_arch
from autotune.core.buckets import Buckets, hybrid
from autotune.core.env import current
from autotune.core.problem import Problem
from autotune import request
from autotune.engine import options, strategies
from autotune.engine.options import OptionError
from autotune.models import ModelError, ProblemUse, problems_for
from autotune.report import collect, measure_ceilings as report_ceilings, show_misses, write_html
from autotune.report.model import Summary, static_plans
from autotune.report.sources import StoreUnion
from autotune.report.step import StepJsonError, attach_measured, load_measured
from autotune.runtime.misses import search_input_from_misses
from autotune.cache import CacheError, Store, check_winner
# after `cache`: importing portable first would run cache/__init__, which imports portable half-made
from autotune.integrations.prune import prune as prune_store, select_devices

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

    notes: list[str] = []
    target = target_arch(inp.arch)
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
        buckets = inp.buckets
        if isinstance(buckets, Buckets) or (buckets is not None and not isinstance(buckets, str)):
            b = buckets if isinstance(buckets, Buckets) else _buckets_of(buckets)
        else:
            b, note = parse_buckets(buckets, inp.max_tokens)
            notes += [note] if note else []
    fams = parse_families(inp.families)
    env = top.get("env") or current()
    live = detect() if env.device == "cuda" else ARCHS["cpu"]
    dry_run = bool(top.get("dry_run"))
    measuring = not dry_run and target == live
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
    cores, jobs = os.cpu_count() or 1, len(uses) * len(b.values)
    cap = max(1, min(jobs, cores))
    if not r.gpus and r.workers > cap:     # more CPU workers than jobs or cores only costs memory
        msg = (f"--workers {r.workers} capped at {cap}: {jobs} job(s) ((problem, bucket) pairs) on {cores} CPU "
               f"core(s)")
        warnings.warn(msg, stacklevel=2)
        notes.append(msg)
        o = replace(o, runner=replace(r, workers=cap))
        r = o.runner
    if measuring and own_runner and not r.gpus and not r.ray and r.isolate and r.workers == 1 and env.device == "cuda":
        import torch
        o = replace(o, runner=replace(r, gpus=tuple(range(torch.cuda.device_count()))))   # one worker per GPU
    if measuring:
        _check_search_fits(uses, b, env)
    store = _search_store(cache) if measuring else None
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
    from autotune.core.inputs import set_bytes
    from autotune.core.operands import out_shape
    avail = _device_bytes(env.device)
    if avail is None:
        return
    m = max(b.values)
    for u in uses:
        p = u.problem
        need = set_bytes(p, m) + 10 * _prod(out_shape(p, m))     # + the output and its float64 reference
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


# -- verify: the deployment image's layers, served as an engine serves them ----------------------

@dataclass
class Verified:
    """One distinct problem of a model, served from a cache as an engine serves it (`verify`)."""

    problem: str
    ms: tuple[int, ...]            # the M checked (each rung's bucket, or those asked for)
    m: int                         # the M with the largest row error (or the first failure's)
    tactic: str                    # what served that M
    rung: str                      # its rung ("exact", "default", …; "one copy: substituted")
    max_row_err: float             # the largest row's relative error, eager and replayed, over every M
    replay_checked: int            # of the rungs served by a stored winner, those whose winner passed the replay check
    winners: int                   # rungs served by a stored winner
    ok: bool
    why: str = ""

    def line(self) -> str:
        rc = f"{self.replay_checked}/{self.winners}" if self.winners else "-"
        mark = "" if self.replay_checked == self.winners else " (not replay-checked: some winners)"
        return (f"{'PASS' if self.ok else 'FAIL'}  {self.problem}  M={self.m} {self.tactic} ({self.rung})  "
                f"max row err {self.max_row_err:.3g}  replay-checked {rc}{mark}  [{len(self.ms)} M]"
                + (f"  {self.why}" if self.why else ""))


def verify(model: str | os.PathLike, cache=None, *, tp: int = 1, ep: int = 1, one_copy: bool = False,
           one_copy_upto: int | None = None, ms: Sequence[int] | None = None, seed: int = 0) -> list[Verified]:
    """Every distinct problem of `model` served from `cache` as an engine serves it: a Dispatcher
    with the runtime's defaults (`one_copy` / `one_copy_upto` as an engine would pass them), each
    problem's random weight bound once (`Dispatcher.bind`, a clone: one copy packs it in place), and
    at every M (each rung's bucket, or `ms`) the rung's launcher called as the layers call it:
    eagerly, then captured (a CUDA graph on the GPU, a recorded-call capture elsewhere) and replayed
    with x, routes and weights refreshed in place (autotune.engine.replay). Each output row is
    compared against float64; a bad-id word set by valid ids fails too. One `Verified` per problem."""
    import zlib

    from autotune.core import inputs
    from autotune.core.formats import FP4Weight
    from autotune.engine import replay
    from autotune.runtime.dispatch import Dispatcher
    env = current()
    for m in ms or ():
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise BadInput(f"--m: every M must be a positive integer, not {m!r}")
    uses = model_problems(model, tp=tp, ep=ep, include_attention=True, fused_moe=True, fold_shared=True,
                          fused_mlp=True)
    store = open_store(cache, readonly=True)
    try:
        won = {(w.problem_key, w.bucket): w for w in store.winners(env.device_key) if check_winner(w) is None}
        d = Dispatcher(store, env=env, record_misses=False, one_copy=one_copy, one_copy_upto=one_copy_upto)
        out = []
        for p in dict.fromkeys(u.problem for u in uses):
            s = zlib.crc32(f"verify:{seed}:{p.key}".encode())
            w = inputs.make_inputs(p, 1, env.device, s, 1, weights=[inputs.seeded_weight(p, env.device, s)])[0].w
            clone = FP4Weight(w.packed.clone(), w.scales.clone(), w.global_scale.clone(), w.fmt, w.input_scale)
            try:
                bt = d.bind(p, clone)
            except (ValueError, TypeError) as e:
                out.append(Verified(p.key, (), 0, "-", "-", math.inf, 0, 0, False, f"bind: {e}"))
                continue
            subs = {b: u for b, _, u in bt.substituted}
            table = d.table(p)
            todo = tuple(ms) if ms else (tuple(table.buckets) or (1,))
            worst, first_bad, rc, nw = (0.0, todo[0], "-", "-"), None, 0, 0
            for m in todo:
                rung, t = d.rung_for(p, m)
                if m in subs:
                    rung, t = "one copy: substituted", subs[m]
                stored = won.get((p.key, m))
                if stored is not None and rung == "exact" and m not in subs:
                    nw += 1
                    rc += bool(stored.replay_checked)
                launcher = bt.launcher(m)
                refs = replay.draw(p, m, env.device, s, w)
                try:
                    eager = replay.row_error(p, replay.served_call(p, launcher, refs.sets[0])(), refs.refs[0],
                                             refs.sets[0].topk_ids)
                    tol = replay.ROW_SLACK * inputs.TOLERANCE[p.out_dtype]
                    if not eager <= tol:
                        raise replay.ReplayFailed(f"eager: largest row relative error {eager:.3g} > {tol:g}")
                    err = max(eager, replay.check(p, launcher, refs, env.device, d.scratch, None).max_row_err)
                    bad = d.routing_errors()
                    if bad:
                        raise replay.ReplayFailed(f"the bad-id word of {bad[0]} is set though every id was valid")
                except Exception as e:       # a launcher's own error is this M's failure, not verify's
                    if first_bad is None:
                        text = str(e).splitlines()[0][:200] if str(e) else ""
                        first_bad = (m, str(t), rung, f"M={m}: {type(e).__name__}" + (f": {text}" if text else ""))
                    continue
                if err >= worst[0]:
                    worst = (err, m, str(t), rung)
            if first_bad is not None:
                m, t, rung, why = first_bad
                out.append(Verified(p.key, todo, m, t, rung, math.inf, rc, nw, False, why))
            else:
                out.append(Verified(p.key, todo, worst[1], worst[2], worst[3], worst[0], rc, nw, True))
        return out
    finally:
        store.close()
