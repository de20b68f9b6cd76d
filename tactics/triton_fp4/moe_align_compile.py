"""moe_align's kernels as sources for the search's precompile (Family.precompile, via
moe_decode's `sources`): apart from moe_align.py so the cuda members, which declare moe_align in
their code key, do not take the compile path into theirs."""
from __future__ import annotations

from typing import Any

#: moe_align's kernels as Aligner.__call__ launches them on int32 ids (its HIST_ROWS / BLOCK_ROWS
#: constexprs; tests/test_precompile_keys.py records real launches against these)
_COUNT_ARGS = ("ids_ptr", "hist_ptr", "bad_ptr", "P")
_SCATTER_ARGS = ("ids_ptr", "hist_ptr", "sorted_ptr", "expert_ptr", "npad_ptr", "bad_ptr", "P", "n_chunks",
                 "max_blocks")
_ALIGN_CONSTS = {"HIST_ROWS": 8, "BLOCK_ROWS": 16}


def align_sources(experts: int, block_m: int, one_pass: bool = True) -> list[tuple[Any, dict]]:
    """(ASTSource, options) of the alignment kernels an Aligner(experts, block_m) launches: the
    two-pass pair above MAX_CHUNK pairs and, with `one_pass`, the one-launch kernel of each chunk
    size below (an aligned-route tactic reaches them at small M). For the search's precompile: E,
    E_PAD and CHUNK are constexprs, so otherwise each (E, BLOCK_M, CHUNK) compiled in the measuring
    worker. Pointers carry tt.divisibility 16 (torch allocations); P, n_chunks and max_blocks are
    not specialized (the kernels' do_not_specialize). Imports Triton."""
    import triton

    from . import moe_align as A
    from .compile import ast_source
    base = {"NUM_EXPERTS": int(experts), "E_PAD": triton.next_power_of_2(int(experts))}
    types = {n: ("i32" if n in ("P", "n_chunks", "max_blocks") else "*i32") for n in _SCATTER_ARGS}
    opts = {"num_warps": A.NUM_WARPS}
    out = [(ast_source(A._moe_count_kernel, _COUNT_ARGS, types, (0, 1, 2), {**base, "CHUNK": A.MAX_CHUNK}), opts)]
    chunks = [(A.MAX_CHUNK, 0)] + ([(c, 1) for c in (16, 32, 64) if c <= A.MAX_CHUNK] if one_pass else [])
    for chunk, one in chunks:
        consts = {**base, "CHUNK": chunk, "BLOCK_M": int(block_m), "ONE_PASS": one, **_ALIGN_CONSTS}
        out.append((ast_source(A._moe_scatter_kernel, _SCATTER_ARGS, types, range(6), consts), opts))
    return out
