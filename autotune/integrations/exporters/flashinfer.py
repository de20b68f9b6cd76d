"""FlashInfer's autotuner cache file and its tactic blocklist (autotune.integrations.flashinfer)."""
from __future__ import annotations

from typing import Any

from autotune.integrations.exporters import ExportRefused, Option, Request


class FlashInfer:
    name = "flashinfer"
    help = "FlashInfer's autotuner cache (+ blocklist)"
    options = (
        Option("--flashinfer-version", "flashinfer_version", "flashinfer: the flashinfer-python release to write for"),
        Option("--metadata-from-env", "metadata_from_env", "flashinfer: take the metadata from the installed FlashInfer",
               is_flag=True),
        Option("--meta", "meta", "flashinfer: a loader metadata field (all of them, or --metadata-from-env)",
               multiple=True, metavar="FIELD=VALUE"),
        Option("--blocklist", "blocklist", "flashinfer: blocklist file (default: OUTPUT stem + .blocklist.json)"),
    )

    def export(self, req: Request, *, flashinfer_version=None, metadata_from_env=False, meta=(), blocklist=None,
               **_: Any) -> list[str]:
        from autotune.integrations.flashinfer import ExportError, export_flashinfer, keys, render
        if req.sign_key:
            raise ExportRefused("--sign-key does not apply to --format flashinfer: FlashInfer's loader reads no "
                                "signature (sign a sqlite or json export, and serve FlashInfer's file from the image)")
        if not req.gpu:
            raise ExportRefused("--format flashinfer needs --gpu (the GPU identity whose cutlass winners to export)")
        try:
            given = keys.parse_metadata(meta)
        except ValueError as e:
            raise ExportRefused(str(e)) from None
        try:
            rep = export_flashinfer(req.open_store(), req.output, gpu=req.gpu, version=flashinfer_version,
                                    metadata=given, from_env=metadata_from_env, problem_keys=req.problem_keys,
                                    blocklist=blocklist, include_predicted=req.include_predicted)
        except ExportError as e:
            raise ExportRefused(str(e)) from None
        return list(render(rep))


FLASHINFER = FlashInfer()
