"""Environment identity: which GPU (keys every trial and winner) and which library versions
(key the trials and winners of the families that depend on them). Driver, CUDA runtime and
our own version are recorded but not keyed, so a cache stays valid inside an image with the
same libraries."""
from __future__ import annotations

import hashlib
import os
import platform
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from importlib import metadata

from autotune.core.tactic import canonical_json

#: distributions whose versions every live environment records (the device record's `libs`); a
#: family may depend on any other distribution too: a live environment looks its version up when a
#: lib key asks for it (Env.lib_versions), so no list here has to name a new family's dependencies
KNOWN_LIBS = ("torch", "triton", "flashinfer-python", "nvidia-cutlass", "nvmath-python", "cupy")


#: a distribution published under several names (CuPy's wheels carry the CUDA major in theirs)
_ALIASES = {"cupy": ("cupy-cuda13x", "cupy-cuda12x", "cupy")}


def _version(dist: str) -> str | None:
    for name in _ALIASES.get(dist, (dist,)):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _h(obj) -> str:
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Env:
    gpu_name: str
    cc: str                     # "9.0", or "cpu"
    sm_count: int
    device: str                 # "cuda" or "cpu"
    driver: str | None = None
    cuda_runtime: str | None = None
    cublas: str | None = None
    package: str | None = None
    libs: tuple[tuple[str, str | None], ...] = field(default=())
    #: this machine's environment (current(), cpu()): a dependency it has not recorded is looked up
    #: in the installed distributions; an Env read from a record knows only what it recorded
    live: bool = field(default=False, compare=False, repr=False)

    @property
    def device_key(self) -> str:
        return _h({"gpu": self.gpu_name, "cc": self.cc, "sms": self.sm_count})

    def lib_versions(self, depends_on: tuple[str, ...]) -> dict[str, str | None]:
        libs = dict(self.libs)
        libs["cublas"] = self.cublas      # torch does not report cuBLAS's version: None on a live Env
        return {d: libs[d] if d in libs else _version(d) if self.live else None for d in sorted(depends_on)}

    def lib_key(self, depends_on: tuple[str, ...]) -> str:
        return _h(self.lib_versions(depends_on))

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["live"]
        d["libs"] = dict(self.libs)
        d["device_key"] = self.device_key
        return d


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine())


def cpu() -> Env:
    """The CPU as an environment, also on a machine with a GPU (tests, CPU-only tuning)."""
    return Env(_cpu_name(), "cpu", os.cpu_count() or 1, "cpu", None, None, None, _version("fp4-autotune"),
               tuple((d, _version(d)) for d in KNOWN_LIBS), live=True)


@lru_cache(maxsize=None)
def current(device_index: int = 0) -> Env:
    """The live environment (GPU 0 by default; the CPU when no GPU is visible)."""
    libs = tuple((d, _version(d)) for d in KNOWN_LIBS)
    pkg = _version("fp4-autotune")
    try:
        import torch
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(device_index)
            cublas = None  # torch does not report cuBLAS's version: the cuBLASLt family's lib key holds None for it
            drv = None
            try:
                drv = str(torch.cuda.driver_version()) if hasattr(torch.cuda, "driver_version") else None
            except Exception:
                pass
            return Env(p.name, f"{p.major}.{p.minor}", p.multi_processor_count, "cuda", drv,
                       torch.version.cuda, cublas, pkg, libs, live=True)
    except ImportError:
        pass
    return cpu()
