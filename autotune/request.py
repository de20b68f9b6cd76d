"""What one search is asked — the problems' source (model, tp, ep, …), the buckets, the families,
the cache — declared once like the engine's `SearchOptions` (autotune/engine/options.py): each
field carries its flag. The CLI's `search` options, `api.run`'s keywords and the options table of
docs/search.md are generated from `SearchInput`'s fields followed by `SearchOptions`'.

    python3 -m autotune.request            # rewrite the table in docs/search.md
    python3 -m autotune.request --check    # exit 1 if the committed table is not the generated one
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from autotune.core.settings import ACTIVATION_CHOICES
from autotune.engine.options import Flag, Opt, SearchOptions, flags_of, knob

CACHE_HELP = "cache path or SQLAlchemy URL (default: $AUTOTUNE_CACHE or the user cache dir)"


@dataclass
class SearchInput:
    """What a search measures (and where it stores it); `SearchOptions` says how."""

    model: Any = knob(None, Opt("--model", "preset name (see `autotune models`) or a path to an HF config.json",
                                doc_default="none: give it or --from-misses"))
    misses: bool = knob(False, Opt(
        "--from-misses", "tune the problems and M values dispatch recorded as misses (from $AUTOTUNE_MISSES or "
        "--cache; --model narrows them)", switch=True))
    tp: int = knob(1, Opt("--tp", "tensor-parallel size", show_default=True))
    ep: int = knob(1, Opt("--ep", "expert-parallel size", show_default=True))
    arch: Any = knob(None, Opt("--arch", "target arch (sm120, …); default: the live device", doc_default="the live device"))
    buckets: Any = knob(None, Opt("--buckets", "M buckets: '1,2,4,…', 'hybrid:8192', 'vllm:512' or 'sglang:256'",
                                  doc_default="hybrid up to --max-tokens"))
    max_tokens: int | None = knob(None, Opt(
        "--max-tokens", "largest M: the hybrid buckets up to it [default: 8192]; with --buckets, values above it are "
        "dropped (and named)", type=int, doc_default="8192"))
    families: Any = knob(None, Opt(
        "--families", "tactic families, comma-separated [default: every family the device and its installed libraries "
        "run]", doc_default="every registered family that imports"))
    cache: Any = knob(None, Opt("--cache", CACHE_HELP, doc_default="$AUTOTUNE_CACHE, else the user cache dir"))
    include_attention: bool = knob(False, Opt(
        "--include-attention", "also tune the layers the checkpoint keeps in BF16", switch=True))
    only: str | None = knob(None, Opt(
        "--only", "only problems whose key or layer names contain one of these comma-separated strings, e.g. "
        "grouped_moe or down_proj", doc_default="every problem"))
    fused_moe: bool = knob(True, Opt(
        "--fused-moe/--no-fused-moe", "the routed experts' fused forms (w13+SwiGLU, w2 with the top_k sum) that FP4MoE "
        "serves, as their own problems", show_default=True))
    fused_mlp: bool = knob(True, Opt(
        "--fused-mlp/--no-fused-mlp", "the dense MLP's and shared expert's gate_up with the SwiGLU epilogue that "
        "FP4MLP serves, as their own problems", show_default=True))
    fold_shared: bool = knob(True, Opt(
        "--fold-shared/--no-fold-shared", "also the routed experts' problems with the shared expert folded in as "
        "one more, always routed expert (E+1, top_k+1: what FP4MoE(shared=...) runs by default)", show_default=True))
    moe_layers: bool = knob(False, Opt(
        "--moe-layers", "also each routed MoE layer as one problem (both GEMMs, kind moe_layer), measured after its w13 "
        "and w2 problems against the pair of their winners; off by default", switch=True))
    activations: str | None = knob(None, Opt(
        "--activations", "a W4A4 checkpoint (static activation scales): auto = the W4A4 problems where the arch has a "
        "W4A4 tactic, else W4A16 with a warning; the loaders (from_pretrained) read the same setting "
        "[default: $AUTOTUNE_ACTIVATIONS, else auto]", choices=ACTIVATION_CHOICES,
        doc_default="$AUTOTUNE_ACTIVATIONS, else auto"))
    list_tactics: str | None = knob(None, Opt(
        "--list-tactics", "also print every tactic of these families (comma-separated) with its verdict and reason"))


#: the CLI's own output switch (not a keyword of api.run)
JSON = Flag(("as_json",), Opt("--json", "machine-readable output", switch=True), False)


def search_flags() -> list[Flag]:
    """Every flag of `autotune search` but --json, in the order --help lists them."""
    return [*flags_of(SearchInput), *flags_of(SearchOptions)]


_INPUT = {f.name for f in fields(SearchInput)}


def split(kw: dict) -> tuple[SearchInput, dict, dict]:
    """`api.run`'s keywords as (SearchInput, SearchOptions fields, flags of SearchOptions' groups by
    key: budget_s=, workers=, …). An unknown keyword raises TypeError, as a signature would."""
    nested = {fl.key for fl in flags_of(SearchOptions) if len(fl.path) > 1}
    top_names = {f.name for f in fields(SearchOptions)}
    inp, top, grp = {}, {}, {}
    for k, v in kw.items():
        if k in _INPUT:
            inp[k] = v
        elif k in nested:
            grp[k] = v
        elif k in top_names:
            top[k] = v
        else:
            raise TypeError(f"run() got an unexpected keyword argument {k!r}")
    return SearchInput(**inp), top, grp


# -- docs/search.md's table ------------------------------------------------------------------

DOC = Path(__file__).resolve().parent.parent / "docs" / "search.md"
BEGIN = "<!-- search options: generated by `python3 -m autotune.request` from autotune/request.py and autotune/engine/options.py -->"
END = "<!-- end of the generated search options -->"


def _shown(fl: Flag) -> str:
    if fl.opt.doc_default:
        return fl.opt.doc_default
    v = fl.default
    if isinstance(v, bool):
        on = v if fl.opt.flag_value else not v
        return "on" if on else "off"
    return "—" if v is None else f"`{v}`"


def options_table() -> str:
    """The markdown table of every `autotune search` flag: flag, default, meaning (its --help)."""
    rows = ["| flag | default | meaning |", "|---|---|---|"]
    for fl in [*search_flags(), JSON]:
        meaning = re.sub(r"\s*\[default: [^\]]*\]", "", fl.opt.text()).replace("|", "\\|")
        rows.append(f"| `{fl.opt.flag}` | {_shown(fl)} | {meaning} |")
    return "\n".join(rows)


def with_table(doc: str) -> str:
    """`doc` (docs/search.md's text) with the generated table between its markers."""
    a, b = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    return doc[:a] + "\n" + options_table() + "\n" + doc[b:]


if __name__ == "__main__":
    text = DOC.read_text()
    new = with_table(text)
    if "--check" in sys.argv[1:]:
        sys.exit(0 if new == text else f"{DOC}: the search options table is not the generated one; "
                                         "run python3 -m autotune.request")
    DOC.write_text(new)
