"""A test-only export format (tests/test_exporters.py): the winners of the chosen GPU, one line each."""
from __future__ import annotations

from pathlib import Path

from autotune.integrations.exporters import ExportRefused, Option, Request


class Probe:
    name = "probe"
    help = "one line per winner"
    options = (Option("--probe-prefix", "probe_prefix", "probe: what each line starts with"),)

    def export(self, req: Request, *, probe_prefix=None) -> list[str]:
        if not probe_prefix:
            raise ExportRefused("--format probe needs --probe-prefix")
        with req.open_store() as s:
            ws = [w for w in s.winners() if req.gpu is None or w.device_key == req.gpu]
        Path(req.output).write_text("".join(f"{probe_prefix} {w.problem_key} {w.bucket} {w.tactic_id}\n" for w in ws))
        return [f"probe: {len(ws)} winners to {req.output}"]


PROBE = Probe()
