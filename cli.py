"""autotune: the command line. Parses, calls the library, prints; no logic of its own."""
from __future__ import annotations

import json
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
    from autotune.buckets import Buckets, hybrid
    try:
        b = Buckets.parse(buckets) if buckets else Buckets(hybrid(max_tokens))
        if buckets and max_tokens:
            b = Buckets(tuple(v for v in b.values if v <= max_tokens) or (min(b.values),))
        return b
    except ValueError as e:
        raise BadInput(str(e)) from None


def _arch(name):
    from tactics.arch import detect, get_arch
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
@click.option("--model", required=True, help="preset name (see `autotune models`) or a path to an HF config.json")
@click.option("--tp", default=1, show_default=True, help="tensor-parallel size")
@click.option("--ep", default=1, show_default=True, help="expert-parallel size")
@click.option("--arch", default=None, help="target arch (sm120, …); default: the live device")
@click.option("--buckets", default=None, help="M buckets: '1,2,4,…', 'hybrid:8192', 'vllm:512' or 'sglang:256'")
@click.option("--max-tokens", default=8192, show_default=True, help="largest M (hybrid buckets up to it)")
@click.option("--families", default="triton,torch", show_default=True, help="tactic families, comma-separated")
@click.option("--cache", default=None, help="cache path or SQLAlchemy URL (default: $AUTOTUNE_CACHE or the user cache dir)")
@click.option("--include-attention", is_flag=True, help="also tune the layers the checkpoint keeps in BF16")
@click.option("--margin", default=0.03, show_default=True, help="a winner must beat the default by this fraction")
@click.option("--budget-ms", default=250, show_default=True, help="timing budget per tactic and bucket (ms)")
@click.option("--max-tactics", default=None, type=int, help="time at most this many kept tactics per family and problem (evenly spaced; the default is always timed)")
@click.option("--retry-failed", is_flag=True, help="measure again tactics whose trials failed")
@click.option("--dry-run", is_flag=True, help="print the tactic space and verdicts; measure nothing")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def search(model, tp, ep, arch, buckets, max_tokens, families, cache, include_attention, margin, budget_ms,
           max_tactics, retry_failed, dry_run, as_json):
    """Tune every FP4 GEMM of a model and store the winners."""
    from autotune import bench
    from autotune.search import search as run_search
    from tactics.arch import detect

    uses = _problems(model, tp, ep, include_attention)
    b = _buckets(buckets, max_tokens)
    target = _arch(arch)
    fams = _families(families)
    if not 0 <= margin < 1:
        raise BadInput(f"--margin must be in [0, 1), got {margin}")
    if max_tactics is not None and max_tactics < 1:
        raise BadInput(f"--max-tactics must be >= 1, got {max_tactics}")
    measuring = not dry_run and target == detect()
    store = _open_store(cache) if measuring else None
    report = run_search([u.problem for u in uses], families=fams, store=store, buckets=b, arch=target,
                        margin=margin, timer=bench.TimerConfig(budget_s=budget_ms / 1000),
                        retry_failed=retry_failed, dry_run=not measuring, max_tactics=max_tactics,
                        progress=not as_json and sys.stderr.isatty())
    if as_json:
        click.echo(json.dumps(_report_json(report, uses), indent=2))
        return
    for n in report.notes:
        click.echo(n)
    for u in uses:
        click.echo(f"{u.problem.key}  ({', '.join(u.layers)}; {u.per_forward}× per forward)")
        for fp in report.plans.get(u.problem.key, []):
            click.echo(f"  {report.arch}: {fp.line()}")
    if measuring:
        click.echo(f"measured {report.measured} trials ({report.failed} failed), {report.resumed} already in the cache; "
                   f"{len(report.winners)} winners in {store.url}")
        for e in report.model_errors:
            click.echo(f"MODEL ERROR {e}")


def _report_json(report, uses):
    return {
        "arch": report.arch, "device": report.device, "notes": report.notes,
        "problems": [{"key": u.problem.key, "layers": list(u.layers), "per_forward": u.per_forward,
                      "families": [{"family": fp.family, "kept": fp.kept, "rejected": fp.rejected,
                                    "unknown": fp.unknown, "reasons": {fp.examples[r]: n for r, n in fp.reasons.items()}}
                                   for fp in report.plans.get(u.problem.key, [])]} for u in uses],
        "measured": report.measured, "failed": report.failed, "resumed": report.resumed,
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
    from tactics.arch import ARCHS, detect
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
    store = _open_store(cache, readonly=True)
    keys = {u.problem.key for u in _problems(model, tp, ep, True)} if model else None
    if misses:
        rows = [m for m in store.misses() if keys is None or m.problem_key in keys]
        if as_json:
            click.echo(json.dumps([m.__dict__ for m in rows], indent=2))
        for m in ([] if as_json else rows):
            click.echo(f"{m.problem_key}  m={m.m}  {m.count}×")
        return
    rows = [w for w in store.winners() if keys is None or w.problem_key in keys]
    rows.sort(key=lambda w: (w.problem_key, w.device_key, w.bucket))
    if as_json:
        click.echo(json.dumps([{**w.__dict__, "gpu": (store.device(w.device_key) or {}).get("gpu_name")} for w in rows], indent=2))
        return
    if not rows:
        click.echo(f"no winners in {store.url}")
        return
    from rich.console import Console
    from rich.table import Table
    t = Table("problem", "gpu", "M", "tactic", "µs", "× default")
    for w in rows:
        gpu = (store.device(w.device_key) or {}).get("gpu_name", w.device_key)
        params = ",".join(f"{k}={v}" for k, v in json.loads(w.params_json)["params"].items())
        t.add_row(w.problem_key, gpu, str(w.bucket), f"{w.family}[{params}]", f"{w.median_us:.1f}",
                  f"{w.speedup:.2f}" if w.speedup else "-")
    Console().print(t)


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


if __name__ == "__main__":
    main()
