"""Family registry: names map to module paths, imported lazily, so a missing optional backend
costs nothing until it is asked for and then fails with a message that names it.

It also holds the two questions the engine, the runtime and the integrations ask of families
without naming one: which tactic is the designated default, and may a stored tactic be used here.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from functools import lru_cache
from typing import Mapping

from autotune.core.arch import Arch
from autotune.core.codekey import Code, code_key as _join
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.base import Family

FAMILIES: dict[str, str] = {
    "torch": "autotune.tactics.torch_ref:TorchFamily",
    "triton": "autotune.tactics.triton_fp4.family:TritonFamily",
    "cutlass": "autotune.tactics.cutlass.family:CutlassFamily",
    "cublaslt": "autotune.tactics.cublaslt:CublasLtFamily",
    "cuda": "autotune.tactics.cuda.family:CudaFamily",      # CuPy imported lazily: unavailable without it
    "layer": "autotune.tactics.layer:LayerFamily",          # whole MoE layers (core.layer), and pairs of GEMM tactics
}

#: the family whose tactics run a whole MoE layer as one call, the pair of two GEMM tactics included
LAYER = "layer"

#: the entry-point group a third-party distribution declares its families in, one per name:
#:     [options.entry_points]
#:     fp4_autotune.families =
#:         mykernels = mypkg.family:MyFamily
ENTRY_POINTS = "fp4_autotune.families"


def _installed() -> dict[str, str]:
    """Families declared by installed distributions (read once, at import; a name the project
    already has is refused: the built-ins cannot be replaced by installing a package)."""
    out: dict[str, str] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        if ep.name in FAMILIES or ":" not in ep.value:
            warnings.warn(f"fp4_autotune: family entry point {ep.name} = {ep.value} ignored "
                          f"({'a built-in name' if ep.name in FAMILIES else 'not module:Class'})", stacklevel=2)
            continue
        out.setdefault(ep.name, ep.value)
    return out


FAMILIES.update(_installed())
#: the built-ins and the installed families (every process sees the same); `register` adds others
_BUILTIN = dict(FAMILIES)


def extra() -> dict[str, str]:
    """Families registered at run time (tests, plugins): worker processes register them too."""
    return {k: v for k, v in FAMILIES.items() if _BUILTIN.get(k) != v}


def register(name: str, path: str) -> None:
    """Add a family ("module:Class") under `name`; workers started later load it too."""
    FAMILIES[name] = path
    get.cache_clear()


def unregister(name: str) -> None:
    FAMILIES.pop(name, None)
    get.cache_clear()


def names() -> list[str]:
    return list(FAMILIES)


@lru_cache(maxsize=None)
def get(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown tactic family {name!r}; known: {', '.join(FAMILIES)}")
    mod, _, cls = FAMILIES[name].partition(":")
    try:
        return getattr(importlib.import_module(mod), cls)()
    except ImportError as e:
        raise ImportError(f"tactic family {name!r} cannot be imported: {e}") from e


def pair_tactic(w13: Tactic, w2: Tactic) -> Tactic:
    """One layer tactic running `w13`'s and `w2`'s tactics (any families') in sequence: the pair
    competitor the engine makes from a layer's two stored pair winners without naming a family."""
    return Tactic(LAYER, via="pair", w13=w13.to_json(), w2=w2.to_json())


def parse(names_csv: str) -> list[Family]:
    """'triton,torch' -> family objects, in the order given, duplicates dropped."""
    out: list[Family] = []
    for n in dict.fromkeys(p.strip() for p in names_csv.split(",") if p.strip()):
        out.append(get(n))
    if not out:
        raise ValueError("no tactic family given")
    return out


def validate(family: str, params: dict) -> str | None:
    """Why (family, params) is not a valid tactic, or None."""
    if family not in FAMILIES:
        return f"unknown family {family!r}"
    try:
        return get(family).validate(Tactic(family, params))
    except (TypeError, ValueError) as e:
        return str(e)
    except ImportError:
        return f"{family} family cannot be imported here"


def designated_default(problem: Problem, arch: Arch, device: str) -> Tactic:
    """The baseline a winner must beat and what a miss returns: the default of the best-ranked
    family (`Family.default_rank`) that runs on `device` and does not reject its own default."""
    ranked = []
    for name in FAMILIES:
        try:
            fam = get(name)
        except ImportError:
            continue
        if fam.default_rank is not None:
            ranked.append((fam.default_rank, name, fam))
    for _, _, fam in sorted(ranked, key=lambda r: (r[0], r[1])):
        if problem.kind not in fam.kinds or not fam.available(device)[0] or fam.supports(problem) is not None:
            continue
        t = fam.default(problem, arch)
        if fam.verdict(problem, t, arch).ok is not False:
            return t
    raise ValueError(f"no family can run {problem.key} on {device}")


def usable(problem: Problem, tactic: Tactic, arch: Arch, device: str) -> str | None:
    """Why a stored or pinned tactic cannot run `problem` here (None: it can). The family half of
    the row check that dispatch, import and `show` share (autotune.cache.rows holds the structural half)."""
    why = validate(tactic.family, tactic.params)
    if why:
        return f"invalid {tactic.family} parameters: {why}"
    fam = get(tactic.family)
    ok, why = fam.available(device)
    if not ok:
        return f"{tactic.family} not available on {device}: {why}"
    v = fam.verdict(problem, tactic, arch)
    if v.rejected:
        return f"{tactic.family} verdict rejects it on {arch.name}: {v.reason}"
    return None


def useful(problem: Problem, tactic: Tactic, m: int) -> bool:
    """Whether the search times `tactic` at bucket M (Family.useful; a family without the method: True)."""
    fn = getattr(get(tactic.family), "useful", None)
    return True if fn is None else bool(fn(problem, tactic, m))


def first_batch_member(problem: Problem, family: str) -> bool:
    """Whether `family`'s kernels get a first-batch slot of their own (Family.first_batch_member;
    a family without the method: True)."""
    fn = getattr(get(family), "first_batch_member", None)
    return True if fn is None else bool(fn(problem))


# -- which code measured a stored row (autotune.core.codekey) ---------------------------------

#: what a stale-code row's reason starts with (the Dispatcher counts `skipped` by it)
STALE_CODE = "measured with other code"
#: the command that measures stale rows again (named once in the serving warning)
REFRESH = "`autotune search` (same problems) measures them again; `autotune cache prune --stale-code` drops them"


def _code(family: str, params_json: str) -> Code | None:
    return _code_of(family, FAMILIES.get(family), params_json)


@lru_cache(maxsize=1 << 16)
def _code_of(family: str, path: str | None, params_json: str) -> Code | None:
    # keyed by the registration too: a test or plugin may put another class under a name
    try:
        return get(family).code(Tactic.from_json(params_json))
    except (ValueError, TypeError, KeyError, ImportError):
        return None


def code_of(tactic: Tactic) -> Code:
    """The declared sources of `tactic`'s member. ValueError when its family cannot say."""
    c = _code(tactic.family, tactic.to_json())
    if c is None:
        raise ValueError(f"no code key for {tactic}: unknown family or member here")
    return c


def code_key(tactic: Tactic, lib_key: str) -> str:
    """The code key of `tactic` measured under `lib_key` with the code installed here: what a
    search stores with its trial and winner (computed once per process per member)."""
    return _join(lib_key, code_of(tactic))


def stale_code(row) -> str | None:
    """Why a stored trial or winner (family, params_json, lib_key, code_key) was not measured with
    the code installed here; None when it was. The library half is the row's own lib_key, so this
    needs no environment: `show --stale` judges rows of any device. A row whose family or member
    is unknown here cannot be judged: None (dispatch refuses an unknown family on its own)."""
    c = _code(row.family, row.params_json)
    if c is None:
        return None
    if not row.code_key:
        return f"{STALE_CODE}: no code key (stored before code keys were)"
    if row.code_key != _join(row.lib_key, c):
        return f"{STALE_CODE}: {c.member} (or the search's input draw) changed since"
    return None


def fresh(lib_keys: Mapping[str, str], row) -> bool:
    """A stored row counts for a search with these library keys ({family: lib_key}): same
    libraries and the code installed here."""
    return (lib_keys.get(row.family) == row.lib_key and _code(row.family, row.params_json) is not None
            and stale_code(row) is None)
