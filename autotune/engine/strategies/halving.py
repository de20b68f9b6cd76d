"""`--strategy halving`: every kept tactic of every job, by successive halving. It is the base
every strategy starts from (autotune/engine/strategies/base.py), unchanged."""
from __future__ import annotations

from autotune.engine.strategies.base import HalvingStrategy

__all__ = ["HalvingStrategy"]
