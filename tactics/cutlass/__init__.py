"""CUTLASS block-scaled FP4 GEMMs (through FlashInfer) as a tactic family with exact smem verdicts."""
from autotune.tactics.cutlass.family import CutlassFamily

__all__ = ["CutlassFamily"]
