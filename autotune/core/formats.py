"""FP4 weight formats: E2M1 elements, NVFP4 / MXFP4 block scales, packing, scale layouts.

ModelOpt checkpoint I/O lives in autotune.core.modelopt.

Conventions (see docs in shared/reference/nvfp4-format.md):

* E2M1 code = 4-bit index into :data:`E2M1_VALUES` (bit 3 = sign).
* Packing is along K (the contiguous / reduction dim): byte j holds element 2j in the low nibble
  and element 2j+1 in the high nibble, so ``[..., N, K]`` codes become uint8 ``[..., N, K/2]``.
* NVFP4: one float8_e4m3fn scale per 16 elements plus an fp32 per-tensor ``global_scale``
  (ModelOpt's ``weight_scale_2``) that multiplies on dequantization.
* MXFP4: one E8M0 scale (uint8, value ``2**(s-127)``) per 32 elements; ``global_scale`` is 1.0.
* Scales are stored in the *linear* layout ``[..., N, K/block]``; :func:`swizzle_128x4` produces
  the 128x4 tiled layout that CUTLASS / cuBLASLt / FlashInfer kernels read.

Everything accepts leading dims (stacked MoE experts ``[E, N, K]``) and works on CPU or CUDA.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Union

import torch
from torch import Tensor

__all__ = [
    "E2M1_VALUES", "E2M1_MAX", "E4M3_MAX", "E8M0_BIAS", "FORMATS", "FP4Format", "FP4Weight",
    "encode_e2m1", "decode_e2m1", "pack_fp4", "unpack_fp4", "decode_e8m0",
    "quantize", "quantize_activation_nvfp4",
    "swizzle_128x4", "unswizzle_128x4", "swizzled_size_128x4",
]

FmtName = Literal["nvfp4", "mxfp4"]

#: E2M1 value of each 4-bit code (index = code); code 8 is -0.
E2M1_VALUES: tuple[float, ...] = (
    0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
E8M0_BIAS = 127
#: smallest positive float8_e4m3fn (subnormal); ModelOpt clamps block scales to it so they never hit 0
_E4M3_MIN = 2.0 ** -9

# ModelOpt `_cast_fp4` decision bounds; a value exactly on a bound in _TIE_UP rounds up
# (to the even-mantissa neighbour), on any other bound it rounds down (also even).
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (0.75, 1.75, 3.5)


@dataclass(frozen=True)
class FP4Format:
    """Static description of one FP4 block format."""

    name: str
    block: int  # elements per scale, along K
    scale_dtype: torch.dtype  # storage dtype of the linear block scales
    scale_kind: str  # "e4m3" or "e8m0"


FORMATS: dict[str, FP4Format] = {
    "nvfp4": FP4Format("nvfp4", 16, torch.float8_e4m3fn, "e4m3"),
    "mxfp4": FP4Format("mxfp4", 32, torch.uint8, "e8m0"),
}


def _format(fmt: str) -> FP4Format:
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown FP4 format {fmt!r}; expected one of {sorted(FORMATS)}") from None


# --------------------------------------------------------------------------- elements


def _table(values, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def encode_e2m1(x: Tensor) -> Tensor:
    """Round ``x`` (any float dtype) to E2M1 codes, bit-compatible with ModelOpt ``_cast_fp4``.

    Bounds ``[0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5]``, ties to the even mantissa, saturation to
    ±6, sign kept (so small negatives become code 8 = -0; ``-0.0`` itself gives code 0).
    NaN saturates to ±6 like ModelOpt; callers that care must reject it first.
    Returns uint8 codes of the same shape.
    """
    if not x.is_floating_point():
        raise TypeError(f"encode_e2m1 expects a floating tensor, got {x.dtype}")
    xf = x.float()  # exact for bf16/fp16; all decisions are made in fp32
    a = xf.abs()
    bounds = _table(_E2M1_BOUNDS, a.device)
    mag = torch.searchsorted(bounds, a.contiguous(), right=False)  # ties land on the lower code
    tie_up = torch.isin(a, _table(_TIE_UP, a.device))
    mag = mag + tie_up.to(mag.dtype)
    sign = (xf < 0).to(torch.uint8) << 3
    return mag.to(torch.uint8) | sign


def decode_e2m1(codes: Tensor) -> Tensor:
    """E2M1 codes (uint8; only the low 4 bits are read) to float32 values."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"decode_e2m1 expects uint8 codes, got {codes.dtype}")
    table = _table(E2M1_VALUES, codes.device)
    # masking instead of a bounds check: an out-of-range index is a device assert on CUDA
    return table[(codes & 0x0F).long()]


def pack_fp4(codes: Tensor) -> Tensor:
    """Pack codes ``[..., K]`` into uint8 ``[..., K/2]``: element 2i low nibble, 2i+1 high nibble."""
    if codes.dtype != torch.uint8:
        raise TypeError(f"pack_fp4 expects uint8 codes, got {codes.dtype}")
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last dim, got shape {tuple(codes.shape)}")
    c = codes & 0x0F
    return (c[..., 1::2] << 4) | c[..., 0::2]


def unpack_fp4(packed: Tensor) -> Tensor:
    """Inverse of :func:`pack_fp4`: uint8 ``[..., K/2]`` to codes ``[..., K]``."""
    if packed.dtype != torch.uint8:
        raise TypeError(f"unpack_fp4 expects uint8, got {packed.dtype}")
    out = torch.stack((packed & 0x0F, packed >> 4), dim=-1)
    return out.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def decode_e8m0(s: Tensor) -> Tensor:
    """E8M0 bytes to float32 ``2**(s-127)`` (0xFF = NaN). Exact, including 2**-127 (subnormal)."""
    if s.dtype != torch.uint8:
        raise TypeError(f"decode_e8m0 expects uint8, got {s.dtype}")
    # table built in float64 via ldexp so every power of two is exact before the fp32 cast
    exps = torch.arange(256, dtype=torch.float64, device=s.device) - E8M0_BIAS
    table = torch.ldexp(torch.ones_like(exps), exps.long()).float()
    table[255] = float("nan")
    return table[s.long()]


_LUTS: dict = {}


def _lut(kind: str, device: torch.device) -> Tensor:
    """256-entry float32 tables: 'pair' (packed byte → [low, high] values), 'nvfp4' (e4m3
    byte → value), 'mxfp4' (e8m0 byte → 2^(e-127))."""
    key = (kind, str(device))
    t = _LUTS.get(key)
    if t is None:
        b = torch.arange(256, dtype=torch.uint8)
        if kind == "pair":
            t = torch.stack((decode_e2m1(b & 0x0F), decode_e2m1(b >> 4)), dim=-1)
        elif kind == "nvfp4":
            t = b.view(torch.float8_e4m3fn).float()
        else:
            t = decode_e8m0(b)
        t = _LUTS[key] = t.to(device)
    return t


def _scales_to_float(scales: Tensor, fmt: str) -> Tensor:
    return decode_e8m0(scales) if fmt == "mxfp4" else scales.float()


# --------------------------------------------------------------------------- FP4Weight

#: set on a weight's `packed` tensor once a one-copy layer (autotune.runtime.bound) overwrote the
#: checkpoint bytes in place with a family's layout; the value is that layout's name. The bytes
#: are then no checkpoint-layout weight: `check_weight`, `dequantize` and `to` see the mark.
HELD_LAYOUT = "fp4_autotune_held_layout"


def held_layout(t: Tensor) -> str | None:
    """The layout written in place over `t` (None: the checkpoint's bytes)."""
    return getattr(t, HELD_LAYOUT, None)


def refuse_held(w: "FP4Weight", what: str) -> None:
    lay = held_layout(w.packed)
    if lay is not None:
        raise ValueError(f"{what}: the weight's bytes were overwritten in place by the {lay} layout "
                         f"(a one-copy layer), they are not a checkpoint-layout FP4Weight any more")


@dataclass(eq=False, repr=False)
class FP4Weight:
    """A quantized FP4 weight ``W[..., N, K]`` (leading dims = stacked experts).

    Attributes:
        packed: uint8 ``[..., N, K/2]``, two E2M1 codes per byte (even k in the low nibble).
        scales: linear block scales ``[..., N, K/block]``; float8_e4m3fn (nvfp4) or uint8 E8M0 (mxfp4).
        global_scale: fp32, shape ``()`` or the leading dims (one per expert); multiplies on
            dequantization like ModelOpt's ``weight_scale_2``. 1.0 for mxfp4.
        fmt: ``"nvfp4"`` or ``"mxfp4"``.
        input_scale: optional fp32 scalar (or one per leading index: per expert), the static
            activation global scale for W4A4.
    """

    packed: Tensor
    scales: Tensor
    global_scale: Tensor
    fmt: FmtName = "nvfp4"
    input_scale: Optional[Tensor] = None

    def __post_init__(self) -> None:
        spec = _format(self.fmt)
        p, s, g = self.packed, self.scales, self.global_scale
        if not isinstance(p, Tensor) or p.dtype != torch.uint8:
            raise ValueError(f"packed must be a uint8 tensor, got {getattr(p, 'dtype', type(p))}")
        if p.ndim < 2:
            raise ValueError(f"packed must be [..., N, K/2], got shape {tuple(p.shape)}")
        k = p.shape[-1] * 2
        if k == 0 or k % spec.block:
            raise ValueError(f"K={k} is not a multiple of the {self.fmt} block ({spec.block})")
        if not isinstance(s, Tensor) or s.dtype != spec.scale_dtype:
            raise ValueError(f"{self.fmt} scales must be {spec.scale_dtype}, got {getattr(s, 'dtype', type(s))}")
        want = (*p.shape[:-1], k // spec.block)
        if tuple(s.shape) != want:
            raise ValueError(f"scales shape {tuple(s.shape)} does not match packed {tuple(p.shape)}: "
                             f"expected {want} (K={k}, block {spec.block})")
        if not isinstance(g, Tensor) or g.dtype != torch.float32:
            raise ValueError(f"global_scale must be a float32 tensor, got {getattr(g, 'dtype', type(g))}")
        if g.ndim != 0 and tuple(g.shape) != tuple(p.shape[:-2]):
            raise ValueError(f"global_scale shape {tuple(g.shape)} must be () or the leading dims "
                             f"{tuple(p.shape[:-2])}")
        if self.input_scale is not None:
            i = self.input_scale
            # per expert for stacked experts (W4A4 MoE: each expert's static activation scale)
            if not isinstance(i, Tensor) or i.dtype != torch.float32 or (
                    i.ndim != 0 and tuple(i.shape) != tuple(p.shape[:-2])):
                raise ValueError(f"input_scale must be a float32 scalar tensor (or one per expert, "
                                 f"{tuple(p.shape[:-2])}), got {getattr(i, 'dtype', type(i))} "
                                 f"{tuple(getattr(i, 'shape', ()))}")
        devs = {t.device for t in (p, s, g, self.input_scale) if t is not None}
        if len(devs) > 1:
            raise ValueError(f"all FP4Weight tensors must be on one device, got {sorted(map(str, devs))}")

    def __repr__(self) -> str:
        return (f"FP4Weight(fmt={self.fmt!r}, shape={self.shape}, device={self.packed.device}, "
                f"global_scale={tuple(self.global_scale.shape)}, input_scale={self.input_scale is not None})")

    @property
    def n(self) -> int:
        return self.packed.shape[-2]

    @property
    def k(self) -> int:
        return self.packed.shape[-1] * 2

    @property
    def block(self) -> int:
        return FORMATS[self.fmt].block

    @property
    def num_experts(self) -> Optional[int]:
        """None for a plain ``[N, K]`` weight; else the product of the leading dims."""
        lead = self.packed.shape[:-2]
        return math.prod(lead) if lead else None

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical (unpacked) shape ``(..., N, K)``."""
        return (*self.packed.shape[:-1], self.k)

    @property
    def device(self) -> torch.device:
        return self.packed.device

    @property
    def nbytes(self) -> int:
        """Bytes of packed elements + scales + global scale (what a kernel reads)."""
        return self.packed.nbytes + self.scales.nbytes + self.global_scale.nbytes

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Dense ``[..., N, K]``: e2m1 × block scale × global scale, in float32, then cast.

        Both lookups go through 256-entry tables (byte → two values, scale byte → float): on
        the CPU that is several times faster than unpacking nibbles and converting fp8.
        """
        refuse_held(self, "dequantize")
        pair = _lut("pair", self.packed.device)
        vals = pair.index_select(0, self.packed.reshape(-1).int()).view(*self.scales.shape, self.block)
        sbytes = self.scales.reshape(-1).view(torch.uint8).int()
        sc = _lut(self.fmt, self.packed.device).index_select(0, sbytes).view(self.scales.shape)
        vals = vals * sc[..., None]
        g = self.global_scale
        g = g.reshape(*g.shape, 1, 1, 1) if g.ndim else g
        return (vals * g).reshape(self.shape).to(dtype)

    def to(self, device: Union[str, torch.device]) -> "FP4Weight":
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        out = FP4Weight(mv(self.packed), mv(self.scales), mv(self.global_scale), self.fmt, mv(self.input_scale))
        lay = held_layout(self.packed)
        if lay is not None:                     # the moved bytes hold the same layout: keep the mark
            setattr(out.packed, HELD_LAYOUT, lay)
        return out

    def expert(self, e: int) -> "FP4Weight":
        """2-D view of expert ``e`` (leading dims flattened, row-major)."""
        ne = self.num_experts
        if ne is None:
            raise ValueError("expert() needs a stacked weight [E, N, K/2]; this one is 2-D")
        if not 0 <= e < ne:          # no negative indexing: -1 is "no expert" in routing
            raise IndexError(f"expert {e} out of range for {ne} experts")
        flat = lambda t: t.reshape(ne, *t.shape[-2:])[e]  # noqa: E731
        g = self.global_scale.reshape(ne)[e] if self.global_scale.ndim else self.global_scale
        i = self.input_scale
        if i is not None and i.ndim:
            i = i.reshape(ne)[e]
        return FP4Weight(flat(self.packed), flat(self.scales), g, self.fmt, i)

    def contiguous(self) -> "FP4Weight":
        """The same weight with contiguous tensors (views of the source when it already is)."""
        c = lambda t: None if t is None else t.contiguous()  # noqa: E731
        return FP4Weight(c(self.packed), c(self.scales), c(self.global_scale), self.fmt, c(self.input_scale))

    def swizzled_scales(self) -> Tensor:
        """Block scales in the 128x4 layout, uint8 ``[..., round_up(N,128) * round_up(K/block,4)]``."""
        return swizzle_128x4(self.scales)


# --------------------------------------------------------------------------- quantization


def _check_dense(weight: Tensor, fmt: str) -> FP4Format:
    spec = _format(fmt)
    if not isinstance(weight, Tensor) or not weight.is_floating_point():
        raise TypeError(f"quantize expects a floating tensor, got {getattr(weight, 'dtype', type(weight))}")
    if weight.ndim < 2:
        raise ValueError(f"quantize expects [N, K] or [E, N, K], got shape {tuple(weight.shape)}")
    k = weight.shape[-1]
    if k == 0 or k % spec.block:
        raise ValueError(f"K={k} is not a multiple of the {fmt} block ({spec.block})")
    return spec


def _nvfp4_block_scales(xb: Tensor, gs: Tensor) -> Tensor:
    """ModelOpt block scale for blocks ``xb[..., nb, 16]`` under global scale ``gs`` (broadcastable)."""
    amax = xb.abs().amax(dim=-1)
    s = amax / (E2M1_MAX * gs)
    s = torch.where(amax == 0, torch.ones_like(s), s)
    # upper clamp only matters with a caller-supplied global scale that is too small
    return s.clamp(min=_E4M3_MIN, max=E4M3_MAX).to(torch.float8_e4m3fn)


def _e8m0_block_scales(amax: Tensor) -> Tensor:
    """MXFP4 exponent ``e = ceil(max(log2(amax/6), -127))`` stored as ``e + 127`` (uint8).

    Computed exactly from frexp instead of fp32 log2 (which is what ModelOpt runs): with
    ``amax = m * 2**p``, ``m in [0.5, 1)``, the smallest e with ``6 * 2**e >= amax`` is ``p - 3`` if
    ``m <= 0.75`` else ``p - 2``. Same answer as ModelOpt except when amax is within an ulp or so
    above ``6 * 2**k`` (fp32 log2 rounds down to k there; the element then saturates at 6), and
    identical on CPU and CUDA, whose log2 and scalar division differ by an ulp.
    """
    m, p = torch.frexp(amax)
    e = p.to(torch.int32) - 2 - (m <= 0.75).to(torch.int32)
    e = torch.where(amax > 0, e, torch.full_like(e, -E8M0_BIAS)).clamp(min=-E8M0_BIAS)
    return (e + E8M0_BIAS).to(torch.uint8)


def quantize(weight: Tensor, fmt: FmtName = "nvfp4",
             global_scale: Union[None, float, Tensor] = None) -> FP4Weight:
    """Quantize a dense ``[N, K]`` or ``[..., N, K]`` weight (any float dtype, CPU/CUDA) like ModelOpt.

    NVFP4: ``global_scale`` defaults to ``amax/(6*448)`` per tensor (per leading index for stacked
    experts); pass one (scalar or leading-dims shaped) to share it across fused shards. Block
    scale = ``amax(block)/(6*global)``, zero → 1.0, clamped to ``[2**-9, 448]``, cast to e4m3;
    elements = ``W/(scale*global)``. MXFP4: ``e = ceil(max(log2(amax(block)/6), -127))`` stored
    as ``e+127`` (computed exactly, see :func:`_e8m0_block_scales`), elements ``W/2**e``;
    ``global_scale`` must be None or 1.0. CPU and CUDA give bit-identical results.
    An all-zero tensor quantizes to zeros with global scale 1.0. Non-finite input raises ValueError.
    """
    spec = _check_dense(weight, fmt)
    x = weight.detach().float()
    lead, k = x.shape[:-2], x.shape[-1]
    xb = x.reshape(*x.shape[:-1], k // spec.block, spec.block)
    dev = x.device

    if fmt == "mxfp4":
        if global_scale is not None and not bool(torch.all(torch.as_tensor(global_scale) == 1.0)):
            raise ValueError(f"mxfp4 has no global scale; got global_scale={global_scale!r}")
        if x.numel() and not bool(torch.isfinite(x).all()):
            raise ValueError("quantize: weight contains inf/NaN")
        scales = _e8m0_block_scales(xb.abs().amax(dim=-1))
        codes = encode_e2m1(xb / decode_e8m0(scales)[..., None])
        gs = torch.ones((), dtype=torch.float32, device=dev)
    else:
        if global_scale is None:
            amax_t = x.abs().amax(dim=(-2, -1)) if x.numel() else torch.zeros(lead, device=dev)
            if not bool(torch.isfinite(amax_t).all()):
                raise ValueError("quantize: weight contains inf/NaN")
            # tensor divisor: CUDA turns division by a Python scalar into a reciprocal multiply,
            # which is 1 ulp off CPU and changes codes; true division keeps CPU == CUDA bit-exact
            gs = amax_t / torch.full_like(amax_t, E2M1_MAX * E4M3_MAX)
            # all-zero (or underflowing) tensor: any positive scale works, 1.0 keeps it NaN-free
            gs = torch.where(gs > 0, gs, torch.ones_like(gs))
        else:
            gs = torch.as_tensor(global_scale, dtype=torch.float32, device=dev).clone()
            if gs.ndim and tuple(gs.shape) != tuple(lead):
                raise ValueError(f"global_scale shape {tuple(gs.shape)} must be () or the leading dims {tuple(lead)}")
            if not bool(((gs > 0) & torch.isfinite(gs)).all()):
                raise ValueError(f"global_scale must be positive and finite, got {global_scale!r}")
            if x.numel() and not bool(torch.isfinite(x).all()):
                raise ValueError("quantize: weight contains inf/NaN")
        gb = gs.reshape(*gs.shape, 1, 1) if gs.ndim else gs  # broadcast over [N, nb]
        scales = _nvfp4_block_scales(xb, gb)
        codes = encode_e2m1(xb / (scales.float() * gb)[..., None])
    packed = pack_fp4(codes.reshape(x.shape))
    return FP4Weight(packed.contiguous(), scales.contiguous(), gs.float(), fmt)


def quantize_activation_nvfp4(x: Tensor, input_scale: Union[float, Tensor]) -> tuple[Tensor, Tensor]:
    """Dynamic NVFP4 quantization of activations ``x[..., K]`` under the static global ``input_scale``.

    Returns ``(packed uint8 [..., K/2], scales float8_e4m3fn [..., K/16])`` in the linear layout;
    ``x ≈ e2m1 × scale × input_scale``. Same scale rule as the weights (zero block → 1.0).
    """
    if not x.is_floating_point() or x.ndim < 1 or x.shape[-1] % 16:
        raise ValueError(f"K={x.shape[-1] if x.ndim else None} is not a multiple of the nvfp4 block (16) "
                         f"or x ({x.dtype}) is not floating")
    gs = torch.as_tensor(input_scale, dtype=torch.float32, device=x.device)
    xb = x.float().reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    scales = _nvfp4_block_scales(xb, gs)
    codes = encode_e2m1(xb / (scales.float() * gs)[..., None])
    return pack_fp4(codes.reshape(x.shape)), scales


# --------------------------------------------------------------------------- scale layouts


def _round_up(v: int, m: int) -> int:
    return (v + m - 1) // m * m


def swizzled_size_128x4(rows: int, cols: int) -> int:
    """Bytes of a 128x4-swizzled scale matrix: ``round_up(rows,128) * round_up(cols,4)``."""
    return _round_up(rows, 128) * _round_up(cols, 4)


def swizzle_128x4(scales: Tensor) -> Tensor:
    """Linear scales ``[..., rows, cols]`` (uint8 or fp8) → 128x4 layout, flat uint8 ``[..., R*C]``.

    ``R = round_up(rows, 128)``, ``C = round_up(cols, 4)``; padding is zero bytes. Each leading
    index gets its own flat buffer (the per-expert layout engines use for stacked MoE scales).
    Byte of ``(r, c)`` sits at ``(r//128)*(C//4)*512 + (c//4)*512 + (r%32)*16 + ((r%128)//32)*4 + c%4``.
    """
    if scales.ndim < 2:
        raise ValueError(f"swizzle_128x4 needs [..., rows, cols], got shape {tuple(scales.shape)}")
    if scales.element_size() != 1:
        raise ValueError(f"swizzle_128x4 needs 1-byte scales, got {scales.dtype}")
    s = scales.view(torch.uint8) if scales.dtype != torch.uint8 else scales
    *lead, rows, cols = s.shape
    R, C = _round_up(rows, 128), _round_up(cols, 4)
    if (R, C) != (rows, cols):
        s = torch.nn.functional.pad(s, (0, C - cols, 0, R - rows))
    nl = len(lead)
    t = s.reshape(*lead, R // 128, 4, 32, C // 4, 4)
    t = t.permute(*range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4)
    return t.contiguous().reshape(*lead, R * C)


def unswizzle_128x4(sw: Tensor, rows: int, cols: int, dtype: torch.dtype = torch.uint8) -> Tensor:
    """Inverse of :func:`swizzle_128x4`: flat ``[..., R*C]`` → linear ``[..., rows, cols]`` viewed as ``dtype``."""
    R, C = _round_up(rows, 128), _round_up(cols, 4)
    if sw.ndim < 1 or sw.shape[-1] != R * C:
        raise ValueError(f"swizzled scales last dim {sw.shape[-1] if sw.ndim else None} != "
                         f"{R * C} = round_up({rows},128)*round_up({cols},4)")
    s = sw.view(torch.uint8) if sw.dtype != torch.uint8 else sw
    lead = s.shape[:-1]
    nl = len(lead)
    t = s.reshape(*lead, R // 128, C // 4, 32, 4, 4)
    t = t.permute(*range(nl), nl, nl + 3, nl + 2, nl + 1, nl + 4)  # back to (rb, r4, r32, cb, c4)
    out = t.reshape(*lead, R, C)[..., :rows, :cols].contiguous()
    return out.view(dtype) if dtype != torch.uint8 else out
