"""The `triton` tactic family: a W4A16 (bf16 × NVFP4/MXFP4) dequantize-in-registers Triton GEMM.

Importing this package does not import Triton: the family's verdicts use the static smem model.
"""
from .family import TritonFamily
from .smem import smem_bytes, tmem_columns

__all__ = ["TritonFamily", "smem_bytes", "tmem_columns"]
