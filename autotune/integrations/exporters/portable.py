"""The portable formats (autotune.cache.exportfile): a SQLite file or JSON, a checksum inside,
signed when a key is given or configured."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.integrations.exporters import ExportRefused, Option, Request


@dataclass(frozen=True)
class Portable:
    name: str
    help: str
    options: tuple[Option, ...] = ()

    def export(self, req: Request, **options: Any) -> list[str]:
        from autotune.cache.files import CacheError
        from autotune.cache.signing import load_key
        from autotune.integrations.portable import export_cache
        try:
            key = load_key(req.sign_key)
            rep = export_cache(req.open_store(), req.output, gpu=req.gpu, problem_keys=req.problem_keys,
                               fmt=self.name, key=key, include_predicted=req.include_predicted)
        except CacheError as e:
            raise ExportRefused(str(e)) from None
        return [rep.line(req.output)]


SQLITE = Portable("sqlite", "a SQLite file")
JSON = Portable("json", "JSON (a checksum inside)")
