"""The layer-level problem (autotune.core.layer): both GEMMs of a routed MoE layer as one problem, its
float64 reference, and the `layer` family's tactics (the torch composition, a pair of GEMM tactics)."""
from __future__ import annotations

import pytest
import torch

from autotune.core import inputs
from autotune.core.arch import get_arch
from autotune.core.layer import LayerProblem, parse_key
from autotune.core.layer_inputs import check, make_inputs, reference
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics import registry

P = LayerProblem.of(128, 64, 8, 2)
CPU = get_arch("cpu")


def test_key_names_both_gemms_and_round_trips():
    assert P.key == "moe_layer:bf16*nvfp4->bf16:w13n128k128:w2n128k64:e8:top2"
    assert parse_key(P.key) == P and LayerProblem.from_key(P.key) == P
    assert P.w13 == Problem.moe(128, 128, 8, 2, epilogue="swiglu")
    assert P.w2 == Problem.moe(128, 64, 8, 2, epilogue="reduce")
    assert LayerProblem.from_pair(P.w13, P.w2) == P
    assert parse_key(P.w13.key) == P.w13                  # pair keys read as before
    assert P.to_dict() == {"kind": "moe_layer", "a_fmt": "bf16", "w_fmt": "nvfp4", "out_dtype": "bf16",
                           "n": 128, "k": 128, "experts": 8, "top_k": 2}


@pytest.mark.parametrize("key", ["moe_layer:bf16*nvfp4->bf16:w13n128k128:w2n64k64:e8:top2",   # w2 not the layer's
                                 "moe_layer:bf16*nvfp4->bf16:w13n127k128:w2n128k63:e8:top2",   # odd 2I
                                 "moe_layer:nvfp4*nvfp4->bf16:w13n128k128:w2n128k64:e8:top2",  # W4A4
                                 "moe_layer:bf16*nvfp4->bf16:w13n128k128:w2n128k64:e2:top4"])  # top_k > E
def test_bad_layer_keys_are_refused(key):
    with pytest.raises(ValueError):
        parse_key(key)


def test_from_pair_refuses_gemms_of_two_layers():
    with pytest.raises(ValueError, match="not the two GEMMs"):
        LayerProblem.from_pair(P.w13, Problem.moe(256, 64, 8, 2, epilogue="reduce"))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_reference_matches_the_pair_references_composed(fmt):
    """The layer's own float64 reference against an independent composition: the w13 problem's
    float64 reference (SwiGLU, no routing weight) fed to the w2 problem's (weights, top_k reduce);
    some slots routed nowhere (-1)."""
    p = LayerProblem.of(128, 64, 8, 2, w_fmt=fmt)
    s = make_inputs(p, 9, "cpu", seed=3)[0]
    s.topk_ids[2, 1] = -1
    s.topk_ids[5] = -1
    ref = reference(p, s)
    h = inputs.moe_reference(p.w13, s.x.double(), s.w13, s.topk_ids, None)
    y = inputs.moe_reference(p.w2, h, s.w2, s.topk_ids, s.topk_weights)
    assert ref.shape == (9, 128) and ref.dtype == torch.float64
    assert torch.equal(ref[5], torch.zeros(128, dtype=torch.float64))
    assert ref.abs().max() > 0.1
    torch.testing.assert_close(ref, y, rtol=1e-12, atol=1e-12)


def test_reference_refuses_bad_expert_ids():
    s = make_inputs(P, 3, "cpu", seed=1)[0]
    s.topk_ids[1, 0] = 8
    with pytest.raises(ValueError, match="outside"):
        reference(P, s)


def test_every_torch_layer_tactic_and_a_pair_checks_against_the_reference():
    fam = registry.get("layer")
    s = make_inputs(P, 6, "cpu", seed=2)[0]
    ref = reference(P, s)
    torch_tactics = list(fam.enumerate(P, CPU))
    assert torch_tactics and all(t["via"] == "torch" for t in torch_tactics)
    pair = registry.pair_tactic(Tactic("torch", dequant_dtype="fp32", chunk_n=0),
                                Tactic("torch", dequant_dtype="bf16", chunk_n=0))
    assert fam.validate(pair) is None and fam.verdict(P, pair, CPU).ok
    for t in torch_tactics + [pair]:
        if fam.verdict(P, t, CPU).rejected:
            continue
        assert check(P, fam.build(P, t, "cpu"), s, ref) < 1e-2


def test_a_wrong_pair_fails_the_check():
    """A pair whose w13 and w2 roles are swapped into the wrong GEMMs is not a layer: its verdict rejects
    it (the torch family's own rules on each pair problem) or its call fails the check."""
    fam = registry.get("layer")
    bad = registry.pair_tactic(Tactic("torch", dequant_dtype="bf16", chunk_n=512),
                               Tactic("torch", dequant_dtype="bf16", chunk_n=0))
    assert fam.verdict(P, bad, CPU).rejected          # chunk_n 512 >= w13's N 128
    s = make_inputs(P, 4, "cpu", seed=5)[0]
    ref = reference(P, s)
    with pytest.raises(inputs.CheckFailed):
        check(P, lambda *a, out=None: out.zero_(), s, ref)


@pytest.mark.parametrize("params,why", [({"via": "pair", "w13": "{}", "w2": "{}"}, "not a tactic"),
                                        ({"via": "pair", "w13": Tactic("nope", a=1).to_json(),
                                          "w2": Tactic("torch", dequant_dtype="bf16", chunk_n=0).to_json()},
                                         "unknown family"),
                                        ({"via": "fused"}, "via must be"),
                                        ({"via": "torch", "dequant_dtype": "fp8", "chunk_n": 0}, "dequant_dtype")])
def test_bad_layer_tactics_are_refused(params, why):
    assert why in (registry.get("layer").validate(Tactic("layer", params)) or "")


def test_the_layer_family_runs_layers_only_and_other_families_are_unchanged():
    fam = registry.get("layer")
    assert fam.supports(P.w13) and list(fam.enumerate(P.w2, CPU)) == []
    d = registry.designated_default(Problem.dense(256, 512), CPU, "cpu")
    assert d.family == "torch"
    # the designated default of a layer is the layer family's (no family that runs no layers)
    assert registry.designated_default(P, CPU, "cpu") == fam.default(P, CPU)
