"""Instruction count of the moe_decode main loop against the dense W4A16 kernel's, same tile (no GPU).

    TRITON_DEFAULT_FP_FUSION=1 python3 bench/moe_decode_sass.py [ARCH]      # default sm90

Cross-compiles both kernels to a cubin with the installed Triton (the launchers' specialization),
disassembles them with the cuobjdump Triton bundles, and counts the instructions of the innermost
loop that holds the HMMAs (one K-step). Used in docs/moe-decode.md to tell the per-element cost of
the dequantizing main loop apart from the MoE-specific prologue and epilogue.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TILE = dict(block_m=16, block_n=128, block_k=256, split_k=8, num_warps=4, num_stages=4)


def _loop(cubin: bytes) -> list[str]:
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "--dump-sass", f.name], capture_output=True, text=True, check=True).stdout
    ins = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)(.*?);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(3), m.group(4)))
    loops = []
    for addr, op, args in ins:
        t = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if t and int(t.group(1), 16) < addr:
            body = [o for a, o, _ in ins if int(t.group(1), 16) <= a <= addr]
            if any(o.startswith("HMMA") for o in body):
                loops.append(body)
    return min(loops, key=len) if loops else []


def main(arch: str = "sm90") -> int:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from autotune.core.arch import get_arch
    from autotune.core.problem import Problem
    from autotune.tactics.triton_fp4 import compile as C
    from autotune.tactics.triton_fp4 import moe_decode as md
    from autotune.tactics.triton_fp4 import moe_decode_kernel as K

    target = GPUTarget("cuda", get_arch(arch).cc_int, 32)
    opts = {"num_warps": TILE["num_warps"], "num_stages": TILE["num_stages"]}
    cfg = dict(TILE, kernel="moe_decode", route="direct")
    consts = md.constexprs(Problem.moe(512, 6144, 256, 8), cfg)
    sig = {n: K.ARG_TYPES[n] for n in K.ARG_NAMES}
    sig.update({c: "constexpr" for c in consts})
    moe = ASTSource(K.moe_decode_kernel, sig, constexprs=consts, attrs={(i,): [["tt.divisibility", 16]] for i in K.DIVISIBLE})
    dense, _, _ = C._source("nvfp4", dict(TILE, group_m=1, kernel="w4a16_dequant"))
    elems = TILE["block_n"] * TILE["block_k"]
    for name, src in (("moe_decode", moe), ("w4a16_dequant", dense)):
        body = _loop(triton.compile(src, target=target, options=opts).asm["cubin"])
        c = collections.Counter(o.split(".")[0] for o in body)
        per = len(body) * TILE["num_warps"] / elems
        print(f"{name} {arch} 16x128x256: {len(body)} instructions per thread per K-step, {per:.3f} warp-instructions "
              f"per weight element; {dict(c.most_common(10))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
