"""The shared part of the test-only families whose members differ by a `mode` (and perhaps more):
each lists its members for dense problems only, keeps every member (the misbehaviour under test
is in `build`, not in the verdict), and names its designated default."""
from __future__ import annotations

from typing import Any, ClassVar

from autotune.core.tactic import Tactic, Verdict
from autotune.tactics.base import FamilyBase
from autotune.tactics.torch_ref import TorchFamily


class ModeFamily(FamilyBase):
    """Members `Tactic(name, mode=m)` for m in `MODES`; `DEFAULT` holds the default's parameters.
    Subclasses with more parameters override `members` (and `validate`)."""

    depends_on = ("torch",)
    MODES: ClassVar[tuple[str, ...]]
    DEFAULT: ClassVar[dict[str, Any]]

    def supports(self, problem):
        return None

    def members(self) -> list[Tactic]:
        return [Tactic(self.name, mode=m) for m in self.MODES]

    def enumerate(self, problem, arch):
        return self.members() if problem.kind == "dense" else []

    def validate(self, tactic):
        return None if tactic.params.get("mode") in self.MODES else "bad mode"

    def verdict_checked(self, problem, tactic, arch):
        return Verdict.keep()

    def default(self, problem, arch):
        return Tactic(self.name, **self.DEFAULT)


def torch_kernel(problem, device, dequant_dtype: str = "fp32"):
    """The torch reference kernel for `problem`: the right answer the test families start from."""
    return TorchFamily().build(problem, Tactic("torch", dequant_dtype=dequant_dtype, chunk_n=0), device)
