"""The `triton` tactic family: FP4 (NVFP4/MXFP4) GEMMs in Triton, one member module per kernel —
a fused dequantize-in-registers W4A16 kernel with split-K for decode (w4a16.py), a
Triton-dequantize-then-cuBLAS member (dequant_cublas.py), a grouped-MoE kernel over stacked experts
(moe.py) and a W4A4 tl.dot_scaled GEMM (w4a4.py), composed by family.py.

Importing this package does not import Triton: the family's verdicts use the static smem models.
No module of the package imports the package itself (only its sibling modules), so this file
creates no import cycle.
"""
from .family import TritonFamily
from .smem import smem_bytes, tmem_columns

__all__ = ["TritonFamily", "smem_bytes", "tmem_columns"]
