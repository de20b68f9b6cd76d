"""SASS instructions per weight element in the cuda family's main loop (nvcc + cuobjdump, no GPU).

    python3 -m tools.cuda_sass [--arch sm_90 sm_120] [--m-tiles 1 2] [--warps-k 4] [--stages 4] [--tiles-n 1 2]

Compiles w4a16_mma.cu with nvcc for each arch and M tile, disassembles the cubin with the
cuobjdump that Triton's wheel carries, finds the innermost loop that holds the HMMAs and prints
its instruction mix per 64-element k-pair per thread and per weight element.
"""
from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

from autotune.tactics.cuda import build as B

ELEMENTS_PER_KPAIR = 64        # per thread and row tile: two k-groups of 4 words of 8 e2m1 codes
DECODE_OPS = ("LOP3.LUT", "SHF.R.W.U32", "HMUL2.BF16_V2", "HFMA2.BF16_V2", "PRMT", "IMAD.U32")


def cuobjdump() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(p) if p.exists() else None


def loop_mix(cubin: Path, tool: str) -> collections.Counter:
    """Opcode counts of the backward-branch loop holding the most HMMAs (the unrolled main loop;
    the compiler also emits a remainder loop for k-pair counts that are not a multiple of 4)."""
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2).strip())
           for m in (re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", ln) for ln in sass.splitlines()) if m]
    best: list[str] | None = None
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            hmma = sum("HMMA" in t for t in body)
            if hmma and (best is None or hmma > sum("HMMA" in t for t in best)
                         or (hmma == sum("HMMA" in t for t in best) and len(body) < len(best))):
                best = body
    if best is None:
        raise ValueError("no loop with an HMMA found")
    return collections.Counter(_op(t) for t in best)


def _op(text: str) -> str:
    """The opcode; `IMAD.U32 Rd, RZ, RZ, URn` is a move from a uniform register (ring addresses
    kept in the uniform datapath), not the scale decode's multiply-add: counted apart as IMAD.U32.MOV."""
    parts = text.split()[1:] if text.startswith("@") else text.split()
    if parts[0] == "IMAD.U32" and re.match(r"R\d+, RZ, RZ, UR\d+$", " ".join(parts[1:])):
        return "IMAD.U32.MOV"
    return parts[0]


def measure(c: B.Config, arch: str, tool: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        res = B.parse_ptxas(B.nvcc_compile(c, arch, cubin))
        mix = loop_mix(cubin, tool)
    kpairs = mix["HMMA.16816.F32.BF16"] // (8 * c.m_tiles * c.tiles_n)   # the loop may be unrolled
    elems = kpairs * ELEMENTS_PER_KPAIR * c.tiles_n
    decode = sum(mix[k] for k in DECODE_OPS)
    return {"arch": arch, "config": c, "registers": res.registers, "smem": res.smem,
            "loop_instructions": sum(mix.values()), "elements": elems,
            "per_element": sum(mix.values()) / elems, "decode_per_element": decode / elems,
            "hmma_per_element": mix["HMMA.16816.F32.BF16"] / elems, "mix": dict(mix.most_common())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["sm_90", "sm_120"])
    ap.add_argument("--m-tiles", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--warps-k", type=int, default=4)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--tiles-n", nargs="+", type=int, default=[1, 2])
    a = ap.parse_args()
    tool = cuobjdump()
    if tool is None or B.nvcc() is None:
        raise SystemExit("needs nvcc on PATH and Triton's cuobjdump")
    print("| arch | M tile | tiles_n | regs | loop instr | elements | instr/element | decode/element | HMMA/element |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for arch in a.arch:
        for mt in a.m_tiles:
            for tn in a.tiles_n:
                try:
                    r = measure(B.Config(mt, a.warps_k, a.stages, tn), arch, tool)
                except ValueError as e:     # e.g. a fully unrolled loop
                    print(f"| {arch} | {8 * mt} | {tn} | {e} |")
                    continue
                print(f"| {arch} | {8 * mt} | {tn} | {r['registers']} | {r['loop_instructions']} | {r['elements']} | "
                      f"{r['per_element']:.2f} | {r['decode_per_element']:.2f} | {r['hmma_per_element']:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
