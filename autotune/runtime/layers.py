"""FP4 layers that dispatch on every forward: FP4Linear, FP4MLP (a SwiGLU MLP in two kernels: the
dense gate_up with the SwiGLU epilogue, then down) and FP4GroupedGEMM (one grouped expert GEMM).
FP4MoE, the whole routed-expert block (autotune.runtime.moe), builds on them; autotune.runtime.nn
gathers all of them in one namespace.

Each layer holds its FP4 weight as buffers and binds it once to its problem's table
(`Dispatcher.bind` -> autotune.runtime.bound.BoundTable): the weight is checked against the problem,
packed once per layout its launchers read, and each reachable tactic becomes a launcher. An eager
forward calls the bound launcher for the live M directly (no op dispatcher: host cost per call); while
torch.compile traces (`torch.compiler.is_compiling()`) it is one call of a `torch.library` custom
op (`fp4_autotune::linear` / `fp4_autotune::moe`) with a fake (shape-only) implementation, so there
is no graph break, and inside the op the table picks the launcher for the live M on the host.

CUDA graphs: the kernel is chosen on the host when the op runs, i.e. when a graph is captured; the
captured graph replays that kernel for that batch size and never calls back into Python (so the
rung counters count captures, not replays). Call `warmup(ms)` before capturing so every kernel the
captured sizes need is built and compiled outside the captured region.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from autotune.runtime.bound import BoundTable
from autotune.runtime.dispatch import Dispatcher, default_dispatcher
from autotune.runtime.table import Table
from autotune.core.formats import FP4Weight, quantize
from autotune.core.operands import OperandError, check_layer_x
from autotune.core.problem import Problem

_LAYERS: "weakref.WeakValueDictionary[int, _FP4Base]" = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


class _FP4Base(nn.Module):
    problem: Problem

    def __init__(self, weight: FP4Weight, problem: Problem, dispatcher: Dispatcher | None, one_copy: bool = False):
        super().__init__()
        self.problem = problem
        self.fmt = weight.fmt
        # all three as uint8 bytes: `model.to(torch.bfloat16)` would otherwise cast the fp8 block
        # scales and the fp32 global scale (both "floating"), silently changing the weight
        self._scale_dtype = weight.scales.dtype
        self._gs_shape = tuple(weight.global_scale.shape)
        self.register_buffer("packed", weight.packed)
        self.register_buffer("scales_u8", weight.scales.contiguous().view(torch.uint8))
        self.register_buffer("global_scale_u8", weight.global_scale.float().reshape(-1).contiguous().view(torch.uint8))
        # W4A4: the static activation scale travels with the weight (the bound launcher reads it)
        self._is_shape = None if weight.input_scale is None else tuple(weight.input_scale.shape)
        if weight.input_scale is not None:
            self.register_buffer("input_scale_u8", weight.input_scale.float().reshape(-1).contiguous().view(torch.uint8))
        self._dispatcher = dispatcher or default_dispatcher()
        self.table: Table = self._dispatcher.table(problem)
        self.layer_id = next(_IDS)
        _LAYERS[self.layer_id] = self
        self.bound = BoundTable(self.table, self._stored(), self.packed.device.type, one_copy=one_copy,
                                arch=self._dispatcher.arch, scratch=self._dispatcher.scratch,
                                one_copy_upto=self._dispatcher.policy.one_copy_upto,
                                best=self._dispatcher.best_of(problem))
        self._register_state_dict_hook(_refuse_held)
        self._register_load_state_dict_pre_hook(self._refuse_load)
        # loading copies bytes into the buffers in place: a layout packed as a copy (cuda) would keep
        # the old weight's numbers, so every load binds again
        self.register_load_state_dict_post_hook(lambda mod, _keys: mod.bound.rebind(mod._stored()))

    @property
    def scales(self) -> Tensor:
        return self.scales_u8.view(self._scale_dtype)

    @property
    def global_scale(self) -> Tensor:
        return self.global_scale_u8.view(torch.float32).reshape(self._gs_shape)

    def _stored(self) -> FP4Weight:
        isc = None if self._is_shape is None else self.input_scale_u8.view(torch.float32).reshape(self._is_shape)
        return FP4Weight(self.packed, self.scales, self.global_scale, self.fmt, isc)

    @property
    def weight(self) -> FP4Weight:
        """The checkpoint-layout weight (refused once a one-copy binding packed it in place)."""
        self._check_checkpoint("weight")
        return self._stored()

    def _check_checkpoint(self, what: str) -> None:
        if self.bound.held is not None:
            raise RuntimeError(f"{self.problem.key}: {what}: the layer's bytes hold the {self.bound.held} layout "
                               f"(one_copy packed them in place); the checkpoint layout is gone")

    def _refuse_load(self, *args) -> None:
        self._check_checkpoint("load_state_dict")   # copying checkpoint bytes over the layout: wrong numbers

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self.bound.rebind(self._stored())   # .to()/.cuda(): check, pack (or re-wrap a held layout), bind
        return out

    @property
    def packs(self) -> list[object]:
        """One packed weight per layout the layer's launchers read."""
        return list(self.bound.packs.values())

    @property
    def prepacked_extra_bytes(self) -> int:
        """Memory the prepacked copies cost beyond the FP4 weight itself."""
        return self.bound.extra_bytes

    def extra_repr(self) -> str:
        return f"{self.problem.key}, layouts={list(self.bound.packs)}"


class FP4Linear(_FP4Base):
    """y = x · Wᵀ (+ bias) with W an FP4 weight [N, K]; x [..., K] in bf16, fp16 or fp32 (computed
    in bf16, returned in x's dtype; operands.LAYER_X). epilogue="swiglu": W is vLLM's [gate; up]
    rows and y = silu(x·W_gateᵀ) · (x·W_upᵀ), [..., N/2], in the same kernel (the dense swiglu
    problem; FP4MLP's first half)."""

    def __init__(self, weight: FP4Weight, bias: Tensor | None = None, *, dispatcher: Dispatcher | None = None,
                 one_copy: bool = False, a_fmt: str = "bf16", epilogue: str = "none"):
        """one_copy=True: the layer holds one copy of the weight: every M is served from one layout,
        written over `weight`'s storage where its family can (`Dispatcher.bind`'s one_copy); the
        checkpoint layout is gone then (`weight`, `state_dict` and `load_state_dict` refuse).
        a_fmt="nvfp4": the W4A4 problem (activations quantized under `weight.input_scale`)."""
        if weight.num_experts is not None:
            raise ValueError(f"FP4Linear takes a 2-D weight [N, K]; got {weight.shape} (use FP4GroupedGEMM)")
        if a_fmt == "nvfp4" and weight.input_scale is None:
            raise ValueError("FP4Linear(a_fmt='nvfp4'): W4A4 needs the weight's static input_scale")
        if epilogue not in ("none", "swiglu"):
            raise ValueError(f"FP4Linear epilogue must be 'none' or 'swiglu', got {epilogue!r}")
        if epilogue == "swiglu" and (bias is not None or weight.n % 2):
            raise ValueError(f"FP4Linear(epilogue='swiglu') takes [gate; up] rows (an even N, got {weight.n}) "
                             "and no bias")
        problem = Problem.dense(weight.n, weight.k, w_fmt=weight.fmt, a_fmt=a_fmt, epilogue=epilogue)
        super().__init__(weight, problem, dispatcher, one_copy)
        self.in_features, self.out_features = weight.k, problem.out_n
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(torch.bfloat16), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str = "nvfp4", *, dispatcher: Dispatcher | None = None,
                    one_copy: bool = False) -> "FP4Linear":
        return cls(quantize(linear.weight.detach(), fmt), linear.bias, dispatcher=dispatcher, one_copy=one_copy)

    @classmethod
    def from_modelopt(cls, source: str | Mapping[str, Tensor], prefix: str = "", *, device: str = "cpu",
                      bias: Tensor | None = None, dispatcher: Dispatcher | None = None,
                      one_copy: bool = False) -> "FP4Linear":
        """From a ModelOpt NVFP4 `.safetensors` path (only this layer's tensors are read) or a dict:
        the checkpoint reader (autotune.core.checkpoint) on the whole module, W4A16 (no W4A4 choice:
        use from_pretrained for that)."""
        from autotune.runtime.pretrained import one_linear
        w = one_linear(source, prefix, device)
        w = FP4Weight(w.packed, w.scales, w.global_scale, w.fmt)
        return cls(w, bias, dispatcher=dispatcher, one_copy=one_copy)

    @classmethod
    def from_pretrained(cls, path, module: str, *, tp_rank: int = 0, tp_size: int = 1, parallel: str | None = None,
                        activations: str | None = None, arch=None, device: str = "cpu",
                        dispatcher: Dispatcher | None = None, one_copy: bool = False) -> "FP4Linear":
        """One quantized linear of a checkpoint (a directory, a .safetensors, an index.json; ModelOpt
        or compressed-tensors NVFP4, compressed-tensors MXFP4), this rank's slice: parallel="column"
        (N / tp) or "row" (K / tp, whole scale blocks); default by name (o_proj, down_proj, … row).
        activations: "auto" | "w4a4" | "w4a16" (autotune.runtime.activations; default
        $AUTOTUNE_ACTIVATIONS, else auto); arch: the arch that decides auto (default: the device's)."""
        from autotune.runtime.pretrained import load_linear
        w, bias, a_fmt = load_linear(path, module, tp_rank=tp_rank, tp_size=tp_size, parallel=parallel,
                                     activations=activations, arch=arch, device=device)
        if a_fmt == "bf16":
            w = FP4Weight(w.packed, w.scales, w.global_scale, w.fmt)
        return cls(w, bias, dispatcher=dispatcher, one_copy=one_copy, a_fmt=a_fmt)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim == 2 and x.dtype is torch.bfloat16 and x.shape[1] == self.in_features and self.bias is None \
                and not torch.compiler.is_compiling():
            # the engines' eager case: no reshape, no cast, straight to the bound launcher (each costs host time per call)
            return self.bound.launcher(x.shape[0])(x)
        check_layer_x(self.problem.key, x)
        if x.ndim == 0 or x.shape[-1] != self.in_features:
            raise OperandError(f"{self.problem.key}: x is {'x'.join(map(str, x.shape))}, expected "
                               f"... x {self.in_features}")
        lead = x.shape[:-1]
        xb = x if x.ndim == 2 else x.reshape(-1, self.in_features)
        if xb.dtype != torch.bfloat16:
            xb = xb.to(torch.bfloat16)
        if torch.compiler.is_compiling():      # traced: one opaque op with a fake implementation
            y = torch.ops.fp4_autotune.linear(xb, self.layer_id)
        else:                                  # eager: straight to the bound launcher, no op dispatcher
            y = self.bound.launcher(xb.shape[0])(xb)
        if self.bias is not None:
            y = y + self.bias
        if x.ndim != 2:
            y = y.reshape(*lead, self.out_features)
        return y if x.dtype == torch.bfloat16 else y.to(x.dtype)

    def warmup(self, ms: Iterable[int]) -> None:
        """Build and run every kernel these batch sizes reach (do this before CUDA-graph capture).
        Largest first: kernels that own a workspace (split-K) size it once, so a graph captured for
        one size never refers to a buffer a later, larger call reallocated."""
        for m in sorted(set(ms), reverse=True):
            x = torch.zeros(m, self.in_features, dtype=torch.bfloat16, device=self.packed.device)
            _linear_impl(x, self.layer_id)


class FP4MLP(nn.Module):
    """A SwiGLU MLP in two kernels, y = down(silu(x·W_gateᵀ) ⊙ (x·W_upᵀ)): x [..., H] → [..., H] in
    bf16, fp16 or fp32 (computed in bf16, returned in x's dtype), as a dense MLP layer or a shared
    expert runs. gate_up [2I, H] holds vLLM's [gate; up] rows and is served by the dense `swiglu`
    problem (its winners write silu(gate)·up from their fp32 sums: no elementwise kernel between
    the GEMMs), down [H, I] by the plain dense problem; each an FP4Linear (`.gate_up`, `.down`),
    bound once. W4A16 (bf16 activations); a_fmt="nvfp4" (a W4A4 checkpoint: static activation
    scales) runs gate_up as the plain W4A4 problem, SiLU·up in fp32 between (up's own global scale
    restored there, so down quantizes the true activations under its input_scale), then down W4A4.

    ModelOpt quantizes gate_proj and up_proj each with its own global scale: gate_up carries the
    gate's on both halves, so its up half comes out × gate/up; that factor passes linearly through
    silu(gate)·up, so down's global scale takes up/gate (`up_scale`, an fp32 product, exact: as
    FP4MoE does per expert)."""

    def __init__(self, gate_up: FP4Weight, down: FP4Weight, *, up_scale: Tensor | None = None,
                 dispatcher: Dispatcher | None = None, one_copy: bool = False, a_fmt: str = "bf16"):
        super().__init__()
        if a_fmt not in ("bf16", "nvfp4"):
            raise ValueError(f"FP4MLP a_fmt must be 'bf16' or 'nvfp4', got {a_fmt!r}")
        if a_fmt == "nvfp4" and (gate_up.fmt != "nvfp4" or gate_up.input_scale is None or down.input_scale is None):
            raise ValueError("FP4MLP(a_fmt='nvfp4'): W4A4 needs NVFP4 gate_up and down with static input_scales")
        for name, w in (("gate_up", gate_up), ("down", down)):
            if not isinstance(w, FP4Weight) or w.num_experts is not None or w.packed.ndim != 2:
                raise ValueError(f"FP4MLP takes 2-D FP4 weights gate_up [2I, H] and down [H, I]; {name} is "
                                 f"{getattr(w, 'shape', type(w).__name__)}")
        two_i, h = gate_up.shape
        if two_i % 2 or down.shape != (h, two_i // 2) or gate_up.fmt != down.fmt:
            raise ValueError(f"FP4MLP: down {down.shape} ({down.fmt}) does not fit gate_up {gate_up.shape} "
                             f"({gate_up.fmt}): expected [{h}, {two_i // 2}] in one format")
        if up_scale is not None and (not isinstance(up_scale, Tensor) or up_scale.numel() != 1
                                     or gate_up.global_scale.numel() != 1):
            raise ValueError("FP4MLP up_scale is the up half's one global scale (gate_up carrying one, the gate's)")
        self.hidden, self.intermediate, self.a_fmt = h, two_i // 2, a_fmt
        if a_fmt == "nvfp4":
            # up's rows came out x gate/up: up/gate restores them before SiLU·up (fp32), so down
            # sees the activations its static input_scale was calibrated on
            fix = None if up_scale is None else (up_scale.float().reshape(()) / gate_up.global_scale.float().reshape(()))
            self.register_buffer("up_fix", None if fix is None else fix.to(gate_up.packed.device), persistent=False)
            self.gate_up = FP4Linear(gate_up, dispatcher=dispatcher, one_copy=one_copy, a_fmt="nvfp4")
            self.down = FP4Linear(down, dispatcher=dispatcher, one_copy=one_copy, a_fmt="nvfp4")
            return
        if up_scale is not None:
            g2 = _fold_up(gate_up.global_scale, down.global_scale, up_scale, None).reshape(down.global_scale.shape)
            down = FP4Weight(down.packed, down.scales, g2.to(down.global_scale.device), down.fmt)
        strip = lambda w: FP4Weight(w.packed, w.scales, w.global_scale, w.fmt)  # noqa: E731  (W4A16)
        self.gate_up = FP4Linear(strip(gate_up), dispatcher=dispatcher, one_copy=one_copy, epilogue="swiglu")
        self.down = FP4Linear(strip(down), dispatcher=dispatcher, one_copy=one_copy)

    @property
    def problems(self) -> tuple[Problem, Problem]:
        """(the dense swiglu gate_up problem, the down problem): what the search tunes for it."""
        return self.gate_up.problem, self.down.problem

    @classmethod
    def from_float(cls, gate: Tensor, up: Tensor, down: Tensor, fmt: str = "nvfp4", *,
                   dispatcher: Dispatcher | None = None, one_copy: bool = False) -> "FP4MLP":
        """From dense gate/up [I, H] and down [H, I], each quantized on its own (as ModelOpt does:
        separate gate and up global scales)."""
        if gate.ndim != 2 or up.shape != gate.shape:
            raise ValueError(f"FP4MLP.from_float: gate and up must be [I, H] alike, got {tuple(gate.shape)}, "
                             f"{tuple(up.shape)}")
        g, u, d = quantize(gate, fmt), quantize(up, fmt), quantize(down, fmt)
        return cls(_cat_rows(g, u), d, up_scale=u.global_scale if fmt == "nvfp4" else None,
                   dispatcher=dispatcher, one_copy=one_copy)

    @classmethod
    def from_modelopt(cls, source: str | Mapping[str, Tensor], prefix: str, *, device: str = "cpu",
                      dispatcher: Dispatcher | None = None, one_copy: bool = False) -> "FP4MLP":
        """From a ModelOpt NVFP4 `.safetensors` path or a dict: `{prefix}.gate_proj`, `.up_proj`,
        `.down_proj` (e.g. 'model.layers.0.mlp' or 'model.layers.3.mlp.shared_experts'), W4A16."""
        from autotune.runtime.pretrained import one_linear
        g, u, d = (one_linear(source, f"{prefix.rstrip('.')}.{p}", device) for p in ("gate_proj", "up_proj", "down_proj"))
        return cls(_cat_rows(g, u), d, up_scale=u.global_scale, dispatcher=dispatcher, one_copy=one_copy)

    @classmethod
    def from_pretrained(cls, path, module: str, *, tp_rank: int = 0, tp_size: int = 1, device: str = "cpu",
                        activations: str | None = None, arch=None, dispatcher: Dispatcher | None = None,
                        one_copy: bool = False) -> "FP4MLP":
        """One quantized MLP of a checkpoint (a dense layer's `model.layers.0.mlp`, or a shared
        expert's `model.layers.3.mlp.shared_experts`; a directory, .safetensors or index.json), this
        rank's slice: gate/up column-parallel (I / tp), down row-parallel (whole scale blocks).
        activations / arch as FP4Linear.from_pretrained: a W4A4 checkpoint runs W4A4 where `arch` has
        a W4A4 tactic (or activations="w4a4"), else W4A16 with a warning."""
        from autotune.runtime.pretrained import load_mlp
        gate_up, down, up_scale, a_fmt = load_mlp(path, module, tp_rank=tp_rank, tp_size=tp_size, device=device,
                                                  activations=activations, arch=arch)
        return cls(gate_up, down, up_scale=up_scale, dispatcher=dispatcher, one_copy=one_copy, a_fmt=a_fmt)

    def _w4a4(self, xb: Tensor) -> Tensor:
        gu = self.gate_up(xb).float()
        g, u = gu[:, :self.intermediate], gu[:, self.intermediate:]
        if self.up_fix is not None:
            u = u * self.up_fix
        return self.down((torch.nn.functional.silu(g) * u).to(torch.bfloat16))

    def forward(self, x: Tensor) -> Tensor:
        if self.a_fmt == "nvfp4":
            check_layer_x(self.gate_up.problem.key, x)
            if x.ndim == 0 or x.shape[-1] != self.hidden:
                raise OperandError(f"{self.gate_up.problem.key}: x is {'x'.join(map(str, x.shape))}, expected "
                                   f"... x {self.hidden}")
            xb = x.reshape(-1, self.hidden)
            y = self._w4a4(xb if xb.dtype == torch.bfloat16 else xb.to(torch.bfloat16)).reshape(*x.shape[:-1], self.hidden)
            return y if x.dtype == torch.bfloat16 else y.to(x.dtype)
        if x.ndim == 2 and x.dtype is torch.bfloat16 and x.shape[1] == self.hidden and not torch.compiler.is_compiling():
            # the engines' eager case: the two bound launchers, nothing between them
            m = x.shape[0]
            return self.down.bound.launcher(m)(self.gate_up.bound.launcher(m)(x))
        check_layer_x(self.gate_up.problem.key, x)
        if x.ndim == 0 or x.shape[-1] != self.hidden:
            raise OperandError(f"{self.gate_up.problem.key}: x is {'x'.join(map(str, x.shape))}, expected "
                               f"... x {self.hidden}")
        xb = x.reshape(-1, self.hidden)
        y = self.down(self.gate_up(xb if xb.dtype == torch.bfloat16 else xb.to(torch.bfloat16)))   # bf16 between
        y = y.reshape(*x.shape[:-1], self.hidden)
        return y if x.dtype == torch.bfloat16 else y.to(x.dtype)

    def warmup(self, ms: Iterable[int]) -> None:
        """Build and run every kernel these batch sizes reach (before CUDA-graph capture)."""
        self.gate_up.warmup(ms)
        self.down.warmup(ms)

    def extra_repr(self) -> str:
        return f"{self.hidden} -> {self.intermediate} (SwiGLU) -> {self.hidden}"


def _cat_rows(gate: FP4Weight, up: FP4Weight) -> FP4Weight:
    """vLLM's gate_up: [gate; up] rows, carrying the gate's global scale (up's goes to down's)."""
    if gate.shape != up.shape or gate.fmt != up.fmt:
        raise ValueError(f"gate {gate.shape} ({gate.fmt}) and up {up.shape} ({up.fmt}) must match")
    return FP4Weight(torch.cat([gate.packed, up.packed], -2), torch.cat([gate.scales, up.scales], -2),
                     gate.global_scale, gate.fmt)


class FP4GroupedGEMM(_FP4Base):
    """One grouped expert GEMM of an MoE block: for token i and slot j,
    y[i, j] = x[i] · W[topk_ids[i, j]]ᵀ (× topk_weights[i, j]). Weight [E, N, K]. The whole block
    (w13, SiLU·up, w2, routing weights) is FP4MoE."""

    def __init__(self, weight: FP4Weight, top_k: int, *, dispatcher: Dispatcher | None = None):
        if weight.num_experts is None or weight.packed.ndim != 3:
            raise ValueError(f"FP4GroupedGEMM takes stacked experts [E, N, K]; got {weight.shape}")
        e = weight.num_experts
        super().__init__(weight, Problem.moe(weight.n, weight.k, e, top_k, w_fmt=weight.fmt), dispatcher)
        self.num_experts, self.top_k = e, top_k
        self.in_features, self.out_features = weight.k, weight.n

    @classmethod
    def from_linears(cls, experts: Sequence[nn.Linear] | Tensor, top_k: int, fmt: str = "nvfp4", *,
                     dispatcher: Dispatcher | None = None) -> "FP4GroupedGEMM":
        """From dense experts: a list of nn.Linear (bias-free) or one tensor [E, N, K]."""
        w = experts if isinstance(experts, Tensor) else torch.stack([lin.weight.detach() for lin in experts])
        return cls(quantize(w, fmt), top_k, dispatcher=dispatcher)

    @classmethod
    def from_modelopt(cls, source: str | Mapping[str, Tensor], prefixes: Sequence[str], top_k: int, *,
                      device: str = "cpu", dispatcher: Dispatcher | None = None) -> "FP4GroupedGEMM":
        """From one ModelOpt NVFP4 linear per expert (`prefixes[e]`, e.g.
        'model.layers.3.mlp.experts.{e}.down_proj'), stacked in that order."""
        from autotune.runtime.pretrained import one_linear
        ws = [one_linear(source, p, device) for p in prefixes]
        if not ws:
            raise ValueError("FP4GroupedGEMM.from_modelopt needs at least one expert prefix")
        shapes = {w.shape for w in ws}
        if len(shapes) != 1:
            raise ValueError(f"experts differ in shape: {sorted(shapes)}")
        w = FP4Weight(torch.stack([x.packed for x in ws]), torch.stack([x.scales for x in ws]),
                      torch.stack([x.global_scale for x in ws]), "nvfp4")
        return cls(w, top_k, dispatcher=dispatcher)

    def forward(self, x: Tensor, topk_ids: Tensor, topk_weights: Tensor | None = None) -> Tensor:
        check_layer_x(self.problem.key, x)
        xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        if torch.compiler.is_compiling():
            y = torch.ops.fp4_autotune.moe(xb, topk_ids, topk_weights, self.layer_id)
        else:
            y = _moe_launch(self, xb, topk_ids, topk_weights)
        return y if x.dtype == torch.bfloat16 else y.to(x.dtype)


def _refuse_held(module: _FP4Base, state_dict, prefix, local_metadata) -> None:
    module._check_checkpoint("state_dict")    # the saved bytes would read as a checkpoint elsewhere


# ----------------------------------------------------------------------------------- custom ops

def _layer(layer_id: int) -> _FP4Base:
    try:
        return _LAYERS[layer_id]
    except KeyError:
        raise RuntimeError(f"fp4_autotune: layer {layer_id} no longer exists") from None


@torch.library.custom_op("fp4_autotune::linear", mutates_args=())
def _linear_impl(x: Tensor, layer_id: int) -> Tensor:
    return _layer(layer_id).bound.launcher(x.shape[0])(x)


@_linear_impl.register_fake
def _linear_fake(x: Tensor, layer_id: int) -> Tensor:
    return x.new_empty((x.shape[0], _layer(layer_id).problem.out_n), dtype=torch.bfloat16)


def _moe_launch(layer: "FP4GroupedGEMM", x: Tensor, topk_ids: Tensor, topk_weights: Tensor | None) -> Tensor:
    launch = layer.bound.launcher(x.shape[0])
    if x.is_cuda and torch.cuda.is_current_stream_capturing() and not launch.capture_safe:
        # the torch family's grouped kernel reads the routing on the host (unique/tolist): that
        # would abort the capture with an opaque CUDA error
        raise RuntimeError(f"fp4_autotune: the {layer.table.rung_for(x.shape[0])[1].family} MoE kernel reads "
                           "routing on the host and cannot run under CUDA-graph capture")
    return launch(x, topk_ids, topk_weights)


@torch.library.custom_op("fp4_autotune::moe", mutates_args=())
def _moe_impl(x: Tensor, topk_ids: Tensor, topk_weights: Tensor | None, layer_id: int) -> Tensor:
    return _moe_launch(_layer(layer_id), x, topk_ids, topk_weights)


@_moe_impl.register_fake
def _moe_fake(x: Tensor, topk_ids: Tensor, topk_weights: Tensor | None, layer_id: int) -> Tensor:
    return x.new_empty((x.shape[0], topk_ids.shape[1], _layer(layer_id).problem.n), dtype=torch.bfloat16)


def _per_expert(g: Tensor, e: int) -> Tensor:
    return g.float().reshape(-1).expand(e).contiguous() if g.numel() == 1 else g.float().reshape(e)


def _fold_up(g13: Tensor, g2: Tensor, up_scale: Tensor | None, e: int | None) -> Tensor:
    """w2's (down's) global scale × up/gate, exact (see autotune.runtime.moe's docstring); e=None:
    one 2-D expert (FP4MLP), else per expert [E]."""
    if up_scale is None:
        return g2
    if e is None:
        return g2.float() * (up_scale.float().to(g13.device) / g13.float())
    gate = _per_expert(g13, e).to(g2.device)
    return _per_expert(g2, e) * (_per_expert(up_scale.to(gate.device), e) / gate)
