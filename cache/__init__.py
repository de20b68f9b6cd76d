"""Persistent tactic cache: Store (SQLite or any SQLAlchemy URL), the structural row checks every
reader shares (autotune.cache.rows), the portable export format and its signatures (autotune.cache.exportfile,
autotune.cache.signing). Imports only autotune.core (and no torch); export/import/merge/prune as commands
are integrations (autotune.integrations.portable, autotune.integrations.prune)."""
from autotune.cache.exportfile import verify_for_serving
from autotune.cache.files import CacheError, default_url
from autotune.cache.rows import check_trial, check_winner
from autotune.cache.store import Store

__all__ = ["Store", "CacheError", "default_url", "check_winner", "check_trial", "verify_for_serving"]
