"""The split-K workspace rule of the dense W4A16 member, shared by its launcher and its bound form."""
from __future__ import annotations

from typing import Any, Mapping

#: a split-K launch never takes a workspace larger than this: larger M is cut into row chunks
MAX_WORKSPACE_BYTES = 256 << 20


def chunk_rows(params: Mapping[str, Any], n: int) -> int | None:
    """Rows per launch of a split-K tactic, or None when one launch takes any M (no split-K).
    The workspace [split, tiles, BM·BN] fp32 grows with M; past MAX_WORKSPACE_BYTES the call is cut
    into chunks of whole M tiles, each launched with the tactic's whole split. The split is never
    lowered (it was until 2026-12-01): each row's K reduction order is then the same at every M,
    so split-K tactics are batch-invariant."""
    sk, bm, bn = params["split_k"], params["block_m"], params["block_n"]
    if sk == 1:
        return None
    per_row_tile = sk * -(-n // bn) * bm * bn * 4
    return bm * max(1, MAX_WORKSPACE_BYTES // per_row_tile)
