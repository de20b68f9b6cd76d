"""vLLM hook: load an exported FlashInfer autotuner cache in every vLLM process at start.

Registered as a `vllm.general_plugins` entry point (setup.cfg), which vLLM calls in each of its
processes before the model loads. It does nothing unless $FP4_AUTOTUNE_FLASHINFER_CACHE names a
file written by `autotune cache export --format flashinfer`; then it hands the file to FlashInfer's
own loader, AutoTuner.load_configs, which checks the file's metadata against this environment and
ignores the whole file (with FlashInfer's warning) on a version or GPU mismatch.

Which vLLM needs it (docs/engines.md): one whose warm-up uses FlashInfer's managed autotune_v2
store reads no such file by itself, so the hook is the only way in. One whose warm-up runs
`autotune(tune_mode=True, cache=<its file>)` clears loaded files when that context opens; there,
copy the export to the file vLLM logs instead. The tactic blocklist needs no hook: FlashInfer
reads $FLASHINFER_TACTICS_BLOCKLIST itself.
"""
from __future__ import annotations

import logging
import os

ENV = "FP4_AUTOTUNE_FLASHINFER_CACHE"
log = logging.getLogger(__name__)


def load(path: str) -> bool:
    """FlashInfer's verdict on the file: True when its loader accepted it."""
    if not os.path.isfile(path):
        log.warning("%s=%s: no such file; FlashInfer keeps its own tactics", ENV, path)
        return False
    from flashinfer.autotuner import AutoTuner
    ok = bool(AutoTuner.get().load_configs(path))
    if ok:
        log.info("loaded FlashInfer autotuner cache %s", path)
    else:
        log.warning("FlashInfer refused %s (its metadata does not match this environment)", path)
    return ok


def register() -> bool | None:
    """The entry point: load $FP4_AUTOTUNE_FLASHINFER_CACHE if set (None when unset)."""
    path = os.environ.get(ENV, "").strip()
    return load(path) if path else None
