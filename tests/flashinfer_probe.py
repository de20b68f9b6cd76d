"""Run inside one installed flashinfer-python release (tests/test_flashinfer_export.py starts it with
that release's --target folder on PYTHONPATH): FlashInfer's own loader, autotuner and blocklist
judge the files we exported. Prints one JSON object.

No SM120 GPU runs here: torch reports no device, so the device name FlashInfer's metadata records
is set to the test's GPU, and FlashInfer's own CutlassFp4GemmRunner class is built around a
stand-in for the compiled SM120 module (it reports the module's tactic count; a kernel call fails).
Lookup (choose_one outside tuning) and the blocklist filter never launch a kernel.

argv[1]: JSON {"gpu", "tactic_num", "load": [paths, loaded in order], "queries": [[m, n, k, alpha_rank]],
"export_from_env": {cache, out, gpu, other_gpu}: export with --metadata-from-env here (then on
another GPU, which must be refused), "tune_cache"/"tune_queries": look tuned shapes up inside autotune(True, cache=...),
"plugin": call the vLLM hook first (it reads $FP4_AUTOTUNE_FLASHINFER_CACHE)}
PYTHONPATH: the release's folder, its deps folder, then our checkout.
"""
from __future__ import annotations

import json
import sys

import torch

req = json.loads(sys.argv[1])
torch.cuda.get_device_name = lambda *a, **k: req["gpu"]     # the GPU this test stands for
torch.cuda.current_device = lambda: 0

import flashinfer  # noqa: E402
from flashinfer.autotuner import AutoTuner  # noqa: E402
from flashinfer.autotuner.autotuner import _collect_metadata  # noqa: E402
from flashinfer.gemm.gemm_base import _MM_FP4_TUNING_CONFIG_128x4, _create_cutlass_fp4_gemm_module  # noqa: E402


class StandInSm120Module:
    """What the tvm-ffi SM120 module exposes to CutlassFp4GemmRunner, minus the kernels."""

    def fp4_gemm_tactic_num(self) -> int:
        return req["tactic_num"]

    def fp4_gemm(self, *args):
        raise RuntimeError("stand-in module: no SM120 kernel here")


def pad(x: int, to: int) -> int:
    return (x + to - 1) // to * to


def inputs(m: int, n: int, k: int, alpha_rank: int) -> list:
    """mm_fp4's inputs as vLLM/SGLang pass them (weight and its scales transposed views)."""
    u8 = torch.uint8
    return [torch.empty(m, k // 2, dtype=u8), torch.empty(n, k // 2, dtype=u8).t(),
            torch.empty(pad(m, 128), pad(k // 16, 4), dtype=u8),
            torch.empty(pad(n, 128), pad(k // 16, 4), dtype=u8).t(),
            torch.ones((1,) * alpha_rank, dtype=torch.float32), torch.bfloat16,
            torch.empty(m, n, dtype=torch.bfloat16), 16, True, torch.empty(1 << 20, dtype=u8)]


tuner = AutoTuner.get()   # built now: reads FLASHINFER_TACTICS_BLOCKLIST from the environment
runner = _create_cutlass_fp4_gemm_module(StandInSm120Module(), "flashinfer::cutlass_fp4_gemm_sm120",
                                         "cutlass_fp4_gemm_sm120").cutlass_fp4_gemm_runner()
out: dict = {"version": flashinfer.__version__, "metadata": _collect_metadata(), "runner": type(runner).__name__}
if req.get("export_from_env"):   # `export --metadata-from-env` as run inside the serving image
    from autotune.integrations.flashinfer import ExportError, export_flashinfer
    from autotune.cache import Store
    job = req["export_from_env"]
    with Store(job["cache"], readonly=True) as store:
        export_flashinfer(store, job["out"], gpu=job["gpu"], from_env=True)
        torch.cuda.get_device_name = lambda *a, **k: job["other_gpu"]     # an image on another GPU
        try:
            export_flashinfer(store, job["out"] + ".other", gpu=job["gpu"], from_env=True)
            out["other_gpu_refusal"] = None
        except ExportError as e:
            out["other_gpu_refusal"] = str(e)
        torch.cuda.get_device_name = lambda *a, **k: req["gpu"]
if req.get("plugin"):      # the vllm.general_plugins entry point, as vLLM would call it
    from autotune.integrations import vllm_plugin
    out["plugin"] = vllm_plugin.register()
out["loaded"] = [tuner.load_configs(p) for p in req["load"]]
out["chosen"] = []
for m, n, k, alpha_rank in req["queries"]:
    r, tactic = tuner.choose_one("fp4_gemm", [runner], _MM_FP4_TUNING_CONFIG_128x4, inputs(m, n, k, alpha_rank))
    out["chosen"].append(tactic)
# a tuning warm-up as the engines run it (autotune(True, cache=file)): the file's entries carry the
# profiling policy mm_fp4 requests, so tuned shapes are served without profiling (which needs a GPU)
if req.get("tune_cache"):
    from flashinfer.autotuner import autotune
    with autotune(True, cache=req["tune_cache"]):
        out["tuned"] = [tuner.choose_one("fp4_gemm", [runner], _MM_FP4_TUNING_CONFIG_128x4, inputs(*q))[1]
                        for q in req["tune_queries"]]
# what the tuner would profile for a shape: the runner's tactics through the tuner's own blocklist
valid = runner.get_valid_tactics(inputs(64, 256, 512, 0), None)
out["profiled"] = tuner._blocklist.filter("fp4_gemm", runner, valid)
out["blocklist_loaded"] = tuner._blocklist.is_loaded
try:
    from autotune.integrations.flashinfer.keys import metadata_from_env
    out["ours_from_env"] = metadata_from_env()
except ImportError as e:
    out["ours_from_env"] = str(e)
print(json.dumps(out))
