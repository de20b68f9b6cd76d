"""Loading a cache for serving: open it read-only, verify it (a configured signing key must vouch
for it), and vet every stored winner of this device into the rows dispatch may use.

Vetting is the one row check dispatch shares with import and `show` (autotune.cache.rows, the
structural half) and with pins (autotune.tactics.registry.usable, the family half), plus what only
serving asks: library versions equal to the live ones and a kernel that builds. A row that fails
is counted by the head of its reason (before ':') and left out, so its problem falls through to
the next rung; a damaged cache never takes the serving process down.
"""
from __future__ import annotations

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from autotune.core.arch import Arch
from autotune.core.env import Env
from autotune.core.layer import parse_key
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.cache import CacheError, Store, check_winner, verify_for_serving
from autotune.tactics import registry

log = logging.getLogger("autotune.runtime.dispatch")

#: (problem, tactic) -> the built kernel; raises when it cannot be built
Build = Callable[[Problem, Tactic], Any]


#: the skipped reason of a winner whose code key is not this code's (autotune.tactics.registry.stale_code)
CODE_DIFFERS = "code differs"


@dataclass
class Loaded:
    """What a cache gives dispatch: per problem its (bucket, tactic) rows sorted by bucket."""

    winners: dict[Problem, list[tuple[int, Tactic]]] = field(default_factory=dict)
    predicted: dict[Problem, set[int]] = field(default_factory=dict)   # buckets whose winner is predicted
    skipped: Counter = field(default_factory=Counter)      # why stored winners were not used
    url: str | None = None
    writable: bool = False                                  # misses may go back into it
    error: str | None = None                                # the cache was not used at all: why


def open_store(cache: Any, immutable: bool) -> tuple[Any, bool]:
    """(store, owned): a Store given is used as it is; a path or URL is opened read-only."""
    if hasattr(cache, "winners"):
        return cache, False
    return Store(cache, readonly=True, immutable=immutable or None), True


def vet(w: Any, env: Env, arch: Arch, build: Build) -> tuple[str | None, Problem | None, Tactic | None]:
    """(why the stored winner cannot be served here, None, None) or (None, its problem, its tactic)."""
    why = check_winner(w)
    if why:
        return why, None, None
    t, p = Tactic.from_json(w.params_json), parse_key(w.problem_key)
    try:
        fam = registry.get(t.family)
    except (ValueError, ImportError):
        return "unknown family", None, None
    if w.lib_key != env.lib_key(fam.depends_on):
        return f"{t.family} library version differs", None, None
    if registry.stale_code(w) is not None:        # computed once per member per process
        return f"{t.family} {CODE_DIFFERS}", None, None
    why = registry.usable(p, t, arch, env.device)
    if why:
        log.debug("winner %s bucket %s: %s", w.problem_key, w.bucket, why)
        return why.split(":", 1)[0], None, None
    try:
        build(p, t)
    except Exception as e:  # noqa: BLE001 - a kernel that cannot be built is a skip, not a crash
        return f"{t.family} build failed: {type(e).__name__}", None, None
    return None, p, t


def load(cache: Any, env: Env, arch: Arch, build: Build, *, immutable: bool) -> Loaded:
    """Open, verify and vet: never raises (`Loaded.error` says why nothing was used)."""
    out = Loaded()
    try:
        store, owned = open_store(cache, immutable)
        try:
            ok, why = verify_for_serving(store)
            if not ok:
                raise CacheError(why)
            rows = store.winners(env.device_key)
            out.url, out.writable = store.url, _writable(store)
        finally:
            if owned:
                store.close()
    except Exception as e:  # noqa: BLE001 - a broken cache must never take the serving process down
        out.error = str(e).splitlines()[0] if str(e) else type(e).__name__
        return out
    for w in rows:
        why, p, t = vet(w, env, arch, build)
        if why:
            out.skipped[why] += 1
            log.debug("winner %s bucket %s skipped: %s", w.problem_key, w.bucket, why)
        else:
            out.winners.setdefault(p, []).append((w.bucket, t))
            if getattr(w, "predicted", False):
                out.predicted.setdefault(p, set()).add(w.bucket)
    for items in out.winners.values():
        items.sort(key=lambda r: r[0])
    return out


#: trial statuses with a checked result and a time: "dropped" is a successive-halving loser,
#: checked against float64 and timed in its rounds (fewer repetitions than a survivor)
MEASURED = ("ok", "dropped")


def vet_trial(r: Any, env: Env, arch: Arch, build: Build) -> Tactic | None:
    """The stored trial's tactic if it can be served here (checked and timed, the live libraries and
    code, usable on this arch, builds), else None."""
    if r.status not in MEASURED or not r.median_us:
        return None
    try:
        t, p = Tactic.from_json(r.params_json), parse_key(r.problem_key)
        fam = registry.get(t.family)
    except (ValueError, TypeError, ImportError):
        return None
    if r.lib_key != env.lib_key(fam.depends_on) or registry.stale_code(r) is not None \
            or registry.usable(p, t, arch, env.device):
        return None
    try:
        build(p, t)
    except Exception:  # noqa: BLE001 - a kernel that cannot be built is not a substitute
        return None
    return t


def bests_by_layout(cache: Any, env: Env, arch: Arch, build: Build, problem: Problem, bucket: int, *,
                    immutable: bool) -> dict[str, Tactic]:
    """{layout: the fastest servable trial of that layout} at (problem, bucket) on this device: what a
    one-copy binding runs on a rung whose winner reads another layout (autotune.runtime.onecopy).
    Survivors and halving losers both count (`MEASURED`): a layout that lost the rung often has only
    losers there (GLM-5's folded w13 on an H100: `moe_mma` dropped in round 1 at every M >= 1024),
    and its fastest loser beats the family's untuned default. Only a whole cache has trials; an
    export (its rows under a checksum, maybe a signature) gives {}, so nothing outside what was
    verified is ever served. Never raises."""
    try:
        store, owned = open_store(cache, immutable)
        try:
            ok, _ = verify_for_serving(store)
            if not ok or store.meta().get("checksum") is not None:
                return {}
            rows = store.get_trials(problem.key, bucket, env.device_key)
        finally:
            if owned:
                store.close()
    except Exception:  # noqa: BLE001 - no substitute is better than a crash at bind
        return {}
    out: dict[str, Tactic] = {}
    for r in sorted((r for r in rows if r.status in MEASURED and r.median_us), key=lambda r: (r.median_us, r.tactic_id)):
        try:
            lay = registry.get(r.family).layout(Tactic.from_json(r.params_json))
        except (ValueError, TypeError, ImportError):
            continue
        if lay not in out and (t := vet_trial(r, env, arch, build)) is not None:
            out[lay] = t
    return out


def _writable(store: Any) -> bool:
    p = getattr(store, "path", None)
    if p is None:
        return False
    return os.access(p, os.W_OK) and os.access(p.parent, os.W_OK | os.X_OK)
