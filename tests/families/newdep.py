"""A test-only family whose dependency no list of core/env.py names (tests/test_env_keys.py)."""
from __future__ import annotations

from autotune.tactics.torch_ref import TorchFamily


class NewDep(TorchFamily):
    name = "newdep"
    depends_on = ("torch", "fp4-test-newdep")
