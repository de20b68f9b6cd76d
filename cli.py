"""autotune: the command line. Parses, calls the library, prints; no logic of its own."""
from __future__ import annotations

import json
import signal
import sys

import click

from autotune import api, request
from autotune.core.arch import ARCHS, detect
from autotune.engine.claims import ClaimSettingError
from autotune.engine.executor import WorkerStartError
from autotune.engine.progress import Progress
from autotune.models import list_models
from autotune.report import print_summary, text
from autotune.cache import CacheError

EXIT_BAD_INPUT = 2


class BadInput(click.ClickException):
    exit_code = EXIT_BAD_INPUT


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT raises KeyboardInterrupt, so the same cleanup runs (workers
    stopped, claims released) instead of the process vanishing with its claims held for the TTL."""

    signum = signal.SIGTERM


def _terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)     # a second SIGTERM must not cut the cleanup short
    raise Terminated()


def _on_sigterm(handler):
    """Install a SIGTERM handler, returning the previous one (None off the main thread: no signals there)."""
    if handler is None:
        return None
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return None


def _call(fn, *a, **kw):
    """A library call; its one-line refusal (BadInput, a cache error) becomes exit 2."""
    try:
        return fn(*a, **kw)
    except (api.BadInput, CacheError) as e:
        raise BadInput(str(e)) from None


def _keys(model, tp, ep):
    return {u.problem.key for u in _call(api.model_problems, model, tp=tp, ep=ep, include_attention=True,
                                         fused_moe=True, fold_shared=True, fused_mlp=True)} if model else None


def _open_store(url, readonly=False):
    return _call(api.open_store, url, readonly=readonly)


@click.group()
@click.version_option(package_name="fp4-autotune")
def main():
    """Autotune FP4 GEMMs: static verdicts, checked timings, a SQLite tactic cache."""


def _flag(fl):
    """One click option from a declared flag (autotune/request.py, autotune/engine/options.py)."""
    o = fl.opt
    kw = dict(help=o.text(), default=fl.default, show_default=o.show_default)
    if o.switch:
        kw.update(is_flag=True, flag_value=o.flag_value)
    elif o.options():
        kw["type"] = click.Choice(list(o.options()))
    elif o.type is not None:
        kw["type"] = o.type
    return click.option(*o.flag.split(" "), fl.key, **kw)


def _flags(flags):
    """A command's options from declared flags, in their order."""
    def add(f):
        for fl in reversed(flags):
            f = _flag(fl)(f)
        return f
    return add


@main.command()
@_flags([*request.search_flags(), request.JSON])
def search(as_json, **flags):
    """Tune every FP4 GEMM of a model and store the winners."""
    progress = Progress() if not sys.stderr.isatty() else True     # on stderr: --json output stays clean
    prev = _on_sigterm(_terminated)
    try:
        res = _call(api.run, progress=progress, **flags)
    except (WorkerStartError, ClaimSettingError) as e:
        raise click.ClickException(str(e)) from None
    except KeyboardInterrupt as e:      # SIGINT, or SIGTERM through _terminated: the same cleanup ran
        sig = getattr(e, "signum", signal.SIGINT)
        rep, uses = getattr(e, "report", None), getattr(e, "uses", None)
        if rep is not None and as_json:      # what was measured is stored; say what and where the time went
            click.echo(json.dumps({**text.search_json(rep, uses or []), "interrupted": True}, indent=2))
        elif rep is not None and rep.stages.data:
            for line in text.stage_lines(rep.stages.data):
                click.echo(line, err=True)
        click.echo(f"autotune search: stopped by {signal.Signals(sig).name}; its claims are released and the "
                   "trials stored so far are kept (run the same command to resume)", err=True)
        sys.exit(128 + sig)
    finally:
        _on_sigterm(prev)
    if as_json:
        click.echo(json.dumps(text.search_json(res.report, res.uses), indent=2))
        return
    for line in text.search_lines(res.report, res.uses, res.listed, res.cache_url):
        click.echo(line)


@main.command()
def models():
    """List the model presets."""
    for m in list_models():
        click.echo(m)


@main.command()
def archs():
    """List the arch profiles (autotune/core/arch.py: CUDA compute-capability tables, checked against CUTLASS)."""
    live = detect().name
    click.echo(f"{'arch':6} {'cc':5} {'smem/block':>10} {'smem/SM':>8} {'threads/SM':>10} {'blocks/SM':>9}  fp4")
    for a in ARCHS.values():
        mark = "  (live)" if a.name == live else ""
        click.echo(f"{a.name:6} {a.cc[0]}.{a.cc[1]:<3} {a.smem_per_block_optin:>10} {a.smem_per_sm:>8} "
                   f"{a.max_threads_per_sm:>10} {a.max_blocks_per_sm:>9}  {a.fp4}{mark}")


def _model_filter(f):
    """--model (only that model's problems) with its --tp and --ep, in this order."""
    for o in reversed((click.option("--model", default=None, help="only this model's problems"),
                       click.option("--tp", default=1, show_default=True, help="tensor-parallel size (with --model)"),
                       click.option("--ep", default=1, show_default=True, help="expert-parallel size (with --model)"))):
        f = o(f)
    return f


@main.command()
@_model_filter
@click.option("--cache", default=None, help=request.CACHE_HELP)
@click.option("--misses", is_flag=True, help="list recorded dispatch misses instead of winners")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output: one object per winner (or miss)")
@click.option("-v", "--verbose", is_flag=True,
              help="the full text of each failure / rejection reason (the table cuts long ones to one line); "
                   "with --json: an object {winners, verdicts} with every reason group in full")
@click.option("--stale", is_flag=True, help="list the winners measured with other kernel code than this install's (not served)")
@click.option("--explain", is_flag=True,
              help="with --model: per problem and tuned M, the dispatch rung that answers here (pinned, exact, "
                   "predicted, nearest, default) and why")
def show(model, tp, ep, cache, misses, as_json, verbose=False, stale=False, explain=False):
    """Show the winners stored in the cache."""
    if explain:
        if not model:
            raise BadInput("--explain needs --model")
        rows = _call(api.explain, cache, model=model, tp=tp, ep=ep)
        if as_json:
            click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
            return
        for line in text.explain_lines(rows):
            click.echo(line)
        return
    shown = _call(api.show, cache, model=model, tp=tp, ep=ep, misses=misses, stale=stale and not misses)
    if stale and not misses:
        if as_json:
            click.echo(json.dumps([{**w.__dict__, "stale": why} for w, why in shown.stale], indent=2))
            return
        for line in text.stale_lines(shown.stale, shown.stale_trials, len(shown.winners), shown.gpu_names, shown.url):
            click.echo(line)
        return
    if as_json or misses or not shown.winners:       # the text summary prints its own notes
        for n in shown.notes:
            click.echo(n, err=as_json)
    if misses:
        if as_json:
            click.echo(json.dumps([m.__dict__ for m in shown.misses], indent=2))
        else:
            for line in text.miss_lines(shown.misses, shown.gpu_names, shown.url):
                click.echo(line)
    elif as_json:
        rows = text.winners_json(shown.winners, shown.gpu_names, shown.summary)
        if verbose:
            rows = {"winners": rows, "verdicts": text.verdicts_json(shown.summary) if shown.summary else []}
        click.echo(json.dumps(rows, indent=2))
    elif not shown.winners:
        click.echo(f"no winners in {shown.url}")
    else:
        print_summary(shown.summary, verbose=verbose)


@main.command()
@click.option("--model", required=True, help="a preset name or a checkpoint's config.json / directory")
@click.option("--tp", default=1, show_default=True, help="tensor-parallel size")
@click.option("--ep", default=1, show_default=True, help="expert-parallel size")
@click.option("--cache", default=None, help=request.CACHE_HELP)
@click.option("--one-copy", is_flag=True, help="bind as an engine serving one copy of each weight does")
@click.option("--one-copy-upto", type=int, default=None,
              help="one copy, its layout chosen by the rungs up to this M (implies --one-copy)")
@click.option("--m", "ms", default=None, help="comma-separated M to check [default: every rung's bucket]")
def verify(model, tp, ep, cache, one_copy, one_copy_upto, ms):
    """Serve every layer of a model from a cache as an engine would, eagerly and under graph replay
    with inputs refreshed in place, and compare each output row with float64; exit 1 on a failure."""
    try:
        mlist = [int(v) for v in ms.split(",")] if ms else None
    except ValueError:
        raise BadInput(f"--m: comma-separated integers, not {ms!r}") from None
    got = _call(api.verify, model, cache, tp=tp, ep=ep, one_copy=one_copy, one_copy_upto=one_copy_upto, ms=mlist)
    for v in got:
        click.echo(v.line())
    bad = sum(not v.ok for v in got)
    click.echo(f"{len(got) - bad} of {len(got)} problems pass" + (f"; {bad} FAIL" if bad else ""))
    if bad:
        sys.exit(1)


@main.command()
@click.option("-o", "--output", required=True, help="directory to write index.html, its PNGs and summary.json into")
@_model_filter
@click.option("--cache", multiple=True,
              help=request.CACHE_HELP + "; repeat it to read several caches as one, a later one winning on the "
                   "same row")
@click.option("--measure-ceilings", is_flag=True,
              help="first measure this machine's copy bandwidth and bf16 matmul rate and store them in the cache")
@click.option("--plan-arch", default=None, help="also show static verdicts for these archs, e.g. sm100,sm120 (nothing measured)")
@click.option("--families", default="triton,torch", show_default=True, help="families whose verdicts --plan-arch shows")
@click.option("--step-json", default=None,
              help="the MLP-step benchmark's JSON (bench/moe_mlp_step_h200.py): its measured step beside the "
                   "estimate (needs --model)")
def report(output, model, tp, ep, cache, measure_ceilings, plan_arch, families, step_json=None):
    """Write a self-contained HTML report (PNG plots) of what the search stored."""
    if measure_ceilings and len(cache) > 1:
        raise BadInput("--measure-ceilings stores into one cache: give one --cache")
    if measure_ceilings:
        dk, c, known = _call(api.measure_ceilings, cache[0] if cache else None)
        click.echo(f"ceilings of device {dk}: {c.bandwidth_gbs:,.1f} GB/s, bf16 {c.tflops['bf16']:,.2f} TFLOP/s (stored)")
        if not known:
            click.echo(f"note: this machine (device {dk}) has no results in the cache; its ceilings are unused", err=True)
    index, n, devices = _call(api.write_report, output, cache=list(cache) if len(cache) > 1 else (cache[0] if cache else None),
                              model=model, tp=tp, ep=ep, plan_arch=plan_arch, families=families, step_json=step_json)
    click.echo(f"report of {n} winners on {devices} device(s): {index}")


@main.group("cache")
def cache_group():
    """Export and import caches (for deployment images)."""


# ---- begin: cache export (formats and their options: autotune.integrations.exporters) ------------
def _exporter_options(f):
    from autotune.integrations import exporters
    for _, o in reversed(exporters.all_options()):
        f = click.option(o.flag, o.dest, is_flag=o.is_flag, multiple=o.multiple, metavar=o.metavar, help=o.help,
                         default=o.default())(f)
    return f


def _format_option(f):
    from autotune.integrations import exporters
    helps = ", ".join(f"{n}: {exporters.get(n).help}" for n in exporters.names())
    return click.option("--format", "fmt", type=click.Choice(exporters.names()), default=exporters.names()[0],
                        show_default=True, help=f"file format ({helps})")(f)


@cache_group.command("export")
@click.option("-o", "--output", required=True, help="file to write (must not exist)")
@click.option("--gpu", default=None, help="only winners for this GPU name")
@_model_filter
@_format_option
@click.option("--cache", default=None, help=request.CACHE_HELP)
@_exporter_options
@click.option("--sign-key", default=None, help="sign with this key file (Ed25519 PEM private key, or an HMAC secret) [default: $AUTOTUNE_SIGNING_KEY_FILE, $AUTOTUNE_SIGNING_KEY, else unsigned]")
@click.option("--include-predicted", is_flag=True,
              help="also export predicted winners (--strategy predict: checked, never timed)")
def cache_export(output, gpu, model, tp, ep, fmt, cache, sign_key, include_predicted=False, **options):
    """Write a self-contained file with the winners (flashinfer: FlashInfer's autotuner cache + blocklist)."""
    from autotune.integrations import exporters
    req = exporters.Request(lambda: _open_store(cache, readonly=True), output, gpu,
                            sorted(_keys(model, tp, ep)) if model else None, sign_key, include_predicted)
    try:
        lines = exporters.export(fmt, req, options)
    except exporters.ExportRefused as e:
        raise BadInput(str(e)) from None
    for line in lines:
        click.echo(line)
# ---- end: cache export ----------------------------------------------------------------------------


@cache_group.command("import")
@click.argument("path")
@click.option("--cache", default=None, help=request.CACHE_HELP)
@click.option("--verify-key", default=None, help="refuse the file unless signed with this key (Ed25519 PEM public or private key, or an HMAC secret) [default: $AUTOTUNE_SIGNING_KEY_FILE, $AUTOTUNE_SIGNING_KEY, else not checked]")
def cache_import(path, cache, verify_key):
    """Merge an exported file into the cache, validating every entry."""
    from autotune.integrations.portable import import_cache
    from autotune.cache.signing import load_key
    from autotune.tactics import registry
    try:   # the target is opened once the file passed its checks: a refused import creates nothing
        rep = import_cache(lambda: _open_store(cache), path, validate=registry.validate, key=load_key(verify_key))
    except CacheError as e:
        raise BadInput(str(e)) from None
    click.echo(rep.line())
    if rep.warning():
        click.echo(rep.warning(), err=True)


@cache_group.command("merge")
@click.argument("paths", nargs=-1, required=True)
@click.option("-o", "--output", required=True, help="file to write (must not exist)")
@click.option("--format", "fmt", type=click.Choice(["sqlite", "json"]), default="sqlite", show_default=True,
              help="file format: a SQLite file or JSON (a checksum inside)")
@click.option("--verify-key", default=None, help="refuse inputs not signed with this key [default: as for import]")
@click.option("--sign-key", default=None, help="sign the output with this key [default: as for export]")
def cache_merge(paths, output, fmt, verify_key, sign_key):
    """Combine exports into one, validating every entry (a later file wins on conflicts)."""
    from autotune.integrations.portable import merge_exports
    from autotune.cache.signing import load_key
    from autotune.tactics import registry     # the families load torch: only when a file is validated
    try:
        rep = merge_exports(paths, output, fmt=fmt, validate=registry.validate, verify_key=load_key(verify_key),
                            sign_key=load_key(sign_key))
    except CacheError as e:
        raise BadInput(str(e)) from None
    for p, r in rep.per_file.items():
        click.echo(f"{p}: {r.line()}")
        if r.warning():
            click.echo(f"{p}: {r.warning()}", err=True)
    click.echo(f"wrote {rep.written} winners to {output} ({rep.replaced} replaced by a later file) [{rep.signature}]")


@cache_group.command("rank-fit")
@click.option("--cache", default=None, help=request.CACHE_HELP)
@click.option("-o", "--output", default=None, help="model file [default: <cache>.rank-<arch>.json, one per device]")
@click.option("--device", default=None, help="only this device (device key or GPU name)")
@click.option("--rounds", default=None, type=int, help="boosting rounds [default: 300]")
def cache_rank_fit(cache, output, device, rounds):
    """Fit the ranking model of --strategy ranked on the cache's trials (needs LightGBM)."""
    try:
        fitted = _call(api.fit_rank, cache, output=output, device=device, rounds=rounds)
    except ImportError as e:
        raise click.ClickException(str(e)) from None
    for path, m in fitted:
        click.echo(f"wrote {path}: {m.key['arch']} {m.key.get('gpu')}, {m.info['rows']} rows from "
                   f"{m.info['groups']} (problem, bucket) groups, libs {m.key.get('libs')}")


@cache_group.command("prune")
@click.option("--keep-gpu", multiple=True, help="keep only these GPUs (name or device key; repeatable)")
@click.option("--drop-gpu", multiple=True, help="drop these GPUs (name or device key; repeatable)")
@click.option("--stale-libs", is_flag=True, help="on this machine's GPU, drop rows measured under other library versions")
@click.option("--stale-code", is_flag=True, help="drop rows measured with other kernel code than this install's (every GPU)")
@click.option("--misses", "drop_misses", is_flag=True, help="also clear recorded misses")
@click.option("--dry-run", is_flag=True, help="count what would go; delete nothing")
@click.option("--cache", default=None, help=request.CACHE_HELP)
def cache_prune(keep_gpu, drop_gpu, stale_libs, drop_misses, dry_run, cache, stale_code=False):
    """Drop trials, winners and misses of environments no longer wanted."""
    rep = _call(api.prune, cache, keep_gpu=keep_gpu, drop_gpu=drop_gpu, stale_libs=stale_libs, misses=drop_misses,
                dry_run=dry_run, stale_code=stale_code)
    verb = "would drop" if dry_run else "dropped"
    click.echo(f"{verb} {rep.trials} trials, {rep.winners} winners, {rep.misses} misses, {rep.devices} devices")


if __name__ == "__main__":
    main()
