"""The FP4 layers in one namespace: FP4Linear, FP4MLP, FP4GroupedGEMM (autotune.runtime.layers) and
FP4MoE, the whole routed-expert block (autotune.runtime.moe), which builds on them."""
from autotune.runtime.layers import FP4GroupedGEMM, FP4Linear, FP4MLP, _cat_rows  # noqa: F401
from autotune.runtime.moe import FP4MoE  # noqa: F401
