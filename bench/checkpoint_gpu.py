"""The producer-made fixtures of tests/data/ckpt loaded on a GPU (issue #25), checked against the
producers' references: `python3 bench/checkpoint_gpu.py` (prints one line per layer, exits 1 on
a miss). On SM90 `auto` serves W4A16 (no W4A4 tactic there); `--activations w4a4` runs the
torch family's emulated W4A4 on the device. Not run yet: the lead's device time.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

from autotune.runtime.moe import FP4MoE
from autotune.runtime.nn import FP4Linear

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "ckpt"
MOE = {"modelopt_qwen3moe": "model.layers.1.mlp", "modelopt_deepseek": "model.layers.1.mlp",
       "modelopt_gptoss": "model.layers.0.mlp", "gptoss_mxfp4": "model.layers.0.mlp"}


def rel(y, ref) -> float:
    return float((y.double().cpu() - ref).norm() / ref.norm())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--activations", default="w4a16", choices=("auto", "w4a4", "w4a16"))
    ap.add_argument("--tol", type=float, default=1e-2)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device")
        return 1
    bad = 0
    warnings.simplefilter("ignore")
    for name in ("modelopt_llama", "llmc_llama", "llmc_llama_a16", "llmc_llama_mxfp4"):
        r = load_file(str(DATA / f"{name}.ref.safetensors"))
        for k in sorted(r):
            if not k.startswith("deq."):
                continue
            m = k[4:]
            f = FP4Linear.from_pretrained(DATA / name, m, device="cuda", activations=a.activations
                                          if "a16" not in name and "mxfp4" not in name else "w4a16")
            x = r[f"x.{m}"].cuda()
            ref = r[f"x.{m}"].double() @ r[k].double().T if f.problem.a_fmt == "bf16" else r[f"y4.{m}"]
            e = rel(f(x), ref)
            bad += e > a.tol
            print(f"{name} {m} {f.problem.key} {f.table.rung_for(x.shape[0])[1].family}: rel {e:.2e}")
    for name, blk in MOE.items():
        r = load_file(str(DATA / f"{name}.ref.safetensors"))
        b = FP4MoE.from_pretrained(DATA / name, blk, device="cuda", activations="w4a16")
        y = b(r[f"x.{blk}"].cuda(), r[f"ids.{blk}"].cuda().int(), r[f"tw.{blk}"].cuda())
        e = rel(y, r[f"y.{blk}"])
        bad += e > a.tol
        print(f"{name} {blk} {b.problem13.key}: rel {e:.2e}")
    print("ok" if not bad else f"{bad} over tolerance {a.tol}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
