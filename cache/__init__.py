"""Persistent tactic cache: Store (SQLite or any SQLAlchemy URL), the structural row checks every
reader shares (cache.rows), the portable export format and its signatures (cache.exportfile,
cache.signing). Imports only autotune.core (and no torch); export/import/merge/prune as commands
are integrations (autotune.integrations.portable, autotune.integrations.prune)."""
from cache.exportfile import verify_for_serving
from cache.files import CacheError, default_url
from cache.rows import check_trial, check_winner
from cache.store import Store

__all__ = ["Store", "CacheError", "default_url", "check_winner", "check_trial", "verify_for_serving"]
