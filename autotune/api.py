"""The convenience entry point behind `autotune.search(...)` (the CLI calls the same thing)."""
from __future__ import annotations

from typing import Sequence

from autotune.core.buckets import Buckets, hybrid
from autotune.core.problem import Problem


def search(model_or_problems: str | Sequence[Problem], *, tp: int = 1, ep: int = 1,
           families: str | Sequence = "triton,torch", buckets: Buckets | Sequence[int] | None = None,
           max_tokens: int = 8192, cache=None, arch: str | None = None, include_attention: bool = False,
           dry_run: bool = False, **options):
    """Tune a model preset / config.json path, or an explicit list of Problems.

    Returns the SearchReport; winners land in `cache` (default: $AUTOTUNE_CACHE or the user
    cache directory). `options` go to `autotune.engine.search.search` (margin, timer, retry_failed…).
    """
    from autotune.engine.search import search as run
    from cache import Store
    from tactics import registry
    from autotune.core.arch import detect, get_arch

    if isinstance(model_or_problems, str):
        from autotune.models import problems_for
        problems = [u.problem for u in problems_for(model_or_problems, tp=tp, ep=ep,
                                                     include_attention=include_attention)]
    else:
        problems = list(model_or_problems)
    fams = registry.parse(families) if isinstance(families, str) else list(families)
    b = buckets if isinstance(buckets, Buckets) else Buckets(tuple(buckets) if buckets else hybrid(max_tokens))
    target = get_arch(arch) if arch else detect()
    measuring = not dry_run and target == detect()
    store = None
    if measuring:
        Store.check_writable(cache)
        store = cache if hasattr(cache, "put_trial") else Store(cache)
    return run(problems, families=fams, store=store, buckets=b, arch=target, dry_run=not measuring, **options)
