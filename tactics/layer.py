"""The `layer` family: a whole MoE layer (autotune.core.layer.LayerProblem) as one call,
`kernel(x, w13, w2, topk_ids, topk_weights, out=None)` → [M, H].

Two kinds of tactic, `via`:
* "torch": the torch family's grouped-MoE calls composed (w13 with SwiGLU, h in the tactic's out
  dtype bf16, w2 with the routing weights and the top_k reduce); `dequant_dtype` and `chunk_n` as
  the torch family's. It runs everywhere (the CPU too), so a CPU search measures a layer end to end.
* "pair": the two pair problems' tactics run in sequence, each built by its own family through the
  registry (`w13`, `w2`: tactic JSON); the engine makes it from the stored winners of the pair
  problems (`registry.pair_tactic`), so the layer's winner is chosen between one-call layers and the
  pair FP4MoE runs today. Weights in a layout other than the plain one are packed once per weight
  object at its first call (outside any capture: a pair launcher is not capture-safe).

The designated default of a layer (its torch composition: `default_rank` 2, after the families that
run no layer); it runs moe_layer problems only (`kinds`)
and every other family's space is unchanged by it. Other families join a layer's search by declaring
the kind (the cuda family's `moe_layer` member: one launch for both GEMMs).
"""
from __future__ import annotations

from typing import Iterable

import torch

from autotune.core.arch import Arch
from autotune.core.codekey import Code
from autotune.core.inputs import OUT_DTYPE
from autotune.core.layer import KIND
from autotune.core.tactic import Tactic, Verdict, check_params
from autotune.tactics.base import PLAIN_LAYOUT, FamilyBase, FunctionKernel
from autotune.tactics import registry
from autotune.tactics.torch_ref import CHUNKS, DTYPES, TorchFamily

VIA = ("torch", "pair")
_TORCH_SCHEMA = {"via": ("torch",), "dequant_dtype": tuple(DTYPES), "chunk_n": CHUNKS}


def _pair_tactics(tactic: Tactic) -> tuple[Tactic, Tactic]:
    return Tactic.from_json(str(tactic["w13"])), Tactic.from_json(str(tactic["w2"]))


class LayerFamily(FamilyBase):
    name = "layer"
    CODE = Code.of("layer", __package__, ".layer", ".torch_ref", ".base", ".registry",
                   "autotune.core.arch", "autotune.core.codekey", "autotune.core.formats", "autotune.core.inputs",
                   "autotune.core.jsonread", "autotune.core.layer", "autotune.core.operands", "autotune.core.problem",
                   "autotune.core.tactic")
    depends_on = ("torch",)
    default_rank = 2      # the default of the layers it runs (the only kind it runs)
    kinds = (KIND,)

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def supports(self, problem) -> str | None:
        if problem.kind != KIND:
            return f"the layer family runs whole MoE layers ({KIND}), not {problem.kind}"
        return None

    def enumerate(self, problem, arch: Arch) -> Iterable[Tactic]:
        """The torch compositions; pair tactics come from the engine (stored pair winners)."""
        if self.supports(problem):
            return []
        return [Tactic(self.name, via="torch", dequant_dtype=d, chunk_n=c) for d in DTYPES for c in CHUNKS]

    def validate(self, tactic: Tactic) -> str | None:
        via = tactic.get("via")
        if via == "torch":
            return check_params(tactic, _TORCH_SCHEMA, "layer")
        if via != "pair":
            return f"layer: via must be one of {VIA}, got {via!r}"
        if set(tactic.params) != {"via", "w13", "w2"}:
            return f"layer: a pair tactic has via, w13 and w2, got {sorted(tactic.params)}"
        try:
            parts = _pair_tactics(tactic)
        except (TypeError, ValueError) as e:
            return f"layer: a pair's part is not a tactic: {e}"
        for role, t in zip(("w13", "w2"), parts):
            why = registry.validate(t.family, t.params)
            if why:
                return f"layer: pair {role}: {why}"
        return None

    def verdict_checked(self, problem, tactic: Tactic, arch: Arch) -> Verdict:
        if tactic["via"] == "torch":
            return TorchFamily().verdict_checked(problem.w13, Tactic("torch", dequant_dtype=tactic["dequant_dtype"],
                                                                     chunk_n=tactic["chunk_n"]), arch)
        for role, sub, t in zip(("w13", "w2"), problem.pair, _pair_tactics(tactic)):
            v = registry.get(t.family).verdict(sub, t, arch)
            if v.rejected:
                return Verdict.reject(f"pair {role}: {v.reason}")
        return Verdict.keep()

    def default(self, problem, arch: Arch) -> Tactic:
        return Tactic(self.name, via="torch", dequant_dtype="bf16" if arch.is_gpu else "fp32", chunk_n=0)

    def build(self, problem, tactic: Tactic, device: str):
        if tactic["via"] == "torch":
            t = Tactic("torch", dequant_dtype=tactic["dequant_dtype"], chunk_n=tactic["chunk_n"])
            k13, k2 = (TorchFamily().build(sub, t, device) for sub in problem.pair)
            return FunctionKernel(_chain(problem, k13, k2, lambda w: w, lambda w: w))
        parts = _pair_tactics(tactic)
        fams = [registry.get(t.family) for t in parts]
        k13, k2 = (f.build(sub, t, device) for f, sub, t in zip(fams, problem.pair, parts))
        return FunctionKernel(_chain(problem, k13, k2, *(_packer(f, t) for f, t in zip(fams, parts))),
                              release=lambda: (k13.release(), k2.release()))


def _packer(fam, tactic: Tactic):
    """w as `tactic`'s kernels read it: as is (the plain layout), or packed once per weight object."""
    lay = fam.layout(tactic)
    if lay == PLAIN_LAYOUT:
        return lambda w: w
    memo: dict[int, tuple] = {}

    def packed(w):
        hit = memo.get(id(w))
        if hit is None or hit[0] is not w:
            hit = memo[id(w)] = (w, fam.pack(lay, w))
        return hit[1]
    return packed


def _chain(problem, k13, k2, pack13, pack2):
    """The layer as its two GEMMs: h = swiglu(x · W13[e]ᵀ) per (token, slot) in bf16, then
    y = Σ_j weight · h · W2[e]ᵀ."""
    odt = OUT_DTYPE[problem.out_dtype]

    def kernel(x, w13, w2, topk_ids, topk_weights, out=None):
        if x.ndim != 2 or x.shape[1] != problem.k or x.dtype != torch.bfloat16:
            raise ValueError(f"{problem.key}: x must be bf16 [M, {problem.k}], got {x.dtype} {tuple(x.shape)}")
        if topk_ids.shape != (x.shape[0], problem.top_k) or topk_weights.shape != topk_ids.shape:
            raise ValueError(f"{problem.key}: routing must be [M, {problem.top_k}] ids and weights, got "
                             f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}")
        if out is None:
            out = torch.empty(x.shape[0], problem.k, dtype=odt, device=x.device)
        h = k13(x, pack13(w13), topk_ids, None)                 # [M, top_k, I]
        return k2(h, pack2(w2), topk_ids, topk_weights, out=out)
    return kernel
