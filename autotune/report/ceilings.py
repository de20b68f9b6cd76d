"""Roofline ceilings: memory bandwidth and compute peaks of a device.

Preferred: ceilings measured on the device itself and stored in the cache's `meta` table under
`ceilings:<device_key>` (`autotune report --measure-ceilings` on that machine). Otherwise the
report falls back to the SKU table below, copied from shared/reference/hardware.md §2, and the
page says so. The compute ceiling that applies to a problem is the rate of the MMA it runs on:
W4A16 upcasts the weight, so bf16; FP4×FP4 runs at the FP4 rate only on archs with FP4 tensor
cores.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone

from autotune.core import jsonread

META_PREFIX = "ceilings:"


@dataclass(frozen=True)
class Ceilings:
    bandwidth_gbs: float | None                # GB/s (10^9 B/s)
    tflops: dict = field(default_factory=dict)  # MMA input type -> TFLOP/s ("bf16", "fp4")
    source: str = ""                            # where the numbers come from, said on the page
    stored: bool = False                        # measured on the device and stored in the cache

    def compute_for(self, a_fmt: str, w_fmt: str, fp4_native: bool) -> tuple[str, float | None]:
        kind = "fp4" if (fp4_native and a_fmt in ("nvfp4", "mxfp4") and w_fmt in ("nvfp4", "mxfp4")) else "bf16"
        return kind, self.tflops.get(kind)

    def to_dict(self) -> dict:
        return asdict(self)


_HW = "shared/reference/hardware.md §2"
#: GPU-name substring -> ceilings; "measured" figures there were measured once on that SKU by the
#: team (method in hardware.md), "spec" figures are secondary sources. Order: most specific first.
KNOWN: tuple[tuple[str, Ceilings], ...] = (
    ("H200", Ceilings(4250.0, {"bf16": 791.0},
                      f"{_HW}: measured once on an H200 — device-to-device copy 4.23–4.27 TB/s, "
                      "bf16 GEMM 8192³ 791 TFLOP/s (not stored in this cache)")),
    ("B200", Ceilings(8000.0, {"bf16": 2250.0, "fp4": 9000.0},
                      f"{_HW}: spec sheet figures (secondary sources), dense")),
    ("RTX 5090", Ceilings(1792.0, {"bf16": 209.5, "fp4": 1676.0},
                          f"{_HW}: spec figures (secondary sources); bf16 with fp32 accumulate")),
)


def known(gpu_name: str) -> Ceilings | None:
    for sub, c in KNOWN:
        if sub.lower() in (gpu_name or "").lower():
            return c
    return None


def stored(meta: dict[str, str], device_key: str) -> Ceilings | None:
    raw = meta.get(META_PREFIX + device_key)
    if not raw:
        return None
    try:
        d = jsonread.loads(raw, "stored ceilings", max_bytes=1 << 16)
        c = Ceilings(d.get("bandwidth_gbs"), dict(d.get("tflops") or {}), d.get("source", "stored"), True)
    except (ValueError, TypeError, AttributeError):
        return None
    figures = [c.bandwidth_gbs, *c.tflops.values()]     # an edited meta row must not reach a division
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
               for v in figures if v is not None):
        return None
    return c


def for_device(meta: dict[str, str], device_key: str, gpu_name: str) -> Ceilings | None:
    return stored(meta, device_key) or known(gpu_name)


def measure(device: str = "cuda") -> Ceilings:
    """Measure copy bandwidth and the bf16 matmul rate of the live device with torch.

    Copy: y.copy_(x), bandwidth = 2 × bytes / time (read + write), as in hardware.md's method.
    GEMM: a @ b in bf16, square. Sizes are smaller on the CPU so the measurement stays short.
    """
    import torch

    gpu = device == "cuda"
    nbytes = (1 << 30) if gpu else (256 << 20)
    n = 8192 if gpu else 1024
    sync = torch.cuda.synchronize if gpu else (lambda: None)

    def best_of(fn, reps: int) -> float:
        fn()
        sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    def copy_time() -> float:  # the buffers are freed before the GEMM allocates
        x = torch.empty(nbytes, dtype=torch.uint8, device=device)
        y = torch.empty_like(x)
        return best_of(lambda: y.copy_(x), 10 if gpu else 5)

    t_copy = copy_time()
    a = torch.randn(n, n, device=device).to(torch.bfloat16)
    b = torch.randn(n, n, device=device).to(torch.bfloat16)
    t_mm = best_of(lambda: a @ b, 10 if gpu else 3)
    bw = 2 * nbytes / t_copy / 1e9
    tf = 2 * n ** 3 / t_mm / 1e12
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    src = (f"measured on this device {when} by `autotune report --measure-ceilings`: copy of "
           f"{nbytes >> 20} MiB (best of reps, 2×bytes/time), bf16 matmul {n}³ (torch {torch.__version__})")
    return Ceilings(bw, {"bf16": tf}, src, True)


def store_measured(store, device_key: str, c: Ceilings) -> None:
    store.put_meta(META_PREFIX + device_key,
                   json.dumps({"bandwidth_gbs": c.bandwidth_gbs, "tflops": c.tflops, "source": c.source}))
