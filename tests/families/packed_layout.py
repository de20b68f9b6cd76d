"""A test-only family with its own weight layout: `pack` wraps the FP4Weight and counts itself;
the kernel refuses anything but its packed form. Checks that the engine times each tactic on the
layout `Family.pack` made once per input set and bucket, never packing inside a timed call."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.core.tactic import Tactic
from autotune.tactics.torch_ref import TorchFamily

LAYOUT = "test-packed"
PACKS: list[int] = []          # id of every weight packed


@dataclass(eq=False)
class Packed:
    inner: Any

    @property
    def packed(self):
        return self.inner.packed

    @property
    def fmt(self):
        return self.inner.fmt


class PackedTorch(TorchFamily):
    name = "packedtorch"

    def enumerate(self, problem, arch):
        return [Tactic(self.name, dequant_dtype="fp32", chunk_n=0)] if problem.kind == "dense" else []

    def layout(self, tactic):
        return LAYOUT

    def pack(self, layout, weight):
        assert layout == LAYOUT
        PACKS.append(id(weight))
        return Packed(weight)

    def build(self, problem, tactic, device):
        inner = super().build(problem, Tactic("torch", tactic.params), device)

        def kernel(x, w, out=None):
            if not isinstance(w, Packed):
                raise TypeError(f"packedtorch got {type(w).__name__}, not its layout")
            return inner(x, w.inner, out=out)
        return kernel
