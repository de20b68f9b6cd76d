"""The `cuda` family's weight layout: NVFP4 bytes and block scales permuted once at load so that
each thread's 32-bit word is exactly its `mma.sync.m16n8k16` A fragment (the weight is the MMA's
A operand, the activations its B operand: y^T = W x^T, so M <= 8 fills one n8 tile).

Why this shape (docs/cuda-family.md has the derivation):

* **K order inside a 64-wide k-group.** Thread (g = lane/4, t = lane%4) holds, at mma step s (0..3),
  the k slots {2t, 2t+1, 2t+8, 2t+9}; we let those slots mean k = 16t + 4s + {0, 1, 2, 3}. Both
  operands use the same map, so the product is unchanged, and then a thread's 16 k values over the
  4 steps are one NVFP4 block (16t..16t+15): one scale per row per 4 MMAs, and its activations are
  32 contiguous bytes (two 16-byte loads).
* **Bits inside a word.** The 8 nibbles of one A fragment (rows g and g+8, 4 k each) are stored so
  that a rotate and one AND mask put each nibble's sign at bf16 bit 15 and its three exponent /
  mantissa bits at bf16 bits 8..6 (`ROTATIONS`; the value is then e2m1 * 2^-126 exactly, 0.5 a
  subnormal). Three registers are one rotate + AND each (one needs no rotate); no placement tiles
  the fourth (searched), so it takes two rotates and two ANDs: 9 logic ops per 8 elements.
* **Scales.** e4m3 block scales are re-coded to an 8-bit unsigned e5m3 (`u`, bias 15) so that
  `u * 0x00100010 + 0x40004000` (one IMAD after one PRMT) is the bf16x2 pair (s*2^16, s*2^16) with no
  subnormal case; the product e2m1 * s * 2^-110 is exact in bf16 (<= 6 significant bits), the
  epilogue multiplies by global_scale * 2^110. Zero, negative and NaN scales (ModelOpt never
  writes them: zero blocks get 1.0, scales are clamped to >= 2^-9) are refused at pack time.

The layout has the checkpoint's byte counts (N*K/2 element bytes, N*K/16 scale bytes) and
`unpack` restores the checkpoint bit for bit; `pack(..., inplace=True)` writes it over the
weight's own storage, so a layer keeps one copy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from autotune.core.formats import FP4Weight, pack_fp4, refuse_held, unpack_fp4

LAYOUT = "cuda-mma-a-frag-v1"
ROWS = 16          # weight rows per MMA tile (the A operand's m16)
KGROUP = 64        # k per thread-word group of 4 MMA steps
KPAIR = 128        # k per scale word (two k-groups): the pipeline's unit
EPI_SHIFT = 110    # the epilogue multiplies by global_scale * 2^EPI_SHIFT
MASK = 0x81C081C0  # bf16x2 sign (15, 31) and exponent-low/mantissa-high bits (6..8, 22..24)
#: per register: [(rotate-right amount, mask of target bits taken from that rotation)]
ROTATIONS: tuple[tuple[tuple[int, int], ...], ...] = (
    ((0, MASK),),
    ((4, MASK),),
    ((10, MASK),),
    ((14, 0x80C080C0), (6, 0x01000100)),
)


def _bitpos() -> torch.Tensor:
    """[reg 4][lane 2][nibble bit 4] -> stored bit position in the word."""
    pos = torch.empty(4, 2, 4, dtype=torch.int64)
    for r, parts in enumerate(ROTATIONS):
        for lane in range(2):
            for b in range(4):
                target = (15 if b == 3 else 6 + b) + 16 * lane
                rot = next(d for d, m in parts if (m >> target) & 1)
                pos[r, lane, b] = (target + rot) % 32
    assert sorted(pos.flatten().tolist()) == list(range(32)), "bit placement is not a permutation"
    return pos


BITPOS = _bitpos()


# --------------------------------------------------------------------------- scales: e4m3 <-> u
def _scale_tables() -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 byte -> u code (-1: refused) and u code -> e4m3 byte (-1: unused)."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    enc = torch.full((256,), -1, dtype=torch.int64)
    dec = torch.full((256,), -1, dtype=torch.int64)
    for b in range(1, 0x7F):                       # positive, nonzero, finite
        m, e = torch.frexp(vals[b])                # v = m * 2^e, m in [0.5, 1)
        e5, f = int(e) - 1 + 15, int((m * 2 - 1) * 8)
        assert 1 <= e5 < 32 and (1 + f / 8) * 2.0 ** (e5 - 15) == float(vals[b])
        u = (e5 << 3) | f
        enc[b], dec[u] = u, b
    return enc, dec


_ENC, _DEC = _scale_tables()


def encode_scales(scales: torch.Tensor) -> torch.Tensor:
    """float8_e4m3fn block scales -> u codes (uint8); refuses what the kernel cannot decode."""
    b = scales.view(torch.uint8).long()
    u = _ENC.to(b.device)[b]
    if bool((u < 0).any()):
        bad = int(b[u < 0].flatten()[0])
        raise ValueError(f"cuda layout: block scale byte 0x{bad:02x} is zero, negative or NaN "
                         f"(ModelOpt never writes one); use another family for this weight")
    return u.to(torch.uint8)


def decode_scales(u: torch.Tensor) -> torch.Tensor:
    """u codes -> float8_e4m3fn, bit for bit the bytes encode_scales read."""
    return _DEC.to(u.device)[u.long()].to(torch.uint8).view(torch.float8_e4m3fn)


# --------------------------------------------------------------------------- the packed weight
@dataclass(frozen=True, eq=False)
class CudaPacked:
    """The layout: `packed` uint8 [N, K/2] (fragment words, raw), `scales` uint8 [N, K/16]
    (u codes, permuted), `global_scale` fp32 [1]. Shapes match the checkpoint's so the operand
    checks apply; the bytes are only meaningful to this family's kernel and `unpack`."""

    packed: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor
    fmt: str
    n: int
    k: int
    input_scale: Any = None
    layout: str = LAYOUT
    experts: int = 0       # stacked experts [E, N, K] (pack_experts); 0 for a 2-D weight


def check_shape(n: int, k: int) -> str | None:
    if n % ROWS:
        return f"N={n} is not a multiple of {ROWS}"
    if k % KPAIR:
        return f"K={k} is not a multiple of {KPAIR}"
    return None


def _word_order(codes: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Nibble codes [N, K] -> [N/16, K/64, 32 lanes, 4 steps, reg 4, lane 2]."""
    c = codes.reshape(n // ROWS, 2, 8, k // KGROUP, 4, 4, 2, 2)   # nt h g kg t s cpair clane
    c = c.permute(0, 3, 2, 4, 5, 6, 1, 7)                        # nt kg g t s cpair h clane
    return c.reshape(n // ROWS, k // KGROUP, 32, 4, 4, 2)         # reg = cpair*2 + h


def _scale_order(u: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """Scales [N, K/16] -> [N/16, K/128, 32 lanes, 4 bytes]; byte = kgroup parity * 2 + h."""
    s = u.reshape(n // ROWS, 2, 8, k // KPAIR, 2, 4)               # nt h g kp par t
    return s.permute(0, 3, 2, 5, 4, 1).reshape(n // ROWS, k // KPAIR, 32, 4)


def pack(w: FP4Weight, inplace: bool = False) -> CudaPacked:
    """The layout of a 2-D NVFP4 weight. inplace=True overwrites w's own packed/scales storage
    (the checkpoint layout is then gone; `unpack` brings it back). A 2-D MXFP4 weight is packed as
    one stacked expert (pack_experts' MXFP4 scale words), into new storage only."""
    refuse_held(w, "cuda layout pack")      # bytes packed in place already: packing again is garbage
    if w.fmt == "mxfp4" and w.packed.ndim == 2 and not inplace:
        one = pack_experts(FP4Weight(w.packed[None], w.scales[None], w.global_scale, w.fmt, w.input_scale))
        return CudaPacked(one.packed[0], one.scales[0], one.global_scale.reshape(1), w.fmt, w.n, w.k, w.input_scale)
    if w.fmt != "nvfp4" or w.packed.ndim != 2:
        raise ValueError(f"cuda layout takes a 2-D nvfp4 weight (or mxfp4, not in place), got {w.fmt} "
                         f"{tuple(w.packed.shape)}")
    n, k = w.n, w.k
    why = check_shape(n, k)
    if why:
        raise ValueError(f"cuda layout: {why}")
    u = _scale_order(encode_scales(w.scales), n, k).reshape(n, k // 16)
    nib = _word_order(unpack_fp4(w.packed), n, k).long()
    pos = BITPOS.to(nib.device)
    words = torch.zeros(nib.shape[:-2], dtype=torch.int64, device=nib.device)
    for b in range(4):
        words |= (((nib >> b) & 1) << pos[:, :, b]).sum(dim=(-2, -1))
    raw = words.to(torch.int32).contiguous().view(torch.uint8).reshape(n, k // 2)  # little-endian words
    g = w.global_scale.to(torch.float32).reshape(1).contiguous()
    if inplace:
        w.packed.copy_(raw)
        w.scales.view(torch.uint8).copy_(u)
        raw, u = w.packed, w.scales.view(torch.uint8)
    return CudaPacked(raw, u.contiguous(), g, "nvfp4", n, k, w.input_scale)


def wrap(w: FP4Weight) -> CudaPacked:
    """The layout over storage that holds it already (written by `pack(inplace=True)`, then moved
    with the layer): no packing. Only the shapes are checked; the bytes are taken as they are."""
    why = check_shape(w.n, w.k) if w.fmt == "nvfp4" and w.packed.ndim == 2 else "not a 2-D nvfp4 weight"
    if why:
        raise ValueError(f"cuda layout: {why}")
    g = w.global_scale.to(torch.float32).reshape(1).contiguous()
    return CudaPacked(w.packed, w.scales.view(torch.uint8), g, "nvfp4", w.n, w.k, w.input_scale)


def words(p: CudaPacked) -> torch.Tensor:
    """The fragment words, int32 [N/16, K/64, 32, 4]."""
    return p.packed.contiguous().view(torch.int32).reshape(p.n // ROWS, p.k // KGROUP, 32, 4)


def unpack(p: CudaPacked) -> FP4Weight:
    """The checkpoint layout back, bit for bit."""
    n, k = p.n, p.k
    if p.fmt != "nvfp4":                     # a 2-D MXFP4 pack is one stacked expert's layout
        return unpack_experts(CudaPacked(p.packed[None], p.scales[None], p.global_scale, p.fmt, n, k,
                                         p.input_scale, experts=1)).expert(0)
    w = words(p).long() & 0xFFFFFFFF
    pos = BITPOS.to(w.device)
    nib = torch.zeros(*w.shape, 4, 2, dtype=torch.int64, device=w.device)
    for b in range(4):
        nib |= ((w[..., None, None] >> pos[:, :, b]) & 1) << b
    c = nib.reshape(n // ROWS, k // KGROUP, 8, 4, 4, 2, 2, 2)       # nt kg g t s cpair h clane
    c = c.permute(0, 6, 2, 1, 3, 4, 5, 7).reshape(n, k).to(torch.uint8)
    s = p.scales.reshape(n // ROWS, k // KPAIR, 8, 4, 2, 2)        # nt kp g t par h
    s = s.permute(0, 5, 2, 1, 4, 3).reshape(n, k // 16)
    return FP4Weight(pack_fp4(c), decode_scales(s), p.global_scale.reshape(()).clone(), "nvfp4", p.input_scale)


def _decoded(p: CudaPacked) -> tuple[torch.Tensor, torch.Tensor]:
    """(the fragment words as int64, float32 [nt, kg, lane, step, reg, half]): the rotate/mask
    registers as bf16 bit patterns, e2m1 * 2^-126 exactly (the scale-free half of the decode)."""
    w = words(p).long() & 0xFFFFFFFF
    regs = []
    for parts in ROTATIONS:
        r = torch.zeros_like(w)
        for d, m in parts:
            r |= (((w >> d) | (w << (32 - d))) & 0xFFFFFFFF) & m
        regs.append(r)
    r = torch.stack(regs, dim=-1)                                   # nt kg lane s reg
    lanes = torch.stack((r & 0xFFFF, r >> 16), dim=-1)              # ... reg clane
    return w, lanes.to(torch.int16).view(torch.bfloat16).float()


def emulate_dequantize(p: CudaPacked) -> torch.Tensor:
    """float32 [N, K] computed the way the kernel does, in bit operations (rotate, mask, bf16
    bit patterns, the IMAD scale pair, one multiply per pair): the CPU check of the decode."""
    n, k = p.n, p.k
    w, vals = _decoded(p)
    sw = p.scales.reshape(n // ROWS, k // KPAIR, 32, 4).long()
    sval = (sw * 0x10 + 0x4000).to(torch.int16).view(torch.bfloat16).float()  # one lane of the IMAD: s * 2^16
    # byte par*2 + h of k-pair kp belongs to k-group 2*kp + par: -> [nt, kg, lane, h]
    sval = sval.reshape(n // ROWS, k // KPAIR, 32, 2, 2).permute(0, 1, 3, 2, 4)
    sval = sval.reshape(n // ROWS, k // KGROUP, 32, 2)
    reg_h = torch.tensor([0, 1, 0, 1], device=w.device)
    prod = (vals * sval[:, :, :, None, reg_h, None]).to(torch.bfloat16).float()  # the HMUL2
    alpha = p.global_scale.float() * 2.0 ** EPI_SHIFT                # the epilogue's multiplier
    c = prod.reshape(n // ROWS, k // KGROUP, 8, 4, 4, 2, 2, 2)       # nt kg g t s cpair h clane
    c = c.permute(0, 6, 2, 1, 3, 4, 5, 7).reshape(n, k)
    return c * alpha


# --------------------------------------------------------------------------- stacked experts, MXFP4
#: MXFP4 (E8M0 scales, 32 k per block): the scale byte b is kept as it is and decoded by one PRMT and
#: one IMAD, `b * 0x00800080 + 0x37003700` = the bf16x2 pair (2^(b-127) * 2^110) twice, so the product
#: with the e2m1 register (value * 2^-126) is value * scale * 2^-16, exact for b in MX_SCALE_RANGE
#: (the pair's exponent field b + 110 stays <= 254; the smallest product stays on bf16's grid); the
#: epilogue multiplies by global_scale * 2^MX_EPI_SHIFT. A thread's 16 k lie in one 32-k block, so
#: lanes t and t^1 read one scale word: [N/16][K/128][8 g][2 t/2][4 bytes] = the checkpoint's N*K/32 bytes.
MX_SCALE_MUL, MX_SCALE_ADD, MX_EPI_SHIFT = 0x80, 0x3700, 16
MX_SCALE_RANGE = (11, 144)
#: per format: (scale IMAD multiplier, bf16 addend per half, scale words per tile per k-pair, epilogue shift)
FORMAT = {"nvfp4": (0x10, 0x4000, 32, EPI_SHIFT), "mxfp4": (MX_SCALE_MUL, MX_SCALE_ADD, 16, MX_EPI_SHIFT)}


def encode_scales_mx(scales: torch.Tensor) -> torch.Tensor:
    """E8M0 bytes -> the kernel's scale bytes (the same bytes); refuses those it cannot decode exactly."""
    b = scales.view(torch.uint8)
    lo, hi = MX_SCALE_RANGE
    bad = (b < lo) | (b > hi)
    if bool(bad.any()):
        v = int(b[bad].flatten()[0])
        raise ValueError(f"cuda layout: MXFP4 scale byte {v} (2^{v - 127}) is outside the kernel's exact range "
                         f"[{lo}, {hi}] (2^{lo - 127} .. 2^{hi - 127}; 255 is NaN, 0 an all-zero block); "
                         "use another family for this weight")
    return b.contiguous()


def _scale_order_fmt(u: torch.Tensor, n: int, k: int, fmt: str) -> torch.Tensor:
    if fmt == "nvfp4":
        return _scale_order(u, n, k).reshape(n, k // 16)
    s = u.reshape(n // ROWS, 2, 8, k // KPAIR, 2, 2)               # nt h g kp par tb
    return s.permute(0, 3, 2, 5, 4, 1).reshape(n, k // 32)         # nt kp g tb par h


def _scale_unorder_fmt(s: torch.Tensor, n: int, k: int, fmt: str) -> torch.Tensor:
    if fmt == "nvfp4":
        s = s.reshape(n // ROWS, k // KPAIR, 8, 4, 2, 2)            # nt kp g t par h
        return s.permute(0, 5, 2, 1, 4, 3).reshape(n, k // 16)
    s = s.reshape(n // ROWS, k // KPAIR, 8, 2, 2, 2)                # nt kp g tb par h
    return s.permute(0, 5, 2, 1, 4, 3).reshape(n, k // 32)


def _words_of(packed2d: torch.Tensor, n: int, k: int) -> torch.Tensor:
    nib = _word_order(unpack_fp4(packed2d), n, k).long()
    pos = BITPOS.to(nib.device)
    words = torch.zeros(nib.shape[:-2], dtype=torch.int64, device=nib.device)
    for b in range(4):
        words |= (((nib >> b) & 1) << pos[:, :, b]).sum(dim=(-2, -1))
    return words.to(torch.int32).contiguous().view(torch.uint8).reshape(n, k // 2)


def pack_experts(w: FP4Weight) -> CudaPacked:
    """The layout of stacked experts [E, N, K] (NVFP4 or MXFP4), expert by expert: fragment words
    [E, N, K/2], scale bytes [E, N, K/block] (NVFP4: u codes, MXFP4: the E8M0 bytes), global scale
    fp32 [E] (one per expert) or [1]. The grouped kernel (moe_mma.cu) reads it."""
    refuse_held(w, "cuda layout pack")
    if w.fmt not in FORMAT or w.packed.ndim != 3:
        raise ValueError(f"cuda grouped layout takes stacked [E, N, K] nvfp4/mxfp4 experts, got {w.fmt} "
                         f"{tuple(w.packed.shape)}")
    e, n, k = w.packed.shape[0], w.n, w.k
    why = check_shape(n, k)
    if why:
        raise ValueError(f"cuda layout: {why}")
    blk = w.block
    enc = encode_scales if w.fmt == "nvfp4" else encode_scales_mx
    raw = torch.empty(e, n, k // 2, dtype=torch.uint8, device=w.packed.device)
    sc = torch.empty(e, n, k // blk, dtype=torch.uint8, device=w.packed.device)
    for i in range(e):               # one expert at a time: the int64 bit planes of all E would be GBs
        raw[i] = _words_of(w.packed[i], n, k)
        sc[i] = _scale_order_fmt(enc(w.scales[i]), n, k, w.fmt)
    g = w.global_scale.to(torch.float32).reshape(-1).contiguous()
    if g.numel() not in (1, e):
        raise ValueError(f"cuda layout: {g.numel()} global scales for {e} experts (want 1 or {e})")
    return CudaPacked(raw, sc, g, w.fmt, n, k, w.input_scale, experts=e)


def expert(p: CudaPacked, e: int) -> CudaPacked:
    """Expert e of a stacked pack, as a 2-D pack (views)."""
    g = p.global_scale[e if p.global_scale.numel() > 1 else 0].reshape(1)
    return CudaPacked(p.packed[e], p.scales[e], g, p.fmt, p.n, p.k, p.input_scale)


def unpack_experts(p: CudaPacked) -> FP4Weight:
    """Stacked experts back in the checkpoint layout, bit for bit."""
    n, k = p.n, p.k
    codes, scales = [], []
    for i in range(p.experts):
        w = words(expert(p, i)).long() & 0xFFFFFFFF
        pos = BITPOS.to(w.device)
        nib = torch.zeros(*w.shape, 4, 2, dtype=torch.int64, device=w.device)
        for b in range(4):
            nib |= ((w[..., None, None] >> pos[:, :, b]) & 1) << b
        c = nib.reshape(n // ROWS, k // KGROUP, 8, 4, 4, 2, 2, 2)
        codes.append(pack_fp4(c.permute(0, 6, 2, 1, 3, 4, 5, 7).reshape(n, k).to(torch.uint8)))
        s = _scale_unorder_fmt(p.scales[i], n, k, p.fmt)
        scales.append(decode_scales(s) if p.fmt == "nvfp4" else s.clone())
    g = p.global_scale.clone()
    g = g.reshape(()) if g.numel() == 1 and p.fmt == "mxfp4" else g.reshape(-1)
    if g.numel() == 1 and p.experts != 1:
        g = g.reshape(())
    return FP4Weight(torch.stack(codes), torch.stack(scales), g, p.fmt, p.input_scale)


def emulate_dequantize_any(p: CudaPacked) -> torch.Tensor:
    """emulate_dequantize for a 2-D pack of either format: float32 [N, K] the kernel's way (rotate,
    mask, the format's IMAD scale pair, one bf16 multiply per pair, the epilogue's multiplier)."""
    if p.fmt == "nvfp4":
        return emulate_dequantize(p)
    n, k = p.n, p.k
    mul, add, sw, shift = FORMAT[p.fmt]
    w, vals = _decoded(p)
    sw_ = p.scales.reshape(n // ROWS, k // KPAIR, sw, 4).long()
    lane_word = torch.arange(32, device=w.device) >> 1           # lanes t and t^1 read one word
    sw_ = sw_[:, :, lane_word]                                    # nt kp lane 4
    sval = (sw_ * mul + add).to(torch.int16).view(torch.bfloat16).float()
    sval = sval.reshape(n // ROWS, k // KPAIR, 32, 2, 2).permute(0, 1, 3, 2, 4)
    sval = sval.reshape(n // ROWS, k // KGROUP, 32, 2)
    reg_h = torch.tensor([0, 1, 0, 1], device=w.device)
    prod = (vals * sval[:, :, :, None, reg_h, None]).to(torch.bfloat16).float()
    alpha = p.global_scale.float() * 2.0 ** shift
    c = prod.reshape(n // ROWS, k // KGROUP, 8, 4, 4, 2, 2, 2)
    c = c.permute(0, 6, 2, 1, 3, 4, 5, 7).reshape(n, k)
    return c * alpha
