"""moe_align's kernels as sources for the search's precompile (Family.precompile, via
moe_decode's `sources`): apart from moe_align.py so the cuda members, which declare moe_align in
their code key, do not take the compile path into theirs."""
from __future__ import annotations

from typing import Any


def _source(fn: Any, consts: dict) -> Any:
    """fn's ASTSource as Aligner.__call__ launches it on int32 ids: every runtime argument a
    16-byte-aligned int32 pointer (torch allocations) but the kernel's do_not_specialize ints."""
    from .compile import ast_source
    names = [q.name for q in fn.params if not q.is_constexpr]
    # names (Triton 3.9) or argument indices (some 3.x releases)
    ints = {fn.arg_names[a] if isinstance(a, int) else a for a in fn.do_not_specialize}
    types = {n: "i32" if n in ints else "*i32" for n in names}
    return ast_source(fn, names, types, [i for i, n in enumerate(names) if n not in ints], consts)


def align_sources(experts: int, block_m: int, one_pass: bool = True) -> list[tuple[Any, dict]]:
    """(ASTSource, options) of the alignment kernels an Aligner(experts, block_m) launches: the
    two-pass pair above MAX_CHUNK pairs and, with `one_pass`, the one-launch kernel of each chunk
    size below (an aligned-route tactic reaches them at small M). For the search's precompile: E,
    E_PAD and CHUNK are constexprs, so otherwise each (E, BLOCK_M, CHUNK) compiled in the measuring
    worker (tests/test_precompile_keys.py records real launches against these). Imports Triton."""
    import triton

    from . import moe_align as A
    base = {"NUM_EXPERTS": int(experts), "E_PAD": triton.next_power_of_2(int(experts))}
    opts = {"num_warps": A.NUM_WARPS}
    out = [(_source(A._moe_count_kernel, {**base, "CHUNK": A.MAX_CHUNK}), opts)]
    chunks = [(A.MAX_CHUNK, 0)] + ([(c, 1) for c in (16, 32, 64) if c <= A.MAX_CHUNK] if one_pass else [])
    for chunk, one in chunks:
        consts = {**base, "CHUNK": chunk, "BLOCK_M": int(block_m), "ONE_PASS": one, "HIST_ROWS": A.HIST_ROWS,
                  "BLOCK_ROWS": A.BLOCK_ROWS}
        out.append((_source(A._moe_scatter_kernel, consts), opts))
    return out
