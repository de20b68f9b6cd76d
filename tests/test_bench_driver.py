"""The device driver (bench/device_run.sh) with DRY=1: every stage's plumbing on the CPU — the
environment it reads, the device record, the GPU-test list collected and the GPU-check hand-off
refusing a log in which nothing ran, the record restored from an earlier call's keep folder, a search
on a fresh cache with `show` and the main-job summary, the keep copies, the compare and the step on
that cache, the host bench — so a renamed flag, a moved script or a changed summary fails in CI, not
in a GPU call. Nothing here depends on speed: a stage cut by its limit still writes what it measured.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "bench" / "device_run.sh"
RECORD = ROOT / "tactics" / "cuda" / "gpu_checked.json"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
        "hidden_act": "silu", "torch_dtype": "bfloat16"}
#: what bench/main_job_summary.py writes for every main job (the figures the measurement entries cite)
SUMMARY_KEYS = {"date", "commit", "versions", "command", "wall_s", "stages", "compile_s", "trials", "jobs",
                "winners", "jobs_not_measured", "served"}


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _dry(tmp: Path, name: str, **env: str) -> tuple[Path, str]:
    out = tmp / name
    # each stage's own limit far above what it needs: a slow machine takes longer, never cuts a stage
    limits = {k: "3000" for k in ("GPU_TESTS_S", "SEARCH_S", "REF_S", "HOST_S", "COMPARE_S", "FOLD_S", "STEP_S")}
    e = {**os.environ, **limits, "DRY": "1", "OUT": str(out), "KEEP_DIR": str(tmp / "keep"), **env}
    e.pop("PYTHONPATH", None)
    r = subprocess.run(["bash", str(DRIVER)], cwd=ROOT, env=e, capture_output=True, text=True, timeout=6000)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out, r.stdout + r.stderr


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("driver")
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text(json.dumps(TINY))
    return d


def test_dry_gpu_tests_collect_the_list_and_the_hand_off_records_nothing(tiny):
    before = _digest(RECORD)
    out, log = _dry(tiny, "tests", GPU_TESTS="1", WHOLE="0", KEEP="1")
    full = (out / "gpu-tests-full.txt").read_text()
    driver = DRIVER.read_text()
    line = next(line for line in driver.splitlines() if line.startswith("GPU_TEST_FILES="))
    # the line as the driver's shell expands it (the cuda members' list comes from their registry)
    listed = subprocess.run(["bash", "-c", line + '; echo "$GPU_TEST_FILES"'], cwd=ROOT, capture_output=True,
                            text=True, check=True, timeout=300).stdout.split()
    assert listed and all((ROOT / f).is_file() for f in listed), listed
    assert sum(Path(f).name in full for f in listed) >= 4 and " collected" in full   # the GPU tests collected
    summary = (out / "summary.txt").read_text()
    assert "mark_gpu_checked:" in summary and "GPU-check hand-off: nothing recorded" in summary
    assert not (out / "gpu_checked.json").exists() and not (tiny / "keep" / "gpu_checked.json").exists()
    assert _digest(RECORD) == before                                   # the tree's record untouched
    env = json.loads((out / "env.json").read_text())
    assert env["card"] == "cpu" and env["versions"]["torch"] and env["commit"]


def test_dry_main_job_summary_keep_compare_step_host(tiny):
    keep = tiny / "keep"
    keep.mkdir(exist_ok=True)
    (keep / "gpu_checked.json").write_text(RECORD.read_text())        # an earlier call's record
    before = _digest(RECORD)
    out, log = _dry(tiny, "job", KEEP="1", MODEL=str(tiny / "model"), TP="1", EXTRA="--families torch --buckets 1,4",
                    COMPARE="1", STEP="1", STEP_FORMS="winners", STEP_MLP="fp4mlp", FOLD="1", HOST="1", LAYERS="1",
                    REF="1", PREDICT="1")
    summary = (out / "summary.txt").read_text()
    assert "GPU-check record restored from an earlier call on this machine" in summary
    assert _digest(RECORD) == before                                   # restored into a copy, not the tree
    assert "main-job: search exit" in summary
    s = json.loads((out / "main-job.json").read_text())
    assert SUMMARY_KEYS <= set(s), SUMMARY_KEYS - set(s)
    assert s["winners"] > 0 and s["command"].startswith(f"autotune search --model {tiny / 'model'} --tp 1")
    assert (out / "main-job.db.xz").stat().st_size > 0 and (keep / "main-job.db.xz").is_file()
    assert "main-job-show.txt" in os.listdir(out)
    ref = json.loads((out / "main-job-ref.json").read_text())     # the reference: every bucket in full
    assert "--measure-every 1" in ref["command"] and "main-job-ref: search exit" in summary
    pred = json.loads((out / "predict.json").read_text())         # --strategy predict, its wall recorded
    assert "--strategy predict" in pred["command"] and "predict: search exit" in summary and pred["wall_s"] > 0
    cmp = json.loads((out / "compare.json").read_text())
    assert cmp["machine"]["card"] == "cpu" and "pairs" in cmp
    assert "layers: search exit 0" in summary and (out / "layers.db.xz").stat().st_size > 0
    assert (out / "layers-trials.txt").is_file()              # the model's layers, if it has any MoE
    step = json.loads((out / "step-winners-fp4mlp" / "mlp-step-graph.json").read_text())
    assert step["gpu"] == "cpu" and step["forms"] and all(f["rows"] for f in step["forms"])
    # bench/moe_host.py's CPU smoke run (tests/test_bench_smoke.py's SMOKE sends it here): the
    # driver's small arguments, its record read back
    host = json.loads((out / "moe-host.json").read_text())
    assert host["rows"] and host["machine"]["card"] == "cpu"
    assert "--experts 8 --reps 2 --batch 4 --profile 3" in host["command"]


def test_a_call_for_an_earlier_calls_cache_runs_no_main_job(tiny):
    """STEP_DB (or COMPARE_DB, LAYERS_DB) names an earlier call's cache: the whole main job stays off unless
    WHOLE=1 asks for it (a step-only call once spent four device minutes re-running the job)."""
    out, log = _dry(tiny, "later", MODEL=str(tiny / "model"), TP="1", STEP_DB=str(tiny / "none.db"))
    assert "main-job:" not in log and not (out / "main-job.json").exists()
    out, log = _dry(tiny, "layers", MODEL=str(tiny / "model"), TP="1", LAYERS="1", LAYERS_DB=str(tiny / "none.db"))
    assert "main-job:" not in log and not (out / "main-job.json").exists() and "layers: search exit" in log
