"""Launching the cuda family's kernels, with programmatic dependent launch where it exists.

On sm_90+ (and with cuda-bindings, $AUTOTUNE_PDL not 0) a kernel goes through cuLaunchKernelEx
with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: it may start while the previous kernel
in the stream ends; the kernels wait for it (griddepcontrol.wait, mma_common.cuh) before they read
or write anything, so a result never depends on the overlap. Stream capture records the overlap as a programmatic edge, so CUDA graphs keep it.
Elsewhere, CuPy's launch. Arguments are packed once per call into one buffer laid out as the C
signature declares (`signature`): no per-argument objects, one ctypes call.
"""
from __future__ import annotations

import ctypes
import re
import struct
import threading
from typing import Any, Callable, Sequence

from autotune.core import settings

Run = Callable[[tuple, tuple, Sequence[Any], int], None]   # (grid, block, args, raw stream) -> None


def signature(text: str, name: str) -> str:
    """The struct format (native alignment, as the C ABI lays out kernel parameters) of kernel
    `name`'s parameters in `text`: 'P' per pointer, 'i' per int; any other type is refused. A
    parameter list given as a macro (`name(NAME_PARAMS)`, args.py) is read from its #define."""
    d = re.search(r"#define\s+" + re.escape(name.upper()) + r"_PARAMS\s+([^\n]*)", text)
    if d is not None:
        text = text.replace(f"{name.upper()}_PARAMS)", d.group(1) + ")")
    m = re.search(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?' + re.escape(name) + r"\s*\(([^)]*)\)", text)
    if m is None:
        raise ValueError(f"no extern \"C\" __global__ kernel {name} in the source")
    fmt = "@"
    for p in m.group(1).split(","):
        p = " ".join(p.split())
        if "*" in p:
            fmt += "P"
        elif re.fullmatch(r"(const )?int \w+", p):
            fmt += "i"
        else:
            raise ValueError(f"kernel {name}: parameter {p!r} is neither a pointer nor an int")
    return fmt


def offsets(fmt: str) -> list[int]:
    """Each parameter's byte offset in the buffer `fmt` packs (C's offsetof)."""
    return [struct.calcsize(fmt[:i + 2]) - struct.calcsize("@" + ch) for i, ch in enumerate(fmt[1:])]


def available(device_index: int) -> bool:
    """PDL for launches on this device: $AUTOTUNE_PDL on, compute capability >= 9.0, cuda-bindings."""
    if not settings.pdl():
        return False
    import torch
    if torch.cuda.get_device_capability(device_index)[0] < 9:
        return False
    try:
        from cuda.bindings import driver  # noqa: F401
    except ImportError:
        return False
    return True


class PdlRun:
    """run(grid, block, args, stream): cuLaunchKernelEx of one loaded function with the PDL
    attribute. One argument buffer per instance, filled and launched under a lock (the driver
    copies it at the launch), so threads may share a launcher."""

    def __init__(self, fn_ptr: int, fmt: str, name: str):
        from cuda.bindings import driver as cu
        self._cu, self._name, self._fmt = cu, name, fmt
        self._fn = cu.CUfunction(init_value=fn_ptr)
        self._buf = ctypes.create_string_buffer(max(struct.calcsize(fmt), 8))
        base = ctypes.addressof(self._buf)
        # kernelParams: a pointer to each parameter, inside the one buffer pack_into fills per call
        self._params = (ctypes.c_void_p * len(fmt[1:]))(*(base + o for o in offsets(fmt)))
        self._params_ptr = ctypes.addressof(self._params)
        self._configs: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def _config(self, grid: tuple, block: tuple) -> Any:
        cu = self._cu
        c = cu.CUlaunchConfig()
        c.gridDimX, c.gridDimY, c.gridDimZ = grid
        c.blockDimX, c.blockDimY, c.blockDimZ = block
        c.sharedMemBytes = 0                       # the kernels declare static shared memory only
        a = cu.CUlaunchAttribute()
        a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        c.attrs, c.numAttrs = [a], 1
        if len(self._configs) < 256:
            self._configs[(grid, block)] = c
        return c

    def __call__(self, grid: tuple, block: tuple, args: Sequence[Any], stream: int) -> None:
        with self._lock:
            c = self._configs.get((grid, block)) or self._config(grid, block)
            c.hStream = stream
            struct.pack_into(self._fmt, self._buf, 0, *args)
            err, = self._cu.cuLaunchKernelEx(c, self._fn, self._params_ptr, 0)
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuda {self._name}: cuLaunchKernelEx failed: {err.name}")


class CupyRun:
    """run(grid, block, args, stream): CuPy's launch (no launch attributes) on the raw stream."""

    def __init__(self, fn: Any, device_index: int):
        import cupy
        self._fn, self._dev, self._cupy = fn, device_index, cupy
        self._streams: dict[int, Any] = {}

    def __call__(self, grid: tuple, block: tuple, args: Sequence[Any], stream: int) -> None:
        s = self._streams.get(stream)
        if s is None:        # CuPy's handle of a raw stream, made once per stream
            s = self._streams[stream] = self._cupy.cuda.ExternalStream(stream, self._dev)
        self._fn(grid, block, args, stream=s)


def runner(fn: Any, text: str, name: str, device_index: int) -> Run:
    """How to launch CuPy function `fn` (kernel `name` of source `text`) on this device."""
    if available(device_index):
        ptr = fn.kernel.ptr if hasattr(fn, "kernel") else fn.ptr      # CuPy's RawKernel holds the Function
        return PdlRun(int(ptr), signature(text, name), name)
    return CupyRun(fn, device_index)
