"""The `triton` tactic family: W4A16 (bf16 × NVFP4/MXFP4) GEMMs — a fused dequantize-in-registers
Triton kernel (with split-K for decode), a Triton-dequantize-then-cuBLAS member and a grouped-MoE
kernel over stacked experts.

Importing this package does not import Triton: the family's verdicts use the static smem model.
"""
from .family import TritonFamily
from .smem import smem_bytes, tmem_columns

__all__ = ["TritonFamily", "smem_bytes", "tmem_columns"]
