"""Persistent tactic cache: Store (SQLite/any SQLAlchemy URL) and portable export/import."""
from autotune.integrations.portable import ImportReport, export_cache, import_cache
from cache.store import CacheError, Store, default_url

__all__ = ["Store", "CacheError", "export_cache", "import_cache", "ImportReport", "default_url"]
