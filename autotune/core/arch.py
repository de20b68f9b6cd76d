"""Per-architecture limits (reference/hardware.md) and live-device detection.

Numbers come from the CUDA Programming Guide's compute-capability tables, checked against
CUTLASS's `sm*_smem_capacity_bytes` and an H200 device query. `cpu` is a pseudo-arch for
runs without a GPU: it has no shared-memory limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FP4Mode = Literal["native", "emulated", "unsupported"]


@dataclass(frozen=True)
class Arch:
    name: str                      # "sm120"
    cc: tuple[int, int]            # (12, 0)
    smem_per_block_optin: int      # bytes a block may opt in to
    smem_per_sm: int               # max carveout per SM
    smem_reserved_per_block: int   # taken by the system from each block's share
    regs_per_sm: int
    max_regs_per_thread: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    clusters: bool
    fp4: FP4Mode                   # FP4 tensor cores: native, or emulated by upcasting
    fp4_instruction: str = ""
    target: str = ""               # the arch-specific compile target ("sm_120a")

    @property
    def is_gpu(self) -> bool:
        return self.name != "cpu"

    @property
    def cc_int(self) -> int:
        return self.cc[0] * 10 + self.cc[1]


def _gpu(name, cc, optin, regs_t, threads, blocks, clusters, fp4, instr, target) -> Arch:
    return Arch(name, cc, optin, optin + 1024, 1024, 65536, regs_t, threads, blocks, clusters,
                fp4, instr, target)


_MXF4 = "mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale"
_TC05 = "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.block16"

ARCHS: dict[str, Arch] = {a.name: a for a in [
    _gpu("sm80", (8, 0), 166912, 255, 2048, 32, False, "emulated", "", "sm_80"),
    _gpu("sm86", (8, 6), 101376, 255, 1536, 16, False, "emulated", "", "sm_86"),
    _gpu("sm89", (8, 9), 101376, 255, 1536, 24, False, "emulated", "", "sm_89"),
    _gpu("sm90", (9, 0), 232448, 255, 2048, 32, True, "emulated", "", "sm_90a"),
    _gpu("sm100", (10, 0), 232448, 255, 2048, 32, True, "native", _TC05, "sm_100a"),
    _gpu("sm103", (10, 3), 232448, 255, 2048, 32, True, "native", _TC05, "sm_103a"),
    _gpu("sm120", (12, 0), 101376, 255, 1536, 24, True, "native", _MXF4, "sm_120a"),
    _gpu("sm121", (12, 1), 101376, 255, 1536, 24, True, "native", _MXF4, "sm_121a"),
    Arch("cpu", (0, 0), 0, 0, 0, 0, 0, 0, 0, False, "emulated", "", "cpu"),
]}


def get_arch(name: str) -> Arch:
    """Look an arch up by name ("sm120", "120", "12.0" or "sm_120a" all work)."""
    key = name.strip().lower().replace("sm_", "sm").replace(".", "").rstrip("af")
    if key.isdigit():
        key = "sm" + key
    if key not in ARCHS:
        raise ValueError(f"unknown arch {name!r}; known: {', '.join(ARCHS)}")
    return ARCHS[key]


def arch_for_cc(major: int, minor: int) -> Arch:
    for a in ARCHS.values():
        if a.cc == (major, minor):
            return a
    raise ValueError(f"no arch profile for compute capability {major}.{minor}; known: {', '.join(ARCHS)}")


def detect(device: int = 0) -> Arch:
    """The live device's arch (torch first, then CuPy), or the `cpu` pseudo-arch without a GPU."""
    try:
        import torch
        if torch.cuda.is_available():
            return arch_for_cc(*torch.cuda.get_device_capability(device))
    except ImportError:
        pass
    try:
        import cupy  # noqa: F401
        cc = cupy.cuda.Device(device).compute_capability  # "90"
        return arch_for_cc(int(cc[:-1]), int(cc[-1]))
    except Exception:
        pass
    return ARCHS["cpu"]
