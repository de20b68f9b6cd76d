"""Old-vs-new SASS of the cuda family's kernels, and their register / spill table (no GPU).

    python3 -m tools.cuda_sass_same [--arch sm_90 sm_120] [--sample N] [--jobs 2] [--table PATH]

For every kept config (the family's tactic space on the GLM-5 TP8 problems, NVFP4 and MXFP4, each
epilogue the kernels serve: `configs`) and each arch, compiles the current text (build.text) and the
base text of f4cc350 (tests/data/cuda_base, the files as they were) with the family's own NVRTC
options (build.nvrtc_options), disassembles both cubins with the cuobjdump Triton's wheel carries
and compares the SASS with the function name and the header lines stripped (no line info is
emitted). Prints the configs whose SASS differs (none is the goal: a refactor of the texts that
changes no instruction needs no new GPU run) and exits non-zero if any does.

NVRTC: the library CuPy would load (`libnvrtc.so*` on the loader path, $CUDA_SASS_NVRTC_LIB, or the
`nvidia-cuda-nvrtc` wheel's); without one, nvcc with the same -D options (-O3, the NVRTC default).
Compiled results are cached in $CUDA_SASS_CACHE (default: a directory under the temp dir), keyed
by the text, the options, the arch and the compiler, so a rerun compiles only what changed.
`--table` writes the current text's registers / stack / spill figures per config (markdown).
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from autotune.tactics.cuda import build as B

ROOT = Path(__file__).resolve().parents[1]
BASE_DIR = ROOT / "tests" / "data" / "cuda_base"
#: the base commit's composition of each kernel's text (build.SOURCES at f4cc350)
BASE_SOURCES = {"w4a16_mma": ("mma_common.cuh", "w4a16_mma.cu"),
                "moe_mma": ("mma_common.cuh", "moe_common.cuh", "moe_mma.cu"),
                "moe_tok": ("mma_common.cuh", "moe_common.cuh", "moe_tok.cu")}
BASE_COMMIT = "f4cc350"
ARCHS = ("sm_90", "sm_120")


def base_text(kernel: str) -> str:
    return "\n".join((BASE_DIR / f"{f}.txt").read_text() for f in BASE_SOURCES[kernel])


# --------------------------------------------------------------------------- compilers
def _nvrtc_path() -> str | None:
    env = os.environ.get("CUDA_SASS_NVRTC_LIB")
    if env:
        return env
    found = ctypes.util.find_library("nvrtc")
    if found:
        return found
    for d in sys.path:
        hits = sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", "libnvrtc.so*")))
        hits = [h for h in hits if "builtins" not in h]
        if hits:
            return hits[-1]
    return None


_LIB = None


def _nvrtc():
    global _LIB
    if _LIB is None:
        path = _nvrtc_path()
        _LIB = ctypes.CDLL(path) if path else False
    return _LIB or None


def compiler() -> str:
    """'nvrtc-<major>.<minor>' or 'nvcc' (what `compile_cubin` uses here)."""
    lib = _nvrtc()
    if lib is None:
        if B.nvcc() is None:
            raise SystemExit("needs NVRTC (libnvrtc) or nvcc")
        return "nvcc"
    a, b = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
    return f"nvrtc-{a.value}.{b.value}"


def compile_cubin(text: str, name: str, c, arch: str) -> bytes:
    """The cubin of `text` for config c on `arch`: NVRTC with the family's options, else nvcc."""
    lib = _nvrtc()
    if lib is None:
        with tempfile.TemporaryDirectory() as d:
            src, out = Path(d) / f"{name}.cu", Path(d) / "k.cubin"
            src.write_text(text)
            cmd = [B.nvcc(), "-cubin", f"-arch={arch}", "-O3", *B.options(c), "-o", str(out), str(src)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if r.returncode:
                raise RuntimeError(f"nvcc failed for {c} on {arch}: {r.stderr[-2000:]}")
            return out.read_bytes()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), f"{name}.cu".encode(), 0, None, None):
        raise RuntimeError("nvrtcCreateProgram failed")
    try:
        opts = [o.encode() for o in B.nvrtc_options(c, arch)]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        if lib.nvrtcCompileProgram(prog, len(opts), arr):
            n = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
            log = ctypes.create_string_buffer(n.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"NVRTC failed for {c} on {arch}: {log.value.decode()[-2000:]}")
        n = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetCUBIN(prog, buf)
        return buf.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def cuobjdump() -> str:
    import triton
    p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not p.exists():
        raise SystemExit("needs Triton's cuobjdump")
    return str(p)


def normalize(sass: str) -> str:
    """The instructions and their encodings (control bits included), without the kernel's name and
    the headers that carry it."""
    keep = []
    for ln in sass.splitlines():
        s = ln.strip()
        if not s or s.startswith(("Function :", ".headerflags", "code for", ".target", "Fatbin", "=====")):
            continue
        keep.append(s)
    return "\n".join(keep)


def resources(res: str) -> dict[str, int]:
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res)
    if m is None:
        raise ValueError(f"no resource line in {res[:300]}")
    return dict(zip(("registers", "stack", "shared", "local"), map(int, m.groups())))


def cache_dir() -> Path:
    return Path(os.environ.get("CUDA_SASS_CACHE") or Path(tempfile.gettempdir()) / "autotune-sass-cache")


def sass_of(text: str, name: str, c, arch: str) -> dict:
    """{'sass': normalized SASS, 'registers', 'stack', 'shared', 'local'}; cached on disk."""
    h = hashlib.sha256()
    for part in (text, " ".join(B.nvrtc_options(c, arch)), arch, compiler()):
        h.update(part.encode())
        h.update(b"\0")
    path = cache_dir() / f"{name}-{arch}-{h.hexdigest()[:32]}.json"
    if path.exists():
        return json.loads(path.read_text())
    cubin = compile_cubin(text, name, c, arch)
    tool = cuobjdump()
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        sass = subprocess.run([tool, "-sass", str(f)], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", str(f)], capture_output=True, text=True, check=True).stdout
    out = {"sass": normalize(sass), **resources(res)}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(out))
    os.replace(tmp, path)
    return out


# --------------------------------------------------------------------------- the kept configs
def problems() -> list:
    """GLM-5 TP8's cuda problems (dense MLP and shared expert, routed experts, the folded shared
    expert), each epilogue the kernels serve, NVFP4 and MXFP4."""
    from dataclasses import replace

    from autotune.models import problems_for
    ps = []
    for u in problems_for("glm5", tp=8):
        p = u.problem
        eps = ("none", "swiglu") if p.kind == "dense" else ("none", "swiglu", "reduce")
        for ep in eps:
            for fmt in ("nvfp4", "mxfp4"):
                q = replace(p, epilogue=ep, w_fmt=fmt)
                ps.append(q)
                if q.kind == "grouped_moe":             # the folded shared expert: one more expert, one more slot
                    ps.append(replace(q, experts=q.experts + 1, top_k=q.top_k + 1))
    return ps


def configs() -> list:
    """(kernel, config) for every tactic the family keeps on sm_90 or sm_120 for `problems()` (every
    M variant of a dense tactic), NVFP4's first, deduplicated by the compiled variant (kernel, defines)."""
    from autotune.core.arch import get_arch
    from autotune.tactics.cuda import family as F
    from autotune.tactics.cuda import moe as MOE
    fam = F.CudaFamily()
    seen: dict[tuple, object] = {}
    for p in problems():
        if fam.supports(p):
            continue
        for t in fam.enumerate(p, get_arch("sm90")):
            if all(fam.verdict(p, t, get_arch(a)).ok is False for a in ("sm90", "sm120")):
                continue
            cs = [MOE.config(p, t)] if MOE.is_moe(t) else [F.config(t, mt, p) for mt in B.M_TILES]
            for c in cs:
                seen.setdefault((B.kernel_name(c), tuple(sorted(B.defines(c).items()))), c)
    return sorted(seen.values(), key=lambda c: c.fmt != "nvfp4")


def compare(c, arch: str) -> dict:
    name = B.kernel_name(c)
    new = sass_of(B.text(c), name, c, arch)
    old = sass_of(base_text(name), name, c, arch)
    return {"config": repr(c), "arch": arch, "same": new["sass"] == old["sass"],
            **{k: new[k] for k in ("registers", "stack", "shared", "local")},
            "base_registers": old["registers"]}


def _compare(job):
    return compare(*job)


def run(cs: list, archs=ARCHS, jobs: int = 2) -> list[dict]:
    work = [(c, a) for c in cs for a in archs]
    if jobs <= 1:
        return [compare(c, a) for c, a in work]
    with ProcessPoolExecutor(jobs) as ex:
        return list(ex.map(_compare, work, chunksize=4))


def table(rows: list[dict]) -> str:
    out = [f"Registers, stack and spills of the cuda family's kept configs (tools/cuda_sass_same.py, "
           f"{compiler()}); `same`: SASS identical to {BASE_COMMIT}'s text.", "",
           "| arch | config | registers | base registers | stack B | local B | shared B | same |",
           "|---|---|---:|---:|---:|---:|---:|---|"]
    for r in sorted(rows, key=lambda r: (r["arch"], r["config"])):
        out.append(f"| {r['arch']} | {r['config']} | {r['registers']} | {r['base_registers']} | {r['stack']} | "
                   f"{r['local']} | {r['shared']} | "
                   f"{'yes' if r['same'] else 'NO'} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=list(ARCHS))
    ap.add_argument("--sample", type=int, default=0, help="a random sample of this many configs (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--table", type=Path, help="write the register / spill table (markdown) here")
    a = ap.parse_args(argv)
    cs = configs()
    if a.sample:                                    # a prefix of one shuffled order: samples nest
        random.Random(a.seed).shuffle(cs)
        cs = cs[:a.sample]
    print(f"{len(cs)} configs x {len(a.arch)} archs, {compiler()}", flush=True)
    rows = run(cs, a.arch, a.jobs)
    diff = [r for r in rows if not r["same"]]
    for r in diff:
        print(f"SASS differs: {r['arch']} {r['config']}")
    print(f"{len(rows) - len(diff)} of {len(rows)} builds SASS-identical to {BASE_COMMIT}")
    if a.table:
        a.table.write_text(table(rows))
    return 1 if diff else 0


if __name__ == "__main__":
    raise SystemExit(main())
