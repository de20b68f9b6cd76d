"""`autotune show --explain`: per problem and tuned M, the dispatch rung that answers on this machine
(autotune.runtime.table: pinned, exact, predicted, nearest, default) and why; a stored winner that
dispatch does not serve (other libraries, other code, another arch, a build failure) is named with
its reason (autotune.runtime.loader.vet)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True)
class Rung:
    """What dispatch on this machine answers for one problem at one tuned M, and why."""

    problem: str
    layers: tuple[str, ...]
    m: int
    rung: str            # pinned | exact | predicted | nearest | default (autotune.runtime.table.RUNGS)
    tactic: str
    why: str


def rungs(store, uses, env, default_buckets) -> list[Rung]:
    """Per use's problem and per tuned M (the buckets `store` holds winners for among these problems on
    this device, else `default_buckets`), the rung a Dispatcher over `store` answers on and why."""
    from autotune.runtime import loader
    from autotune.runtime.dispatch import Dispatcher
    d = Dispatcher(store, env=env, record_misses=False, warn=False)
    keys = {u.problem.key for u in uses}
    stored = {(w.problem_key, w.bucket): w for w in store.winners(env.device_key) if w.problem_key in keys}
    ms = sorted({b for _, b in stored}) or list(default_buckets)
    out = []
    for u in uses:
        p = u.problem
        for m in ms:
            rung, t = d.rung_for(p, m)
            w, served = stored.get((p.key, m)), d.table(p)
            skip = ""
            if w is not None and m not in served.buckets:
                why, _, _ = loader.vet(w, env, d.arch, d._kernel)
                skip = f"; its stored winner is not served here ({why or 'unusable'})"
            if rung == "pinned":
                why = "pinned (Dispatcher.pin or $AUTOTUNE_PIN)"
            elif rung == "exact":
                why = (f"measured winner at M = {m}: {w.median_us:.3g} us"
                       + (f", {w.speedup:.2f}x the default" if w.speedup else ""))
            elif rung == "predicted":
                why = "predicted winner: the rank model's first choice, checked against float64, not timed"
            elif rung == "nearest":
                j = min(served._near[bisect.bisect_left(served.buckets, m)], len(served.buckets) - 1)
                why = f"no measured winner at M = {m}{skip}: bucket {served.buckets[j]}'s measured winner"
            else:
                why = f"no measured winner at or above M = {m}{skip}: the family default"
            out.append(Rung(p.key, tuple(u.layers), m, rung, str(t), why))
    return out
