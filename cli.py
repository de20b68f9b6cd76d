"""autotune: the command line. Parses, calls the library, prints; no logic of its own."""
from __future__ import annotations

import json
import os
import sys

import click

EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    exit_code = EXIT_BAD_INPUT


def _problems(model, tp, ep, include_attention):
    from autotune.models import ModelError, problems_for
    try:
        return problems_for(model, tp=tp, ep=ep, include_attention=include_attention)
    except (ModelError, ValueError) as e:
        raise BadInput(str(e)) from None


def _buckets(buckets, max_tokens):
    from autotune.core.buckets import Buckets, hybrid
    try:
        b = Buckets.parse(buckets) if buckets else Buckets(hybrid(max_tokens))
        if buckets and max_tokens:
            b = Buckets(tuple(v for v in b.values if v <= max_tokens) or (min(b.values),))
        return b
    except ValueError as e:
        raise BadInput(str(e)) from None


def _arch(name):
    from autotune.core.arch import detect, get_arch
    try:
        return get_arch(name) if name else detect()
    except ValueError as e:
        raise BadInput(str(e)) from None


def _families(csv):
    from tactics import registry
    try:
        return registry.parse(csv)
    except (ValueError, ImportError) as e:
        raise BadInput(str(e)) from None


def _open_store(url, readonly=False):
    from cache import CacheError, Store
    try:
        if not readonly:
            Store.check_writable(url)
        return Store(url, readonly=readonly)
    except CacheError as e:
        raise BadInput(str(e)) from None


@click.group()
@click.version_option(package_name="fp4-autotune")
def main():
    """Autotune FP4 GEMMs: static verdicts, checked timings, a SQLite tactic cache."""


@main.command()
@click.option("--model", default=None, help="preset name (see `autotune models`) or a path to an HF config.json")
@click.option("--from-misses", is_flag=True, help="tune the problems and M values dispatch recorded as misses (from $AUTOTUNE_MISSES or --cache; --model narrows them)")
@click.option("--tp", default=1, show_default=True, help="tensor-parallel size")
@click.option("--ep", default=1, show_default=True, help="expert-parallel size")
@click.option("--arch", default=None, help="target arch (sm120, …); default: the live device")
@click.option("--buckets", default=None, help="M buckets: '1,2,4,…', 'hybrid:8192', 'vllm:512' or 'sglang:256'")
@click.option("--max-tokens", default=8192, show_default=True, help="largest M (hybrid buckets up to it)")
@click.option("--families", default="triton,torch", show_default=True, help="tactic families, comma-separated")
@click.option("--cache", default=None, help="cache path or SQLAlchemy URL (default: $AUTOTUNE_CACHE or the user cache dir)")
@click.option("--include-attention", is_flag=True, help="also tune the layers the checkpoint keeps in BF16")
@click.option("--only", default=None, help="only problems whose key or layer names contain one of these comma-separated strings, e.g. grouped_moe or down_proj")
@click.option("--margin", default=0.03, show_default=True, help="a winner must beat the default by this fraction")
@click.option("--budget-ms", default=250, show_default=True, help="with --exhaustive: timing budget per tactic and bucket (ms)")
@click.option("--budget-s", default=2.0, show_default=True, help="successive halving: timing budget per (problem, bucket) in seconds")
@click.option("--exhaustive", is_flag=True, help="time every kept tactic fully (no successive halving)")
@click.option("--gpus", default=None, help="shard the work over these devices, one worker each, e.g. 0,1,2,3")
@click.option("--workers", default=1, show_default=True, help="worker processes when --gpus is not given")
@click.option("--ray", "ray_address", default=None, help="run jobs on a Ray cluster at this address ('local' starts one)")
@click.option("--compile-workers", default=None, type=int, help="processes compiling ahead of timing [default: CPU cores]")
@click.option("--compile-check", is_flag=True, help="with --arch: cross-compile kept tactics and compare smem with the verdicts")
@click.option("--timeout-s", default=300.0, show_default=True, help="a tactic's build/check or timing past this is killed and failed")
@click.option("--no-isolate", is_flag=True, help="measure in this process (debugging; a crashing tactic ends the search)")
@click.option("--max-tactics", default=None, type=int, help="time at most this many kept tactics per family and problem (evenly spaced; the default is always timed)")
@click.option("--retry-failed", is_flag=True, help="measure again tactics whose trials failed")
@click.option("--dry-run", is_flag=True, help="print the tactic space and verdicts; measure nothing")
@click.option("--list-tactics", default=None, help="also print every tactic of these families (comma-separated) with its verdict and reason")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def search(model, from_misses, tp, ep, arch, buckets, max_tokens, families, cache, include_attention, only, margin, budget_ms,
           budget_s, exhaustive, gpus, workers, ray_address, compile_workers, compile_check, timeout_s, no_isolate,
           max_tactics, retry_failed, dry_run, as_json, list_tactics=None):
    """Tune every FP4 GEMM of a model and store the winners."""
    from autotune.engine import timing
    from autotune.engine.search import search as run_search
    from autotune.core.arch import detect

    if from_misses:
        uses, b = _from_misses(cache, model, tp, ep, include_attention)
    elif model is None:
        raise BadInput("search needs --model (or --from-misses)")
    else:
        uses = _problems(model, tp, ep, include_attention)
        b = _buckets(buckets, max_tokens)
    if only:
        uses = _only(uses, only)
    target = _arch(arch)
    fams = _families(families)
    if not 0 <= margin < 1:
        raise BadInput(f"--margin must be in [0, 1), got {margin}")
    if max_tactics is not None and max_tactics < 1:
        raise BadInput(f"--max-tactics must be >= 1, got {max_tactics}")
    runner, halving = _runner(budget_s, exhaustive, gpus, workers, ray_address, compile_workers, timeout_s, no_isolate)
    measuring = not dry_run and target == detect()
    store = _open_store(cache) if measuring else None
    from autotune.engine.workers import WorkerStartError
    try:
        report = run_search([u.problem for u in uses], families=fams, store=store, buckets=b, arch=target,
                            margin=margin, timer=timing.TimerConfig(budget_s=budget_ms / 1000), halving=halving,
                            runner=runner, retry_failed=retry_failed, dry_run=not measuring,
                            compile_check=compile_check, max_tactics=max_tactics,
                            progress=not as_json and sys.stderr.isatty())
    except WorkerStartError as e:
        raise click.ClickException(str(e)) from None
    if as_json:
        click.echo(json.dumps(_report_json(report, uses), indent=2))
        return
    for n in report.notes:
        click.echo(n)
    for u in uses:
        click.echo(f"{u.problem.key}  ({', '.join(u.layers)}; {u.per_forward}× per forward)")
        for fp in report.plans.get(u.problem.key, []):
            click.echo(f"  {report.arch}: {fp.line()}")
        if list_tactics:    # one line per tactic: "kept" / "REJECTED" / "unknown", smem, reason
            from autotune.engine.search import plan as _plan
            shown = [f for f in fams if f.name in {n.strip() for n in list_tactics.split(",")}]
            for r in _plan([u.problem], shown, target)[u.problem]:
                v = r.verdict
                state = {True: "kept", False: "REJECTED", None: "unknown"}[v.ok]
                smem = f" smem {v.smem_bytes}/{v.smem_limit} stages {v.stages}" if v.smem_bytes else ""
                click.echo(f"    {state:8} {r.tactic}{smem}{': ' + v.reason if v.reason else ''}")
    if report.compiled:
        click.echo(f"compiled {report.compiled} kept tactics for {report.arch} "
                   f"({len(report.compile_failures)} failed, {len(report.model_errors)} smem disagreements)")
        for e in report.compile_failures:
            click.echo(f"COMPILE FAILED {e}")
    if measuring:
        click.echo(f"measured {report.measured} trials ({report.dropped} dropped by successive halving, "
                   f"{report.failed} failed), {report.resumed} already in the cache; "
                   f"{len(report.winners)} winners in {store.url}")
        if len(report.shards) > 1:
            click.echo("jobs per worker: " + ", ".join(f"{k} {v}" for k, v in sorted(report.shards.items())))
        if report.stages.data:
            click.echo("time per stage (summed over workers): " + report.stages.line())
    for e in report.model_errors:
        click.echo(f"MODEL ERROR {e}")


def _only(uses, only: str):
    """The problems whose key or one of whose layer names contains one of the comma-separated strings."""
    pats = [p.strip() for p in only.split(",") if p.strip()]
    kept = [u for u in uses if any(p in u.problem.key or any(p in layer for layer in u.layers) for p in pats)]
    if not kept:
        raise BadInput(f"--only {only!r} matches none of: " + ", ".join(u.problem.key for u in uses))
    return kept


def _from_misses(cache, model, tp, ep, include_attention):
    """(uses, buckets) for the misses recorded on this device: exactly those problems and M values."""
    import os

    from autotune.core.buckets import Buckets
    from autotune.runtime.dispatch import MISSES_ENV, search_input_from_misses
    from autotune.core.env import current
    from autotune.models import ProblemUse
    src = os.environ.get(MISSES_ENV) or cache
    store = _open_store(src, readonly=True)
    keys = {u.problem.key for u in _problems(model, tp, ep, include_attention)} if model else None
    problems, ms, bad = search_input_from_misses(store.misses(), current().device_key, keys)
    store.close()
    if not problems:
        raise BadInput(f"no recorded misses for this device in {store.url}" + (f" ({bad} unreadable)" if bad else ""))
    return [ProblemUse(p, ("recorded misses",), 1) for p in problems], Buckets(ms)


def _runner(budget_s, exhaustive, gpus, workers, ray_address, compile_workers, timeout_s, no_isolate):
    from autotune.engine.halving import Halving
    from autotune.engine.search import Runner
    ids: tuple[int, ...] = ()
    if gpus:
        try:
            ids = tuple(int(g) for g in gpus.split(",") if g.strip())
        except ValueError:
            raise BadInput(f"--gpus takes device indices like 0,1,2, got {gpus!r}") from None
    if ray_address and no_isolate:
        raise BadInput("--ray and --no-isolate exclude each other")
    try:
        runner = Runner(isolate=not no_isolate, gpus=ids, workers=workers, ray=ray_address,
                        compile_workers=compile_workers or (os.cpu_count() or 1), timeout_s=timeout_s)
        return runner, Halving(budget_s=budget_s, exhaustive=exhaustive)
    except ValueError as e:
        raise BadInput(str(e)) from None


def _report_json(report, uses):
    return {
        "arch": report.arch, "device": report.device, "notes": report.notes,
        "problems": [{"key": u.problem.key, "layers": list(u.layers), "per_forward": u.per_forward,
                      "families": [{"family": fp.family, "kept": fp.kept, "rejected": fp.rejected,
                                    "unknown": fp.unknown, "reasons": {fp.examples[r]: n for r, n in fp.reasons.items()}}
                                   for fp in report.plans.get(u.problem.key, [])]} for u in uses],
        "measured": report.measured, "dropped": report.dropped, "failed": report.failed, "resumed": report.resumed,
        "compiled": report.compiled, "compile_failures": report.compile_failures, "shards": report.shards,
        "stages": {k: {"count": n, "seconds": sec} for k, (n, sec) in report.stages.data.items()},
        "model_errors": report.model_errors,
        "winners": [{"problem": w.problem_key, "bucket": w.bucket, "tactic": json.loads(w.params_json),
                     "tactic_id": w.tactic_id, "median_us": w.median_us, "speedup_over_default": w.speedup}
                    for w in report.winners],
    }


@main.command()
def models():
    """List the model presets."""
    from autotune.models import list_models
    for m in list_models():
        click.echo(m)


@main.command()
def archs():
    """List the arch profiles (numbers from reference/hardware.md)."""
    from autotune.core.arch import ARCHS, detect
    live = detect().name
    click.echo(f"{'arch':6} {'cc':5} {'smem/block':>10} {'smem/SM':>8} {'threads/SM':>10} {'blocks/SM':>9}  fp4")
    for a in ARCHS.values():
        mark = "  (live)" if a.name == live else ""
        click.echo(f"{a.name:6} {a.cc[0]}.{a.cc[1]:<3} {a.smem_per_block_optin:>10} {a.smem_per_sm:>8} "
                   f"{a.max_threads_per_sm:>10} {a.max_blocks_per_sm:>9}  {a.fp4}{mark}")


@main.command()
@click.option("--model", default=None, help="only this model's problems")
@click.option("--tp", default=1, show_default=True)
@click.option("--ep", default=1, show_default=True)
@click.option("--cache", default=None, help="cache path or SQLAlchemy URL")
@click.option("--misses", is_flag=True, help="list recorded dispatch misses instead of winners")
@click.option("--json", "as_json", is_flag=True)
def show(model, tp, ep, cache, misses, as_json):
    """Show the winners stored in the cache."""
    import os
    if misses and cache is None and os.environ.get("AUTOTUNE_MISSES"):
        cache = os.environ["AUTOTUNE_MISSES"]      # where a read-only deployment keeps its misses
    store = _open_store(cache, readonly=True)
    keys = {u.problem.key for u in _problems(model, tp, ep, True)} if model else None
    if misses:
        rows = [m for m in store.misses() if keys is None or m.problem_key in keys]
        rows.sort(key=lambda m: (-m.count, m.problem_key, m.m))
        if as_json:
            click.echo(json.dumps([m.__dict__ for m in rows], indent=2))
        elif not rows:
            click.echo(f"no misses in {store.url}")
        for m in ([] if as_json else rows):
            gpu = (store.device(m.device_key) or {}).get("gpu_name", m.device_key)
            click.echo(f"{m.problem_key}  m={m.m}  {m.count}×  {gpu}")
        return
    rows = [w for w in store.winners() if keys is None or w.problem_key in keys]
    rows.sort(key=lambda w: (w.problem_key, w.device_key, w.bucket))
    if as_json:  # one object per winner; the report's figures (roofline, baselines) under "report"
        extra = _report_points(_summary(store, keys))
        click.echo(json.dumps([{**w.__dict__, "gpu": (store.device(w.device_key) or {}).get("gpu_name"),
                                "report": extra.get((w.device_key, w.problem_key, w.bucket))} for w in rows], indent=2))
        return
    if not rows:
        click.echo(f"no winners in {store.url}")
        return
    from autotune.report import print_summary
    print_summary(_summary(store, keys))


def _summary(store, keys):
    from autotune.report import collect
    from cache import CacheError
    try:
        return collect(store, keys)
    except CacheError as e:
        raise BadInput(str(e)) from None


def _report_points(summary):
    from dataclasses import asdict
    return {(d.device_key, v.key, p.bucket): {"arch": d.arch, **asdict(p)}
            for d in summary.devices for v in d.problems for p in v.points}


@main.command()
@click.option("-o", "--output", required=True, help="directory to write index.html, its PNGs and summary.json into")
@click.option("--model", default=None, help="only this model's problems")
@click.option("--tp", default=1, show_default=True)
@click.option("--ep", default=1, show_default=True)
@click.option("--cache", default=None, help="cache path or SQLAlchemy URL")
@click.option("--measure-ceilings", is_flag=True,
              help="first measure this machine's copy bandwidth and bf16 matmul rate and store them in the cache")
@click.option("--plan-arch", default=None, help="also show static verdicts for these archs, e.g. sm100,sm120 (nothing measured)")
@click.option("--families", default="triton,torch", show_default=True, help="families whose verdicts --plan-arch shows")
def report(output, model, tp, ep, cache, measure_ceilings, plan_arch, families):
    """Write a self-contained HTML report (PNG plots) of what the search stored."""
    from pathlib import Path
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise BadInput(f"output {out} exists and is not a directory")
    keys = {u.problem.key for u in _problems(model, tp, ep, True)} if model else None
    archs = [_arch(a) for a in plan_arch.split(",") if a.strip()] if plan_arch else []
    fams = _families(families) if archs else []
    if measure_ceilings:
        from autotune.report import measure_ceilings as measure
        store = _open_store(cache)
        dk, c = measure(store)
        click.echo(f"ceilings of device {dk}: {c.bandwidth_gbs:,.1f} GB/s, bf16 {c.tflops['bf16']:,.2f} TFLOP/s (stored)")
        if store.device(dk) is None:
            click.echo(f"note: this machine (device {dk}) has no results in the cache; its ceilings are unused", err=True)
        store.close()
    store = _open_store(cache, readonly=True)
    summary = _summary(store, keys)
    if archs:
        from autotune.core.problem import Problem
        from autotune.report.model import static_plans
        pkeys = sorted(keys) if keys else [p.key for p in store.problems()]
        summary.plans = static_plans([Problem.from_key(k) for k in pkeys], fams, archs)
    from autotune.report import write_html
    try:
        index = write_html(summary, out)
    except ModuleNotFoundError as e:
        raise BadInput(f"the report needs {e.name}: pip install 'fp4-autotune[report]'") from None
    except OSError as e:
        raise BadInput(f"cannot write the report to {out}: {e.strerror or e}") from None
    n = sum(len(v.points) for d in summary.devices for v in d.problems)
    click.echo(f"report of {n} winners on {len(summary.devices)} device(s): {index}")


@main.group("cache")
def cache_group():
    """Export and import caches (for deployment images)."""


@cache_group.command("export")
@click.option("-o", "--output", required=True, help="file to write (must not exist)")
@click.option("--gpu", default=None, help="only winners for this GPU name")
@click.option("--model", default=None, help="only this model's problems")
@click.option("--tp", default=1, show_default=True)
@click.option("--ep", default=1, show_default=True)
@click.option("--format", "fmt", type=click.Choice(["sqlite", "json"]), default="sqlite", show_default=True)
@click.option("--cache", default=None)
def cache_export(output, gpu, model, tp, ep, fmt, cache):
    """Write a self-contained file with the winners."""
    from cache import CacheError, export_cache
    keys = [u.problem.key for u in _problems(model, tp, ep, True)] if model else None
    store = _open_store(cache, readonly=True)
    try:
        n = export_cache(store, output, gpu=gpu, problem_keys=keys, fmt=fmt)
    except CacheError as e:
        raise BadInput(str(e)) from None
    click.echo(f"exported {n} winners to {output}")


@cache_group.command("import")
@click.argument("path")
@click.option("--cache", default=None)
def cache_import(path, cache):
    """Merge an exported file into the cache, validating every entry."""
    from cache import CacheError, import_cache
    from tactics import registry
    store = _open_store(cache)
    try:
        rep = import_cache(store, path, validate=registry.validate)
    except CacheError as e:
        raise BadInput(str(e)) from None
    click.echo(f"imported {rep.imported} winners" + "".join(f"; skipped {n}: {r}" for r, n in rep.skipped.items()))


@cache_group.command("merge")
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="file to write (must not exist)")
@click.option("--format", "fmt", type=click.Choice(["sqlite", "json"]), default="sqlite", show_default=True)
def cache_merge(paths, output, fmt):
    """Combine exports into one, validating every entry (a later file wins on conflicts)."""
    from cache import CacheError
    from autotune.integrations.portable import merge_exports
    from tactics import registry
    try:
        rep = merge_exports(paths, output, fmt=fmt, validate=registry.validate)
    except CacheError as e:
        raise BadInput(str(e)) from None
    for p, r in rep.per_file.items():
        click.echo(f"{p}: {r.imported} winners" + "".join(f"; skipped {n}: {w}" for w, n in r.skipped.items()))
    click.echo(f"wrote {rep.written} winners to {output} ({rep.replaced} replaced by a later file)")


@cache_group.command("prune")
@click.option("--keep-gpu", multiple=True, help="keep only these GPUs (name or device key; repeatable)")
@click.option("--drop-gpu", multiple=True, help="drop these GPUs (name or device key; repeatable)")
@click.option("--stale-libs", is_flag=True, help="on this machine's GPU, drop rows measured under other library versions")
@click.option("--misses", "drop_misses", is_flag=True, help="also clear recorded misses")
@click.option("--dry-run", is_flag=True, help="count what would go; delete nothing")
@click.option("--cache", default=None)
def cache_prune(keep_gpu, drop_gpu, stale_libs, drop_misses, dry_run, cache):
    """Drop trials, winners and misses of environments no longer wanted."""
    from autotune.core.env import current
    from cache import CacheError
    from autotune.integrations.portable import _select_devices, prune
    if not (keep_gpu or drop_gpu or stale_libs or drop_misses):
        raise BadInput("nothing to prune: give --keep-gpu, --drop-gpu, --stale-libs or --misses")
    store = _open_store(cache, readonly=dry_run)
    try:
        devs = store.devices()
        keep = set().union(*(_select_devices(devs, g) for g in keep_gpu)) if keep_gpu else None
        drop = set().union(*(_select_devices(devs, g) for g in drop_gpu)) if drop_gpu else set()
        rep = prune(store, keep_devices=keep, drop_devices=drop, stale_libs=current() if stale_libs else None,
                    drop_misses=drop_misses, dry_run=dry_run)
    except CacheError as e:
        raise BadInput(str(e)) from None
    verb = "would drop" if dry_run else "dropped"
    click.echo(f"{verb} {rep.trials} trials, {rep.winners} winners, {rep.misses} misses, {rep.devices} devices")


if __name__ == "__main__":
    main()
