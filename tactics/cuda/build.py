"""Source text, compilation and resources of the cuda family's kernels.

One .cu text (w4a16_mma.cu) plus -D macros per config: the layout's bit constants come from
layout.py (one source of truth for the packer and the decoder). Two compilers read it:

* **NVRTC through CuPy** at run time (`load`): the cubin is cached on disk keyed by the source
  hash, the options, the NVRTC version and the arch, so a serving host needs no nvcc and compiles
  once. The loaded function's resources come from cuFuncGetAttribute (CuPy exposes them).
* **nvcc** (`nvcc_resources`), for CI on a machine without a GPU: `ptxas -v` figures per arch.

Shared memory is what the source declares: one static array of `smem_bytes(cfg)` bytes.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import layout as L
from . import members as M
from .args import PARAMS

KERNEL = "w4a16_mma"
MOE_KERNEL = "moe_mma"
TOK_KERNEL = "moe_tok"
#: each kernel's own file
SOURCE, MOE_SOURCE, TOK_SOURCE = (M.by_kernel()[k].paths()[-1] for k in (KERNEL, MOE_KERNEL, TOK_KERNEL))
#: each kernel's text: the files build.text joins, in order (members.py: the shared parts the member
#: includes, then its own file; its parameter list, args.py's, just before its own file)
SOURCES = M.sources()
#: moe_tok.cu's MAXK: slots per token its CTA holds (top_k of the problem, the shared slot included)
TOK_MAX_SLOTS = 32
M_TILES = (1, 2, 4, 8)            # n8 tiles of x rows per CTA: M <= 8, 16, 32, 64 per CTA row


def m_tiles_for(m: int) -> int:
    """Smallest n8-tile count covering min(M, 64) rows of x; larger M loops over grid.y."""
    need = -(-min(max(m, 1), 64) // 8)          # 1..8; M_TILES are the powers of two up to 8
    return 1 if need == 1 else 2 if need == 2 else 4 if need <= 4 else 8


@dataclass(frozen=True)
class Config:
    m_tiles: int
    warps_k: int
    stages: int
    tiles_n: int = 1     # 16-row weight tiles per CTA (each warp covers all of them)
    split_k: int = 1     # CTAs splitting K (fp32 partials; the last to arrive sums them in split order)
    swiglu: bool = False  # vLLM's [gate; up] rows: half the tiles gate, half up, y = silu(gate) * up
    fmt: str = "nvfp4"   # the weight format: its scale decode (layout.FORMAT)

    @property
    def threads(self) -> int:
        return 32 * self.warps_k


@dataclass(frozen=True)
class MoeConfig:
    """A variant of the grouped kernel (moe_mma.cu): the dense kernel's tiling, plus the K split
    across CTAs, the weight format (its scale decode) and the SwiGLU epilogue."""
    m_tiles: int         # n8 tiles of routed pairs per CTA: a group holds up to 8 * m_tiles pairs
    warps_k: int
    stages: int
    tiles_n: int
    split_k: int         # CTAs splitting K (the last to arrive sums them in split order)
    fmt: str = "nvfp4"
    swiglu: bool = False
    reduce: bool = False  # w2: routing-weighted top_k sum per token in the same launch
    token: bool = False   # moe_tok.cu: one CTA per (token, N tile), its slots summed in registers
                          # (reduce only; m_tiles 1, split_k 1)
    n_walk: int = 1       # moe_mma: N tiles one CTA walks after its route (split_k 1; docs/decisions/0006-n-tile-walk-out-of-search.md)

    @property
    def threads(self) -> int:
        return 32 * self.warps_k



def _ring_and_reduction(c) -> int:
    pipe = c.stages * c.threads * 36 * c.tiles_n   # per thread, stage and tile: 2 x 16 B words + 4 B scales
    red = c.warps_k * c.tiles_n * c.m_tiles * 4 * 32 * 4
    return max(pipe, red)


def smem_bytes(c) -> int:
    """The static arrays the source declares: max(cp.async ring, cross-warp reduction); the grouped
    kernel adds its group's pair list (8 * m_tiles ints). A config that names its kernel (`kernel`,
    e.g. moe_layer.LayerConfig) counts its own (`smem()`)."""
    if hasattr(c, "kernel"):
        return c.smem()
    if isinstance(c, MoeConfig) and c.token:       # the ring (its 2-value reduction is smaller), then
        return c.stages * c.threads * 36 * c.tiles_n + 3 * 4 * TOK_MAX_SLOTS + 4   # slot rows, experts, scales, count
    if isinstance(c, MoeConfig):
        return _ring_and_reduction(c) + 4 * 8 * c.m_tiles
    return _ring_and_reduction(c)


def _layout_defines() -> dict[str, str]:
    d = {}
    names = ("0", "1", "2", "3A", "3B")
    parts = [p for reg in L.ROTATIONS for p in reg]
    for name, (rot, mask) in zip(names, parts):
        d[f"ROT{name}"] = f"{rot}u"
        d[f"MASK{name}"] = f"0x{mask:08x}u"
    return d


def defines(c) -> dict[str, str]:
    if hasattr(c, "kernel"):                          # a config that names its kernel gives its own macros
        return {**c.defines(), **_layout_defines()}
    d = {"MT": str(c.m_tiles), "WK": str(c.warps_k), "STAGES": str(c.stages), "TN": str(c.tiles_n)}
    if isinstance(c, MoeConfig):
        mul, add, sw, shift = L.FORMAT[c.fmt]
        d.update(SPLITK=str(c.split_k), SWIGLU=str(int(c.swiglu)), REDUCE=str(int(c.reduce)), SW=str(sw), SCALE_MUL=f"0x{mul:x}u",
                 SCALE_ADD=f"0x{add * 0x10001:08x}u", EPI_SCALE=f"{float(2 ** shift)!r}f")
        if c.n_walk > 1:                              # absent: the source's default (1)
            d.update(NW=str(c.n_walk))
    else:
        mul, add, sw, shift = L.FORMAT[c.fmt]
        d.update(SCALE_MUL=f"0x{mul:x}u", SCALE_ADD=f"0x{add * 0x10001:08x}u", EPI_SCALE=f"{float(2 ** shift)!r}f")
        if c.split_k > 1 or c.swiglu:                 # absent: the source's defaults (1, 0)
            d.update(SPLITK=str(c.split_k), SWIGLU=str(int(c.swiglu)))
        if c.fmt != "nvfp4":                          # absent: NVFP4's 32 scale words per k-pair
            d.update(SW=str(sw))
    d.update(_layout_defines())
    return d


def options(c) -> list[str]:
    return [f"-D{k}={v}" for k, v in defines(c).items()]


def kernel_name(c) -> str:
    if hasattr(c, "kernel"):
        return c.kernel
    if isinstance(c, MoeConfig):
        return TOK_KERNEL if c.token else MOE_KERNEL
    return KERNEL


def source_text(kernel: str) -> str:
    """Kernel `kernel`'s text: the shared parts, its parameter list (args.py) and the kernel (one text:
    NVRTC and nvcc need no include path)."""
    *shared, own = SOURCES[kernel]
    return "\n".join([*(f.read_text() for f in shared), PARAMS[kernel].macro() + own.read_text()])


def text(c=None) -> str:
    """The source of config c's kernel (the dense one without a config)."""
    return source_text(kernel_name(c))


# --------------------------------------------------------------------------- nvcc (CI, tools)
@dataclass(frozen=True)
class Resources:
    registers: int
    smem: int          # static shared bytes
    local: int         # local memory per thread (stack frame: spills and arrays)
    spill_stores: int
    spill_loads: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0 or self.local > 0


def nvcc() -> str | None:
    return shutil.which("nvcc")


def nvcc_compile(c, arch: str, out: Path) -> str:
    """Compile to a cubin for `arch` ("sm_90"); returns ptxas -v output (stderr)."""
    exe = nvcc()
    if exe is None:
        raise FileNotFoundError("nvcc not on PATH")
    src = out.with_suffix(".cu")
    src.write_text(text(c))
    cmd = [exe, "-cubin", f"-arch={arch}", "-O3", "-Xptxas", "-v", *options(c), "-o", str(out), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(f"nvcc failed for {c} on {arch}: {r.stderr.strip()[-2000:]}")
    return r.stderr


def parse_ptxas(log: str) -> Resources:
    def num(pat: str) -> int:
        m = re.search(pat, log)
        return int(m.group(1)) if m else 0
    if "Used" not in log:
        raise ValueError(f"no ptxas resource line in: {log[:500]}")
    return Resources(num(r"Used (\d+) registers"), num(r"(\d+) bytes smem"),
                     num(r"(\d+) bytes stack frame"), num(r"(\d+) bytes spill stores"),
                     num(r"(\d+) bytes spill loads"))


def nvcc_resources(c, arch: str) -> Resources:
    with tempfile.TemporaryDirectory() as d:
        return parse_ptxas(nvcc_compile(c, arch, Path(d) / "k.cubin"))


# --------------------------------------------------------------------------- NVRTC (run time)
def cache_dir() -> Path:
    from autotune.core import settings
    env = settings.cuda_cubins()
    if env:
        return Path(env)
    import platformdirs
    return Path(platformdirs.user_cache_dir("fp4-autotune")) / "cuda-cubins"


def cubin_key(c, arch: str, nvrtc_version: tuple[int, int]) -> str:
    h = hashlib.sha256()
    for part in (text(c), " ".join(options(c)), arch, f"nvrtc{nvrtc_version[0]}.{nvrtc_version[1]}"):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def nvrtc_options(c, arch: str) -> list[str]:
    """NVRTC's options for config c on `arch` ("sm_90"): what `nvrtc_cubin` compiles with."""
    return [f"--gpu-architecture={arch}", "-default-device", *options(c)]


def nvrtc_cubin(c, arch: str) -> Path:
    """The cubin file for `arch` ("sm_90"), from the disk cache or compiled by NVRTC (then stored)."""
    from cupy.cuda import nvrtc
    ver = nvrtc.getVersion()
    name = kernel_name(c)
    path = cache_dir() / f"{name}-{arch}-{cubin_key(c, arch, ver)}.cubin"
    if path.exists():
        return path
    prog = nvrtc.createProgram(text(c), f"{name}.cu", [], [])
    try:
        opts = nvrtc_options(c, arch)
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC failed for {c} on {arch}: {e}\n{nvrtc.getProgramLog(prog)}") from e
        cubin = nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(cubin)
    os.replace(tmp, path)                          # atomic: concurrent workers never read half a file
    return path


class SpillError(RuntimeError):
    pass


_LOADED: dict[tuple[Any, str, int], Any] = {}


def load(c, arch: str, device_index: int) -> Any:
    """The CuPy Function on `device_index`; a config that spills is refused with its numbers."""
    key = (c, arch, device_index)
    fn = _LOADED.get(key)
    if fn is None:
        import cupy
        with cupy.cuda.Device(device_index):
            fn = cupy.RawModule(path=str(nvrtc_cubin(c, arch))).get_function(kernel_name(c))
            res = runtime_resources(fn)             # cuFuncGetAttribute, loads the module here
        if res["local_size_bytes"] > 0:
            raise SpillError(f"cuda {c} on {arch}: {res['local_size_bytes']} bytes of local memory per "
                             f"thread (spills or a stack array), {res['num_regs']} registers: refused")
        if res["shared_size_bytes"] != smem_bytes(c):
            raise RuntimeError(f"cuda {c} on {arch}: the cubin declares {res['shared_size_bytes']} B of "
                               f"shared memory, the verdict counted {smem_bytes(c)} B")
        _LOADED[key] = fn
    return fn


def runtime_resources(fn: Any) -> Mapping[str, int]:
    return {k: int(getattr(fn, k)) for k in ("num_regs", "local_size_bytes", "shared_size_bytes",
                                             "max_threads_per_block")}
