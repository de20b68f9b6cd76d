"""The Family protocol: the one interface a backend implements (see docs/architecture.md)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, runtime_checkable

from autotune.core.tactic import Tactic, Verdict

Kernel = Callable[..., Any]


@runtime_checkable
class Family(Protocol):
    """The one interface a backend implements. Registered in `tactics.registry`."""

    name: str
    #: package names whose versions key this family's trials and winners (e.g. ("triton",))
    depends_on: tuple[str, ...]

    def available(self, device: str) -> tuple[bool, str]:
        """Can this family run on `device` ("cpu" or "cuda") in this process, and if not why."""

    def enumerate(self, problem: Any, arch: Any) -> Iterable[Tactic]:
        """The tactic space for a problem on an arch (deterministic order)."""

    def verdict(self, problem: Any, tactic: Tactic, arch: Any) -> Verdict:
        """Pure: no compile, no launch, no GPU."""

    def default(self, problem: Any, arch: Any) -> Tactic:
        """The family's designated default for this problem (must get ok or unknown)."""

    def build(self, problem: Any, tactic: Tactic, device: str) -> Kernel:
        """Return kernel(x, w) -> y. May compile; never called for a rejected tactic."""

    def validate(self, tactic: Tactic) -> str | None:
        """None when the parameters fit this family's schema, else why not (used on import)."""
