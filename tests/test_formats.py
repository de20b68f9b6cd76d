"""Tests for autotune.core.formats: E2M1 coding, packing, NVFP4/MXFP4 quantization, 128x4 swizzle, ModelOpt I/O."""
from __future__ import annotations

import math

import pytest
import torch

from autotune.core.formats import (
    E2M1_VALUES, FORMATS, FP4Weight, decode_e2m1, decode_e8m0, encode_e2m1, pack_fp4, quantize,
    quantize_activation_nvfp4, swizzle_128x4, swizzled_size_128x4, unpack_fp4, unswizzle_128x4,
)
from autotune.core.modelopt import from_modelopt, load_modelopt_safetensors, to_modelopt

POS = torch.tensor(E2M1_VALUES[:8])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _next_up(v: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(math.inf)).item()


def _next_down(v: float) -> float:
    return torch.nextafter(torch.tensor(v), torch.tensor(-math.inf)).item()


# ----------------------------------------------------------------------------- E2M1 elements


def test_every_code_round_trips():
    codes = torch.arange(16, dtype=torch.uint8)
    vals = decode_e2m1(codes)
    assert vals.dtype == torch.float32
    assert vals.tolist() == list(E2M1_VALUES)
    back = encode_e2m1(vals)
    nonneg_zero = codes != 8
    assert torch.equal(back[nonneg_zero], codes[nonneg_zero])
    assert back[8].item() in (0, 8)  # -0 may encode as either zero code
    assert decode_e2m1(back).tolist() == [abs(v) if v == 0 else v for v in E2M1_VALUES]


@pytest.mark.parametrize("x, expected", [
    (0.25, 0.0), (_next_up(0.25), 0.5), (0.75, 1.0), (_next_down(0.75), 0.5),
    (1.25, 1.0), (_next_up(1.25), 1.5), (1.75, 2.0), (_next_down(1.75), 1.5),
    (2.5, 2.0), (_next_up(2.5), 3.0), (3.5, 4.0), (_next_down(3.5), 3.0),
    (5.0, 4.0), (_next_up(5.0), 6.0), (0.1, 0.0), (1.1, 1.0), (2.9, 3.0), (4.4, 4.0),
])
def test_rounding_boundaries_and_ties(x, expected):
    got = decode_e2m1(encode_e2m1(torch.tensor([x, -x])))
    assert got.tolist() == [expected, -expected]


def test_encode_matches_nearest_ties_to_even_reference():
    # independent reference: nearest magnitude, ties to the even code (mantissa bit 0)
    x = torch.cat([torch.arange(-8, 8, 1 / 64), torch.randn(4000) * 3])
    a = x.abs()
    dist = (a[:, None] - POS[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    cand = (dist == best) & ((torch.arange(8) % 2 == 0) | (dist == best).sum(1, keepdim=True).eq(1))
    ref_mag = POS[cand.float().argmax(dim=1)]
    ref = torch.where(a > 6, torch.full_like(a, 6.0), ref_mag) * torch.sign(x)
    got = decode_e2m1(encode_e2m1(x))
    assert torch.equal(got, ref)


def test_saturation_and_sign():
    x = torch.tensor([6.0, 6.5, 7.0, 100.0, 3e38, math.inf, -6.5, -1e9, -math.inf])
    codes = encode_e2m1(x)
    assert codes.tolist() == [7, 7, 7, 7, 7, 7, 15, 15, 15]
    small_neg = encode_e2m1(torch.tensor([-0.1]))
    assert decode_e2m1(small_neg).item() == 0.0


def test_encode_accepts_half_inputs():
    x = torch.tensor([0.75, 2.5, -3.5, 5.0, 9.0])
    for dt in (torch.bfloat16, torch.float16):
        assert torch.equal(encode_e2m1(x.to(dt)), encode_e2m1(x))


def test_nibble_order_hand_computed():
    codes = torch.tensor([0x1, 0x2, 0x7, 0xF, 0x3, 0x0], dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.tolist() == [0x21, 0xF7, 0x03]  # element 0 in the LOW nibble of byte 0
    assert torch.equal(unpack_fp4(packed), codes)
    # same check through quantize: amax 6 gives global 6/2688 = 1/448 and block scale 448,
    # so the elements are stored unscaled: [6, -0.5, 1, 0, ...] -> codes [7, 9, 2, 0, ...]
    w = torch.zeros(1, 16)
    w[0, :3] = torch.tensor([6.0, -0.5, 1.0])
    q = quantize(w)
    assert q.packed[0, :2].tolist() == [0x97, 0x02]
    assert q.scales.float()[0, 0].item() == 448.0
    assert q.global_scale.item() == pytest.approx(1 / 448, rel=1e-7)


def test_pack_unpack_random_and_odd_length():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (3, 5, 64), generator=g, dtype=torch.uint8)
    packed = pack_fp4(codes)
    assert packed.shape == (3, 5, 32)
    assert torch.equal(unpack_fp4(packed), codes)
    with pytest.raises(ValueError):
        pack_fp4(torch.zeros(3, dtype=torch.uint8))


def test_decode_e8m0():
    s = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    v = decode_e8m0(s)
    assert v[:6].tolist() == [2.0 ** -127, 2.0 ** -126, 0.5, 1.0, 2.0, 2.0 ** 127]
    assert math.isnan(v[6].item())


# ----------------------------------------------------------------------------- quantize / dequantize

# measured on this data (seed 0, 256x1024 N(0,1)): nvfp4 0.0953, mxfp4 0.1156
@pytest.mark.parametrize("fmt, bound", [("nvfp4", 0.105), ("mxfp4", 0.127)])
def test_quantize_error_bound_random_normal(fmt, bound):
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    q = quantize(w, fmt)
    d = q.dequantize()
    assert d.shape == w.shape and d.dtype == torch.float32
    err = _rel(d, w)
    assert 0.05 < err < bound, err  # lower bound: quantization really happened


def _representable_nvfp4(g: torch.Generator, n: int, k: int, gs: float) -> torch.Tensor:
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    codes[:, ::16] = 7  # every block's amax is exactly 6 * block_scale
    e4m3 = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # positive finite
    e4m3 = e4m3[e4m3 >= 2 ** -6]  # normal range: e2m1 x scale stays exact in fp32 and e4m3
    bs = e4m3[torch.randint(0, len(e4m3), (n, k // 16), generator=g)]
    bs[0, 0] = 448.0  # the tensor amax is then 6 * 448 * gs -> weight_scale_2 == gs exactly
    return decode_e2m1(codes) * bs.repeat_interleave(16, dim=1) * gs


def test_exact_on_representable_nvfp4():
    w = _representable_nvfp4(torch.Generator().manual_seed(2), 32, 64, 2.0 ** -10)
    q = quantize(w)
    assert q.global_scale.item() == 2.0 ** -10
    assert torch.equal(q.dequantize(), w)


def test_exact_on_representable_mxfp4():
    g = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (32, 128), generator=g, dtype=torch.uint8)
    codes[:, ::32] = 15  # amax exactly 6 * 2^e in every block
    e = torch.randint(-20, 20, (32, 4), generator=g).float()
    w = decode_e2m1(codes) * torch.exp2(e).repeat_interleave(32, dim=1)
    q = quantize(w, "mxfp4")
    assert torch.equal(q.scales, (e + 127).to(torch.uint8))
    assert torch.equal(q.dequantize(), w)
    assert torch.equal(unpack_fp4(q.packed) & 0x7, codes & 0x7)


def test_mxfp4_scale_rule():
    # one block per row, amax a, e = ceil(log2(a / 6))
    amaxes = [6.0, 7.0, 3.0, 0.75, 12.0, 1e-3]
    w = torch.zeros(len(amaxes) + 1, 64)
    w[:-1, 5] = torch.tensor(amaxes)
    w[-1, 0] = 1e-39  # fp32 subnormal: log2(amax/6) < -127, so the exponent clamps to -127
    q = quantize(w, "mxfp4")
    want = [127 + math.ceil(math.log2(a / 6)) for a in amaxes]
    assert q.scales[:, 0].tolist() == want + [0]
    assert torch.all(q.scales[:, 1] == 0)  # zero blocks: exponent -127, stored 0
    # the ceil keeps the scaled block amax within ±6, so nothing is clipped by saturation
    assert torch.all(torch.tensor(amaxes) / decode_e8m0(q.scales[:-1, 0]) <= 6.0)
    assert q.dequantize()[:-1, 5].tolist() == [6.0, 8.0, 3.0, 0.75, 12.0, 2.0 ** -10]


def test_mxfp4_exponent_matches_float64_log2():
    g = torch.Generator().manual_seed(12)
    amax = torch.exp2(torch.rand(2000, generator=g, dtype=torch.float64) * 240 - 120).float()
    amax = torch.cat([amax, 6 * torch.exp2(torch.arange(-120.0, 120.0))])  # exact powers: no rounding up
    w = torch.zeros(len(amax), 32)
    w[:, 7] = amax
    want = torch.ceil(torch.log2(amax.double() / 6)).clamp(min=-127) + 127
    assert torch.equal(quantize(w, "mxfp4").scales[:, 0].long(), want.long())


def test_nvfp4_block_scale_rule():
    w = torch.zeros(3, 32)
    w[0, 0] = 2688.0  # tensor amax -> weight_scale_2 = 1
    w[1, :16] = 1e-4  # tiny block: scale clamps to 2^-9 (smallest e4m3)
    w[2, :16] = 3.0  # scale 0.5
    q = quantize(w)
    assert q.global_scale.item() == 1.0
    s = q.scales.float()
    assert s[0, 0].item() == 448.0
    assert s[1, 0].item() == 2.0 ** -9
    assert s[2, 0].item() == 0.5
    assert s[0, 1].item() == 1.0 and s[1, 1].item() == 1.0  # zero blocks -> 1.0
    assert torch.equal(q.dequantize()[2], w[2])


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_zero_tensor(fmt):
    q = quantize(torch.zeros(4, 64), fmt)
    d = q.dequantize()
    assert torch.isfinite(q.global_scale).all() and q.global_scale.item() == 1.0
    assert torch.isfinite(q.scales.float() if fmt == "nvfp4" else decode_e8m0(q.scales)).all()
    assert torch.equal(d, torch.zeros(4, 64))
    assert torch.all(q.packed == 0)
    if fmt == "mxfp4":
        assert torch.all(q.scales == 0)  # log2(0) = -inf clamps to -127, stored as 0


def test_stacked_experts_per_expert_global_scale():
    g = torch.Generator().manual_seed(4)
    mags = torch.tensor([1e-3, 1.0, 50.0])
    w = torch.randn(3, 48, 64, generator=g) * mags.view(3, 1, 1)
    q = quantize(w)
    assert q.global_scale.shape == (3,)
    assert q.num_experts == 3 and q.shape == (3, 48, 64) and (q.n, q.k) == (48, 64)
    d = q.dequantize()
    for e in range(3):
        single = quantize(w[e])
        assert torch.equal(q.global_scale[e], single.global_scale)
        assert torch.equal(q.packed[e], single.packed)
        assert torch.equal(q.scales[e].view(torch.uint8), single.scales.view(torch.uint8))
        qe = q.expert(e)
        assert qe.num_experts is None and qe.global_scale.ndim == 0
        assert torch.equal(qe.dequantize(), d[e])
        assert _rel(d[e], w[e]) < 0.105
    # a shared scalar global scale (fused shards) also works for stacked input
    shared = quantize(w, global_scale=q.global_scale.max())
    assert shared.global_scale.ndim == 0
    assert torch.equal(shared.expert(0).global_scale, shared.global_scale)
    assert _rel(shared.dequantize()[2], w[2]) < 0.105
    with pytest.raises(IndexError):
        q.expert(3)
    mx = quantize(w, "mxfp4")
    assert mx.num_experts == 3 and _rel(mx.dequantize(), w) < 0.127


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_half_precision_input(dtype, fmt):
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(5)).to(dtype)
    q = quantize(w, fmt)
    ref = quantize(w.float(), fmt)  # upcast is exact, so the result must be identical
    assert torch.equal(q.packed, ref.packed)
    assert torch.equal(q.scales.view(torch.uint8), ref.scales.view(torch.uint8))
    d = q.dequantize(dtype)
    assert d.dtype == dtype
    assert _rel(d, w) < (0.105 if fmt == "nvfp4" else 0.127)


def test_dtypes_properties_and_nbytes():
    w = torch.randn(40, 96, generator=torch.Generator().manual_seed(6))
    nv, mx = quantize(w, "nvfp4"), quantize(w, "mxfp4")
    assert FORMATS["nvfp4"].block == 16 and FORMATS["mxfp4"].block == 32
    assert nv.scales.dtype == torch.float8_e4m3fn and nv.scales.shape == (40, 6) and nv.block == 16
    assert mx.scales.dtype == torch.uint8 and mx.scales.shape == (40, 3) and mx.block == 32
    assert mx.global_scale.dtype == torch.float32 and mx.global_scale.item() == 1.0
    assert nv.packed.shape == (40, 48) and nv.num_experts is None
    assert nv.nbytes == 40 * 48 + 40 * 6 + 4
    assert mx.nbytes == 40 * 48 + 40 * 3 + 4
    assert nv.to("cpu").dequantize().equal(nv.dequantize())
    with pytest.raises(ValueError, match="global"):
        quantize(w, "mxfp4", global_scale=0.5)


def test_quantize_activation_nvfp4():
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(7)) * 4
    input_scale = x.abs().amax() / (6 * 448)
    packed, scales = quantize_activation_nvfp4(x, input_scale)
    assert packed.shape == (8, 32) and scales.shape == (8, 4) and scales.dtype == torch.float8_e4m3fn
    deq = FP4Weight(packed, scales, input_scale.float().reshape(()), "nvfp4").dequantize()
    assert _rel(deq, x) < 0.11
    # same rule as the weight path when the weight global scale equals input_scale
    ref = quantize(x, global_scale=input_scale)
    assert torch.equal(packed, ref.packed)
    with pytest.raises(ValueError, match="K=24"):
        quantize_activation_nvfp4(torch.randn(2, 24), 1.0)


# ----------------------------------------------------------------------------- bad input


def test_bad_k_names_value():
    with pytest.raises(ValueError, match=r"K=24 is not a multiple of the nvfp4 block \(16\)"):
        quantize(torch.randn(4, 24))
    with pytest.raises(ValueError, match=r"K=48 is not a multiple of the mxfp4 block \(32\)"):
        quantize(torch.randn(2, 4, 48), "mxfp4")
    with pytest.raises(ValueError, match="K=24"):
        FP4Weight(torch.zeros(4, 12, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.float8_e4m3fn),
                  torch.tensor(1.0))
    with pytest.raises(ValueError, match="unknown FP4 format"):
        quantize(torch.randn(4, 32), "fp4")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inf/NaN"):
        quantize(torch.tensor([[math.nan] * 16]))


def test_fp4weight_validation():
    p = torch.zeros(4, 16, dtype=torch.uint8)
    s = torch.ones(4, 2).to(torch.float8_e4m3fn)
    g = torch.tensor(1.0)
    FP4Weight(p, s, g)  # consistent: no error
    with pytest.raises(ValueError, match=r"scales shape \(4, 3\)"):
        FP4Weight(p, torch.ones(4, 3).to(torch.float8_e4m3fn), g)
    with pytest.raises(ValueError, match=r"scales shape \(5, 2\)"):
        FP4Weight(p, torch.ones(5, 2).to(torch.float8_e4m3fn), g)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        FP4Weight(p, torch.ones(4, 2, dtype=torch.uint8), g)
    with pytest.raises(ValueError, match="uint8"):
        FP4Weight(p.to(torch.int8), s, g)
    with pytest.raises(ValueError, match="global_scale"):
        FP4Weight(p, s, torch.tensor(1.0, dtype=torch.float64))
    with pytest.raises(ValueError, match="global_scale shape"):
        FP4Weight(p[None].expand(2, 4, 16), s[None].expand(2, 4, 2), torch.ones(3))
    with pytest.raises(ValueError, match="input_scale"):
        FP4Weight(p, s, g, input_scale=torch.ones(2))
    with pytest.raises(ValueError, match="mxfp4 scales must be"):
        FP4Weight(torch.zeros(4, 16, dtype=torch.uint8), s, g, "mxfp4")


# ----------------------------------------------------------------------------- 128x4 swizzle


def _formula_offsets(rows: int, cols: int) -> torch.Tensor:
    """Reference offsets from the FlashInfer/TRT-LLM get_sf_out_offset_128x4 formula."""
    num_k_tiles = (cols + 3) // 4
    r = torch.arange(rows)[:, None]
    c = torch.arange(cols)[None, :]
    return ((r // 128) * num_k_tiles * 512 + (c // 4) * 512
            + (r % 32) * 16 + ((r % 128) // 32) * 4 + (c % 4))


@pytest.mark.parametrize("rows, cols", [(1, 1), (128, 4), (130, 5), (256, 8), (300, 9), (97, 64), (512, 3)])
def test_swizzle_matches_offset_formula(rows, cols):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    s = torch.randint(1, 256, (rows, cols), generator=g, dtype=torch.uint8)  # nonzero: padding is visible
    sw = swizzle_128x4(s)
    size = swizzled_size_128x4(rows, cols)
    assert sw.dtype == torch.uint8 and sw.shape == (size,)
    assert size == ((rows + 127) // 128 * 128) * ((cols + 3) // 4 * 4)
    off = _formula_offsets(rows, cols)
    assert torch.equal(sw[off.flatten()], s.flatten())
    pad = torch.ones(size, dtype=torch.bool)
    pad[off.flatten()] = False
    assert torch.all(sw[pad] == 0)
    assert torch.equal(unswizzle_128x4(sw, rows, cols), s)


def test_swizzle_batched_and_fp8_inverse():
    w = torch.randn(3, 200, 80, generator=torch.Generator().manual_seed(8))
    q = quantize(w)  # scales [3, 200, 5] float8_e4m3fn
    sw = q.swizzled_scales()
    assert sw.shape == (3, swizzled_size_128x4(200, 5))
    for e in range(3):
        assert torch.equal(sw[e], swizzle_128x4(q.scales[e]))
        assert torch.equal(sw[e][_formula_offsets(200, 5).flatten()], q.scales[e].view(torch.uint8).flatten())
    back = unswizzle_128x4(sw, 200, 5, dtype=torch.float8_e4m3fn)
    assert back.dtype == torch.float8_e4m3fn
    assert torch.equal(back.view(torch.uint8), q.scales.view(torch.uint8))
    with pytest.raises(ValueError):
        unswizzle_128x4(sw, 200, 9)


# ----------------------------------------------------------------------------- ModelOpt checkpoints


def test_modelopt_safetensors_round_trip(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    w = torch.randn(48, 128, generator=torch.Generator().manual_seed(9), dtype=torch.float32).to(torch.bfloat16)
    q = quantize(w)
    q.input_scale = torch.tensor(0.0125)
    prefix = "model.layers.0.mlp.down_proj."
    tensors = to_modelopt(q, prefix)
    other = {"model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2)}
    path = tmp_path / "model.safetensors"
    save_file({**tensors, **other}, str(path))

    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor(prefix + "weight").dtype == torch.uint8
        assert f.get_tensor(prefix + "weight").shape == (48, 64)
        assert f.get_tensor(prefix + "weight_scale").dtype == torch.float8_e4m3fn
        assert f.get_tensor(prefix + "weight_scale").shape == (48, 8)
        assert f.get_tensor(prefix + "weight_scale_2").shape == ()

    for pre in (prefix, prefix.rstrip(".")):
        back = load_modelopt_safetensors(str(path), pre)
        assert back.fmt == "nvfp4" and back.shape == (48, 128)
        assert torch.equal(back.packed, q.packed)
        assert torch.equal(back.scales.view(torch.uint8), q.scales.view(torch.uint8))
        assert torch.equal(back.global_scale, q.global_scale)
        assert back.input_scale is not None and back.input_scale.item() == pytest.approx(0.0125)
        assert torch.equal(back.dequantize(), q.dequantize())

    with pytest.raises(KeyError, match=r"model\.layers\.0\.mlp\.up_proj\.weight_scale'"):
        load_modelopt_safetensors(str(path), "model.layers.0.mlp.up_proj.")


def test_from_modelopt_errors():
    q = quantize(torch.randn(16, 64, generator=torch.Generator().manual_seed(10)))
    t = to_modelopt(q, "lin.")
    assert from_modelopt(t, "lin.").input_scale is None
    for key in ("lin.weight", "lin.weight_scale", "lin.weight_scale_2"):
        broken = {k: v for k, v in t.items() if k != key}
        with pytest.raises(KeyError, match=key.replace(".", r"\.")):
            from_modelopt(broken, "lin.")
    with pytest.raises(ValueError, match=r"lin\.weight_scale has shape \(16, 3\)"):
        from_modelopt({**t, "lin.weight_scale": t["lin.weight_scale"][:, :3]}, "lin.")
    with pytest.raises(ValueError, match=r"lin\.weight_scale must be float8_e4m3fn"):
        from_modelopt({**t, "lin.weight_scale": t["lin.weight_scale"].float()}, "lin.")
    with pytest.raises(ValueError, match=r"lin\.weight must be uint8"):
        from_modelopt({**t, "lin.weight": t["lin.weight"].to(torch.int16)}, "lin.")
    with pytest.raises(ValueError, match=r"lin\.weight_scale_2"):
        from_modelopt({**t, "lin.weight_scale_2": torch.ones(2)}, "lin.")
    # a [1]-shaped scale (some exporters) is accepted as a scalar
    ok = from_modelopt({**t, "lin.weight_scale_2": t["lin.weight_scale_2"].reshape(1)}, "lin.")
    assert ok.global_scale.ndim == 0
    with pytest.raises(ValueError, match="nvfp4"):
        to_modelopt(quantize(torch.randn(4, 32), "mxfp4"))
    with pytest.raises(ValueError, match="expert"):
        to_modelopt(quantize(torch.randn(2, 4, 32)))


# ----------------------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_cuda_round_trip_matches_cpu(fmt):
    w = torch.randn(2, 256, 512, generator=torch.Generator().manual_seed(11)).to(torch.bfloat16)
    cpu = quantize(w, fmt)
    gpu = quantize(w.cuda(), fmt)
    assert gpu.packed.is_cuda and gpu.scales.is_cuda and gpu.global_scale.is_cuda
    assert torch.equal(gpu.packed.cpu(), cpu.packed)
    assert torch.equal(gpu.scales.cpu().view(torch.uint8), cpu.scales.view(torch.uint8))
    assert torch.equal(gpu.global_scale.cpu(), cpu.global_scale)
    assert torch.equal(gpu.dequantize().cpu(), cpu.dequantize())
    assert torch.equal(gpu.swizzled_scales().cpu(), cpu.swizzled_scales())
    assert torch.equal(cpu.to("cuda").dequantize(torch.bfloat16).cpu(), cpu.dequantize(torch.bfloat16))
