"""The cuda family's prepacked layout, in plain PyTorch on the CPU: the inverse restores the
checkpoint bit for bit, and the kernel's bit-operation decode (emulated) equals formats'
dequantization exactly, on every e2m1 code and every e4m3 scale the layout accepts."""
import pytest
import torch

from autotune.core.formats import FP4Weight, quantize
from autotune.tactics.cuda import layout as L


def _random_weight(n: int, k: int, seed: int) -> FP4Weight:
    """Every byte value for the elements, every accepted scale byte (subnormals included)."""
    g = torch.Generator().manual_seed(seed)
    packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    scales = torch.randint(1, 0x7F, (n, k // 16), dtype=torch.uint8, generator=g)
    return FP4Weight(packed, scales.view(torch.float8_e4m3fn), torch.tensor(0.37), "nvfp4")


@pytest.mark.parametrize("n,k,seed", [(16, 128, 0), (48, 384, 1), (128, 1024, 2)])
def test_inverse_restores_bit_for_bit(n, k, seed):
    w = _random_weight(n, k, seed)
    p = L.pack(w)
    assert p.packed.shape == w.packed.shape and p.scales.shape == w.scales.shape   # same bytes
    assert not torch.equal(p.packed, w.packed)                                      # really permuted
    back = L.unpack(p)
    assert torch.equal(back.packed, w.packed)
    assert torch.equal(back.scales.view(torch.uint8), w.scales.view(torch.uint8))
    assert torch.equal(back.global_scale, w.global_scale)


@pytest.mark.parametrize("n,k,seed", [(16, 128, 3), (64, 512, 4)])
def test_emulated_decode_equals_formats(n, k, seed):
    w = _random_weight(n, k, seed)
    assert torch.equal(L.emulate_dequantize(L.pack(w)), w.dequantize(torch.float32))


def test_quantized_weight_and_inplace():
    w = quantize(torch.randn(96, 768, generator=torch.Generator().manual_seed(5)))
    ref = w.dequantize()
    src_ptr = w.packed.data_ptr()
    p = L.pack(w, inplace=True)
    assert p.packed.data_ptr() == src_ptr                   # one copy: the checkpoint bytes are replaced
    assert torch.equal(L.emulate_dequantize(p), ref)
    assert torch.equal(L.unpack(p).dequantize(), ref)


def test_scale_codes_cover_all_positive_e4m3():
    b = torch.arange(1, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn)
    u = L.encode_scales(b)
    assert len(set(u.tolist())) == 0x7E                      # injective
    assert torch.equal(L.decode_scales(u).view(torch.uint8), b.view(torch.uint8))
    # the kernel's bf16 pair lane (u << 4 | 0x4000) is the scale times 2^16, exactly
    lane = (u.long() * 16 + 0x4000).to(torch.int16).view(torch.bfloat16).float()
    assert torch.equal(lane, b.float() * 2.0 ** 16)


@pytest.mark.parametrize("bad", [0x00, 0x7F, 0x80, 0xB8])
def test_refuses_scales_the_kernel_cannot_decode(bad):
    w = _random_weight(16, 128, 6)
    w.scales.view(torch.uint8)[3, 1] = bad
    with pytest.raises(ValueError, match="zero, negative or NaN"):
        L.pack(w)


def test_refuses_shapes_and_formats():
    with pytest.raises(ValueError, match="multiple of 128"):
        L.pack(_random_weight(16, 64, 7))
    with pytest.raises(ValueError, match="not in place"):          # MXFP4: into new storage only
        L.pack(quantize(torch.randn(16, 128), "mxfp4"), inplace=True)
    with pytest.raises(ValueError, match="nvfp4"):
        L.pack(quantize(torch.randn(2, 16, 128), "mxfp4"))             # stacked: pack_experts


def test_two_d_mxfp4_round_trip_and_decode():
    """A 2-D MXFP4 weight (the dense kernel's MXFP4 form) packs as one stacked expert's layout:
    unpack restores it bit for bit, the kernel's decode equals dequantize exactly."""
    w = quantize(torch.randn(32, 256) * torch.logspace(-3, 2, 32)[:, None], "mxfp4")
    p = L.pack(w)
    assert (p.fmt, p.experts, tuple(p.scales.shape)) == ("mxfp4", 0, (32, 8)) and p.scales.numel() == w.scales.numel()
    back = L.unpack(p)
    assert torch.equal(back.packed, w.packed) and torch.equal(back.scales.view(torch.uint8), w.scales.view(torch.uint8))
    assert torch.equal(L.emulate_dequantize_any(p), w.dequantize())
