"""FP4MoE: the routed-expert part of an MoE block, as a serving engine calls it.

    y[i] = Σ_j topk_weights[i, j] · W2_e · (silu(W_gate,e · x[i]) ⊙ (W_up,e · x[i])),  e = topk_ids[i, j]

with vLLM's weight order (w13 = [gate; up] rows, [E, 2I, H]; w2 [E, H, I]), the routing weights
applied once, and two GEMMs per forward, each through its problem's dispatched winner bound to
the weight once (`Dispatcher.bind` → BoundTable):

* fused (default): w13 with the SwiGLU epilogue ([M, top_k, I]) and w2 with the routing weights
  applied and the top_k slots summed ([M, H]) — the `swiglu` and `reduce` problem variants;
* unfused (`fused=False`, for comparison): the plain w13 and w2 problems, SiLU·up and the weighted
  top_k sum in torch.

Separate gate/up global scales (ModelOpt stores `weight_scale_2` per gate_proj and up_proj) are
kept exact: w13 carries the gate scale on both halves, so its up half comes out × gate/up; that
factor is linear through silu(gate)·up and through w2, so w2's per-expert global scale takes
up/gate and the block's output is unchanged (an fp32 product per expert, no requantization).

Expert parallelism: `expert_map` [E_global] gives each global expert id its local index or -1
(not on this rank); such slots contribute nothing and cost no work (every MoE member treats -1
so). One routing alignment per layer: when both GEMMs' moe_decode launchers take the aligned
route, one `moe_align` launch (at the larger BLOCK_M, regrouped for the smaller) serves both.

Shared expert (`shared=(w13_s, w2_s[, up_scale_s])`, 2-D [2I_s, H] and [H, I_s]), two forms:

* folded (default where it can be: I_s = I, the routed experts' format; the only form for W4A4
  activations, which FP4MLP does not run): stacked once at construction as local expert E (E+1
  experts; the stacked tensors replace the separate ones), and every token's routing gains one
  slot (id E, weight 1.0), so the same two calls do routed + shared work: problems moe(…, E+1,
  top_k+1). Always local under an expert_map. cuda `moe_mma` adds that slot itself (`shared_slot`)
  where neither launcher takes a routing alignment (small M); otherwise the slot is concatenated
  per call and one alignment serves both. Folded is the faster form at decode sizes; docs/fp4moe.md
  gives the measurements.
* apart (`fold_shared=False`, or I_s ≠ I): an `FP4MLP` of its own (`.shared_mlp`: the dense
  `swiglu` gate_up and the down problem, two kernels), its output added to the routed one.
"""
from __future__ import annotations

import itertools
import warnings
import weakref
from typing import Any, Mapping, NamedTuple, Sequence

import torch
from torch import Tensor, nn

from autotune.core import settings
from autotune.core.formats import FP4Weight, quantize
from autotune.core.operands import OperandError, check_layer_x, routing_checker
from autotune.core.problem import Problem
from autotune.runtime.dispatch import Dispatcher, default_dispatcher
from autotune.runtime import prefetch as PF
from autotune.runtime.layer_route import LayerRoute
from autotune.runtime.moe_weights import MoEWeights, _shared_mlp, _stack13, check_expert_map

_BLOCKS: "weakref.WeakValueDictionary[int, FP4MoE]" = weakref.WeakValueDictionary()
_IDS = itertools.count(1)
#: what an id outside [-1, E_global) becomes for the kernels: outside [-1, E) for every one of them
BAD_ID = -2


_SLOT, _NONE = {"shared_slot": True}, {}


class _Form(NamedTuple):
    """What FP4MoE's forward needs at one M, worked out once for the launchers serving it."""

    l13: Any
    l2: Any
    #: both launchers capture-safe (`Caps.capture_safe`)
    safe: bool
    #: both launchers range-check ids themselves (`Caps.checks_ids`)
    checks_ids: bool
    #: their `aligned_block_m` at this M
    need: tuple
    #: folded shared expert added by the kernels (`Caps.shared_slot`, no alignment)
    slot: bool
    #: w13's extras: `prefetch=` (w2's slices into L2), `scratch_out=True`
    extra: dict
    #: (prefetch_w2, l2_bytes) it was made under
    prefetch_key: tuple
    #: w13's kwargs with the shared slot
    slot_kw: dict
    #: the whole-layer route at this M (runtime/layer_route.py): (launcher, w13 pack, w2 pack), or None
    layer: Any = None


def _fused(activation: str, fused: bool, bias13: Tensor | None, bias2: Tensor | None) -> bool:
    """Whether the block runs the fused epilogues: they are silu·up without biases, so any other
    activation or a bias runs unfused; an unknown activation is the one-line error."""
    if activation not in ("silu", "swigluoai"):
        raise ValueError(f"FP4MoE activation must be 'silu' or 'swigluoai', got {activation!r}")
    return fused if activation == "silu" and bias13 is None and bias2 is None else False


class FP4MoE(nn.Module):
    """forward(x [M, H], topk_ids [M, top_k], topk_weights [M, top_k]) → [M, H] in x's dtype.
    topk_ids are global expert ids (or -1); with an expert_map they are mapped to this rank's."""

    def __init__(self, w13: FP4Weight, w2: FP4Weight, top_k: int, *, up_scale: Tensor | None = None,
                 expert_map: Tensor | None = None, fused: bool = True, dispatcher: Dispatcher | None = None,
                 shared: tuple | None = None, a_fmt: str = "bf16", activation: str = "silu",
                 bias13: Tensor | None = None, bias2: Tensor | None = None, swiglu_alpha: float = 1.702,
                 swiglu_limit: float = 7.0, fold_shared: bool | None = None, prefetch_w2: bool | None = None,
                 shared_a_fmt: str | None = None):
        """shared: the shared expert, folded in as expert E or apart (an FP4MLP, fold_shared=False);
        fold_shared=None folds where the shared expert fits the routed stack (I_s = I, one format:
        the faster form at decode sizes, docs/fp4moe.md) and always for W4A4 activations.
        a_fmt="nvfp4": the W4A4 problems (w13/w2 input_scale per expert). activation="swigluoai":
        gpt-oss's clamped SwiGLU on interleaved [gate, up] rows with biases bias13 [E, 2I] / bias2
        [E, H]; no kernel has that epilogue, so it runs unfused (plain grouped GEMMs, the activation,
        biases, routing weights and the top_k sum in torch). prefetch_w2 (default $AUTOTUNE_PREFETCH_W2,
        off): where w13's kernel takes it (cuda moe_mma) and both kernels' bytes for the experts an M can
        touch fit in half the L2, w13 puts w2's slices of the routed experts into L2 (`prefetch=`)
        while it runs, so w2 reads L2 (docs/decisions/0004-prefetch-w2-off.md; a hint: the same bits either way)."""
        super().__init__()
        fused = _fused(activation, fused, bias13, bias2)
        mw = MoEWeights.of(w13, w2, up_scale=up_scale, shared=shared, fold_shared=fold_shared, a_fmt=a_fmt,
                           bias13=bias13, bias2=bias2, shared_a_fmt=shared_a_fmt)
        self._hold(mw, top_k, fused, a_fmt, shared is not None)
        self.activation, self.swiglu_alpha, self.swiglu_limit = activation, float(swiglu_alpha), float(swiglu_limit)
        self._hold_routing(expert_map)
        self._words: dict[str, Tensor] = {}
        #: $AUTOTUNE_CHECK_IDS at construction: read the bad-id word after every eager forward and raise
        self.check_ids = settings.check_ids()
        self.problem13, self.problem2 = mw.problems(top_k, a_fmt, fused)
        #: per M: the forward's `_Form`
        self._forms: dict[int, _Form] = {}
        #: w13 prefetches w2's routed slices into L2 where it can and it pays (`prefetch_w2` above)
        self.prefetch_w2 = settings.prefetch_w2() if prefetch_w2 is None else bool(prefetch_w2)
        #: the L2 bytes the prefetch rule budgets against (None: the device's, read once per device)
        self.l2_bytes: int | None = None
        self._bind(dispatcher or default_dispatcher(), mw)
        self._aligners: dict[int, object] = {}
        _BLOCKS[self.layer_id] = self

    # ---- construction, by responsibility -------------------------------------------------------
    def _hold(self, mw: MoEWeights, top_k: int, fused: bool, a_fmt: str, has_shared: bool) -> None:
        """The block's sizes and formats from its weights, and the weights as its buffers (`BufferLayout`)."""
        self.num_experts, self.top_k, self.hidden, self.intermediate, self.fused = mw.experts, top_k, mw.hidden, \
            mw.intermediate, fused
        self.routed_experts, self.has_shared, self.shared_folded = mw.routed, has_shared, mw.shared_folded
        self._layout = mw.layout
        self.w13_fmt = mw.w13.fmt
        for name, t in mw.buffers().items():
            self.register_buffer(name, t)
        self.a_fmt = a_fmt

    def _hold_routing(self, expert_map: Tensor | None) -> None:
        """The routing the block takes: the checked expert_map as a buffer (or None), the global id
        range, the device id table (`_extended_map`) and the per-call check of ids and weights."""
        self.global_experts = self.routed_experts if expert_map is None else int(expert_map.numel())
        if expert_map is not None:
            check_expert_map(expert_map, self.routed_experts)
            self.register_buffer("expert_map", expert_map.to(torch.int32).contiguous())
        else:
            self.expert_map = None
        self._map_ext = self._extended_map()
        self._routing = Problem.moe(2 * self.intermediate, self.hidden, self.global_experts, self.top_k,
                                    w_fmt=self.w13_fmt)    # the ids' own range
        self._check_routing = routing_checker(self._routing)

    def _bind(self, d: Dispatcher, mw: MoEWeights) -> None:
        """Both grouped problems bound to their weights through dispatcher `d` (and the shared
        expert's FP4MLP where it runs apart), under this layer's id; the hooks that keep the
        bindings true to the bytes across `.to()`, `state_dict` and `load_state_dict`."""
        self._dispatcher = d
        self.layer_id = next(_IDS)
        self.label = f"FP4MoE#{self.layer_id} {self.problem13.key}"
        if not self.fused and d.batch_invariant:
            raise ValueError("FP4MoE(fused=False) sums the top_k slots in torch, whose order is not guaranteed "
                             "the same at every M: batch-invariant mode needs fused=True")
        self.bound13 = d.bind(self.problem13, self.w13, bad_word=self._word)
        self.bound2 = d.bind(self.problem2, self.w2, bad_word=self._word)
        self.shared_mlp = None if mw.apart is None else _shared_mlp(mw.apart, mw.w13, d, mw.apart_a_fmt)
        self.layer_route = LayerRoute(d, self.problem13, self.problem2, d.env.device) if self.fused else None
        # load_state_dict copies bytes in place: bind again so no packed copy keeps the old numbers
        self.register_load_state_dict_post_hook(lambda mod, _keys: mod._rebind())
        # a one-copy binding may hold the cuda grouped layout in the buffers' own bytes: neither saved
        # as checkpoint bytes nor loaded over (both would give wrong numbers, silently)
        self._register_state_dict_hook(lambda mod, *_: mod._check_checkpoint("state_dict"))
        self._register_load_state_dict_pre_hook(lambda *_: self._check_checkpoint("load_state_dict"))

    def _weight(self, name: str) -> FP4Weight:
        return self._layout.weight(self, name)

    def _check_checkpoint(self, what: str) -> None:
        held = [f"{n} ({b.held})" for n, b in (("w13", self.bound13), ("w2", self.bound2)) if b.held is not None]
        if held:
            raise RuntimeError(f"{self.label}: {what}: the layer's bytes hold another layout: {', '.join(held)} "
                               f"(one_copy packed them in place); the checkpoint layout is gone")

    @property
    def w13(self) -> FP4Weight:
        return self._weight("w13")

    @property
    def w2(self) -> FP4Weight:
        """w2 with up/gate folded into its global scale when the checkpoint's differ."""
        return self._weight("w2")

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        self._rebind()
        return out

    def _rebind(self) -> None:
        """After `.to()` or `load_state_dict` (bytes copied in place, an expert_map included):
        check the map again and bind again, so nothing keeps the old numbers."""
        if self.expert_map is not None:
            check_expert_map(self.expert_map, self.routed_experts)
        self._map_ext = self._extended_map()
        self.bound13.rebind(self.w13)
        self.bound2.rebind(self.w2)

    def _extended_map(self) -> Tensor | None:
        """The id table, indexed by clamp(id + 2, 0, E_global + 2): [BAD, -1, expert_map (or the
        identity over the routed experts when only the shared expert is folded in), BAD], so id -1
        maps to -1, a global id to its local one, and any id outside [-1, E_global) to BAD (-2:
        outside [-1, E) for every kernel, also with the shared expert's id E) — no index wraps and
        nothing is read on the host. None: no map, no folded expert (ids go to the kernels as they are)."""
        m = self.expert_map
        if m is None and not self.shared_folded:
            return None
        m = m if m is not None else torch.arange(self.routed_experts, dtype=torch.int32, device=self.w13_packed.device)
        bad = m.new_full((1,), BAD_ID)
        return torch.cat([bad, m.new_full((1,), -1), m, bad])

    # ---- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_float(cls, gate: Tensor, up: Tensor, down: Tensor, top_k: int, fmt: str = "nvfp4", **kw) -> "FP4MoE":
        """From dense experts gate/up [E, I, H] and down [E, H, I], each quantized on its own (as
        ModelOpt does: separate gate and up global scales)."""
        g, u, d = quantize(gate, fmt), quantize(up, fmt), quantize(down, fmt)
        return cls(_stack13(g, u), d, top_k, up_scale=u.global_scale if fmt == "nvfp4" else None, **kw)

    @classmethod
    def from_modelopt(cls, source: str | Mapping[str, Tensor], prefix: str, experts: Sequence[int], top_k: int, *,
                      device: str = "cpu", shared_experts: bool | str = False, **kw) -> "FP4MoE":
        """From a ModelOpt NVFP4 checkpoint (a .safetensors path or a dict): experts
        `{prefix}.experts.{e}.{gate_proj,up_proj,down_proj}` for e in `experts` (this rank's, in
        local order; pass `expert_map` for the global ids). `shared_experts=True` also takes
        `{prefix}.shared_experts.*` (DeepSeek-V3 / GLM-5 naming; a string names another module) as
        `shared=`, with its own gate and up global scales (apart unless fold_shared=True)."""
        from autotune.runtime.pretrained import one_linear

        def one(name: str) -> FP4Weight:          # the checkpoint reader, W4A16 (from_pretrained does W4A4)
            w = one_linear(source, name, device)
            return FP4Weight(w.packed, w.scales, w.global_scale, w.fmt)

        def load(name: str) -> FP4Weight:
            ws = [one(f"{prefix}.experts.{e}.{name}") for e in experts]
            if not ws:
                raise ValueError("FP4MoE.from_modelopt needs at least one expert")
            return FP4Weight(torch.stack([w.packed for w in ws]), torch.stack([w.scales for w in ws]),
                             torch.stack([w.global_scale for w in ws]), "nvfp4")
        if shared_experts:
            if "shared" in kw:
                raise ValueError("FP4MoE.from_modelopt: give shared_experts= or shared=, not both")
            mod = f"{prefix}.{'shared_experts' if shared_experts is True else shared_experts}"
            sg, su = one(f"{mod}.gate_proj"), one(f"{mod}.up_proj")
            kw["shared"] = (_stack13(sg, su), one(f"{mod}.down_proj"), su.global_scale)
        g, u = load("gate_proj"), load("up_proj")
        return cls(_stack13(g, u), load("down_proj"), top_k, up_scale=u.global_scale, **kw)

    # ---- forward --------------------------------------------------------------------------------
    def forward(self, x: Tensor, topk_ids: Tensor, topk_weights: Tensor) -> Tensor:
        check_layer_x(self.problem13.key, x)
        if x.ndim != 2 or x.shape[1] != self.hidden:
            raise OperandError(f"{self.problem13.key}: x is {x.dtype} {'x'.join(map(str, x.shape))}, expected "
                               f"M x {self.hidden}")
        xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
        if torch.compiler.is_compiling():
            y = torch.ops.fp4_autotune.moe_block(xb, topk_ids, topk_weights, self.layer_id)
        else:
            y = self._run(xb, topk_ids, topk_weights)
        return y if x.dtype == torch.bfloat16 else y.to(x.dtype)

    def local_ids(self, topk_ids: Tensor) -> Tensor:
        """Global ids → this rank's (−1 stays −1, an id outside [-1, E_global) becomes BAD = -2);
        device ops only."""
        if self._map_ext is None:
            return topk_ids
        return self._map_ext[(topk_ids.long() + 2).clamp_(0, self.global_experts + 2)]

    # ---- bad ids: sticky on the device, read on request --------------------------------------
    def _word(self, device) -> Tensor:
        """This layer's sticky bad-id word on `device` (the dispatcher's status page): its kernels
        set it for ids outside [-1, E), and so does the block's own device check."""
        key = str(device)
        w = self._words.get(key)
        if w is None:
            w = self._words[key] = self._dispatcher.scratch.word(device, self.label)
        return w

    def routing_errors(self, clear: bool = True) -> list[str]:
        """[self.label] when a forward since the last read saw an expert id outside [-1, E_global)
        (its token's row came out NaN), else []. One 4-byte device→host read per device — a host
        sync: call it once per step (after a graph replay too) or in debug, never per forward.
        clear=True resets the word (read-and-clear); clear=False leaves it set (sticky until a
        clearing read). `Dispatcher.routing_errors()` reads every layer's word at once."""
        hit = False
        for w in self._words.values():      # one word per device the layer ran on (usually one)
            if bool(w.ne(0).any().cpu()):
                hit = True
                if clear:
                    w.zero_()
        return [self.label] if hit else []

    def _run(self, x: Tensor, topk_ids: Tensor, topk_weights: Tensor) -> Tensor:
        m = x.shape[0]
        l13, l2 = self.bound13.launcher(m), self.bound2.launcher(m)
        form = self._forms.get(m)
        if form is None or form.l13 is not l13 or form.l2 is not l2 or form.prefetch_key != (self.prefetch_w2, self.l2_bytes):
            form = self._form(m, l13, l2, x.device)
        _, _, safe, checks_ids, need, slot, extra, _, slot_kw, layer = form       # one unpack, named
        # asked only where it matters (a launcher that cannot be captured, the opt-in raise): ~1 µs on a GPU host
        capturing = ((not safe or self.check_ids) and x.is_cuda and torch.cuda.is_current_stream_capturing())
        if capturing and not safe:
            raise RuntimeError("fp4_autotune: a kernel of this MoE block reads routing on the host and cannot "
                               "run under CUDA-graph capture")
        if topk_weights is None:
            raise OperandError(f"{self.problem2.key}: FP4MoE needs topk_weights [M, {self.top_k}]")
        # shape, dtype and device only: the ids' values are never read on the host (issue #26)
        self._check_routing(x, topk_ids, topk_weights)
        ids, bad_rows = self._routed_ids(topk_ids, checks_ids, x.device, table=not slot or self.expert_map is not None)
        if self.shared_folded and not slot:  # every token also routed to local expert E, weight 1
            ids = torch.cat([ids, ids.new_full((m, 1), self.routed_experts)], 1)
            topk_weights = torch.cat([topk_weights, topk_weights.new_ones((m, 1))], 1)
        if slot:
            k13, k2 = slot_kw, _SLOT
        elif None in need:                   # no shared alignment: w13's extras as they are (no dict per call)
            k13, k2 = extra, _NONE
        else:
            k13, k2 = self._one_alignment(l13, l2, ids, need)
            k13 = {**k13, **extra}
        if layer is not None:                # both GEMMs in one launch (the folded shared expert its slot)
            y = layer[0](x, layer[1], layer[2], ids, topk_weights, shared_slot=slot)
        elif self.fused:
            h = l13(x, ids, None, routing_checked=True, **k13)
            y = l2(h, ids, topk_weights, routing_checked=True, **k2)
        else:
            y13 = l13(x, ids, None, routing_checked=True, **k13)
            if self.activation == "swigluoai" or self.bias13 is not None or self.bias2 is not None:
                y = self._unfused_biased(l2, y13, ids, topk_weights, k2)
            else:
                h = torch.nn.functional.silu(y13[..., :self.intermediate]) * y13[..., self.intermediate:]
                y2 = l2(h, ids, topk_weights, routing_checked=True, **k2)
                y = y2.sum(1, dtype=torch.float32).to(torch.bfloat16)
        if self.shared_mlp is not None:     # the shared expert apart: its two kernels, then one add
            y = y + self.shared_mlp(x)
        if bad_rows is not None:            # the kernels' contract, where they cannot keep it themselves
            y = y.masked_fill(bad_rows[:, None], float("nan"))
        if self.check_ids and not capturing and self.routing_errors():
            raise OperandError(f"{self._routing.key}: topk_ids hold expert ids outside [-1, {self.global_experts}) "
                               f"(their rows are NaN; {settings.CHECK_IDS}=1 raises)")
        return y

    def _form(self, m: int, l13, l2, device) -> _Form:
        """The forward's `_Form` at M for these launchers (kept per M, up to 256 of them)."""
        c13, c2 = l13.caps, l2.caps
        # folded: both kernels add expert E as each token's last slot (no cat, no id table without a map)
        # (where a launcher aligns the routing, M large, the slot is concatenated and one alignment serves both)
        need = (l13.aligned_block_m(m), l2.aligned_block_m(m))
        slot = self.shared_folded and c13.shared_slot and c2.shared_slot and need == (None, None)
        # w13's extras on the fused path: w2's slices into L2 (prefetch_w2), and h in the dispatcher's
        # scratch pool (read by w2 at once on this stream: no allocation per call)
        extra = {"prefetch": pf} if (pf := self._prefetch(l13, l2, m, device)) is not None else {}
        if self.fused and c13.scratch_out:
            extra["scratch_out"] = True
        layer = self.layer_route.for_m(m, self.bound13, self.bound2) if self.layer_route is not None else None
        if layer is not None:                # its caps stand for both launchers'; its bad-id word is read too
            c13, c2, need, slot, extra = layer[0].caps, layer[0].caps, (None, None), self.shared_folded, {}
            self._words[f"{device}:layer:{id(layer[0])}"] = layer[0].bad_word()
        form = _Form(l13, l2, c13.capture_safe and c2.capture_safe, c13.checks_ids and c2.checks_ids, need, slot,
                     extra, (self.prefetch_w2, self.l2_bytes), {"shared_slot": True, **extra}, layer)
        if len(self._forms) < 256:           # per M, for the launchers serving it now (a rebind replaces them)
            self._forms[m] = form
        return form

    def _routed_ids(self, topk_ids: Tensor, checks_ids: bool, device, table: bool = True) -> tuple[Tensor, Tensor | None]:
        """(the kernels' ids, None or the [M] rows to make NaN), with no host read. Launchers that
        check ids (`Caps.checks_ids`: NaN rows and the layer's word for ids outside [-1, E)) get them as
        they are, or through the id table (expert_map / folded shared expert), where a bad id
        becomes BAD. For others (the torch family, moe_w4a16) the block does it itself on the
        device: bad ids become -1 for the kernels, the word is set and the rows are made NaN."""
        if checks_ids:                              # table=False: a shared slot's kernels range-check E - 1 themselves
            return (self.local_ids(topk_ids) if table else topk_ids), None
        bad = (topk_ids < -1) | (topk_ids >= self.global_experts)
        rows = bad.any(1)
        word = self._word(device)
        word.bitwise_or_(rows.any().to(word.dtype))
        return self.local_ids(topk_ids.masked_fill(bad, -1)), rows

    def _unfused_biased(self, l2, y13: Tensor, ids: Tensor, topk_weights: Tensor, k2: dict) -> Tensor:
        """gpt-oss: + bias13, clamped SwiGLU on interleaved rows, w2 (plain), + bias2, routing
        weights, top_k sum — in fp32 (torch), around the two dispatched grouped GEMMs."""
        from autotune.runtime.pretrained import clamped_swiglu
        live = ((ids >= 0) & (ids < self.num_experts))[..., None]      # a bad id's row is NaN already
        safe = ids.clamp(0, self.num_experts - 1).long()
        y = y13.float()
        if self.bias13 is not None:
            y = y + self.bias13[safe] * live
        h = clamped_swiglu(y, self.swiglu_alpha, self.swiglu_limit) if self.activation == "swigluoai" else \
            torch.nn.functional.silu(y[..., :self.intermediate]) * y[..., self.intermediate:]
        y2 = l2(h.to(torch.bfloat16), ids, None, routing_checked=True, **k2).float()
        if self.bias2 is not None:
            y2 = y2 + self.bias2[safe] * live
        y2 = y2 * (topk_weights.float()[..., None] * live)
        return y2.sum(1).to(torch.bfloat16)

    @classmethod
    def from_pretrained(cls, path, block: str, *, top_k: int | None = None, tp_rank: int = 0, tp_size: int = 1,
                        experts: Sequence[int] | None = None, ep_rank: int = 0, ep_size: int = 1,
                        shared_experts: bool | str | None = None, activations: str | None = None, arch=None,
                        device: str = "cpu", fused: bool = True, dispatcher: Dispatcher | None = None,
                        fold_shared: bool | None = None) -> "FP4MoE":
        """One MoE block of a checkpoint (directory / .safetensors / index.json), this rank's part:
        routed experts `experts` (global ids) or the contiguous E/ep_size block of ep_rank (an
        expert_map then maps global ids), the expert intermediate split over tp_size, the shared
        expert included where the checkpoint quantizes it (shared_experts=None: auto), apart as an
        FP4MLP (W4A16) or folded in (W4A4, or fold_shared=True). Per-expert
        `experts.{e}.{gate,up,down}_proj`, ModelOpt's stacked bmm experts and gpt-oss's MXFP4
        `*_blocks` (interleaved rows, biases, clamped SwiGLU alpha 1.702, limit 7, unfused).
        shared_experts=False and `FP4MLP.from_pretrained(path, f"{block}.shared_experts")` run the
        shared expert apart (two kernels, its SiLU·up in the gate_up's epilogue).
        activations: "auto" | "w4a4" | "w4a16" (autotune.runtime.activations)."""
        from autotune.runtime.pretrained import load_moe
        kw = load_moe(path, block, top_k=top_k, tp_rank=tp_rank, tp_size=tp_size, experts=experts, ep_rank=ep_rank,
                      ep_size=ep_size, shared_experts=shared_experts, activations=activations, arch=arch, device=device)
        apart = kw.pop("shared_apart", None)      # routed and shared experts differ in activation format
        if apart is not None:
            if fold_shared:
                raise ValueError(f"{block}: fold_shared=True, but {apart}")
            fold_shared = False
            warnings.warn(f"{block}: {apart}; the shared expert runs apart (an FP4MLP, "
                          f"{'W4A4' if kw.get('shared_a_fmt') == 'nvfp4' else 'W4A16'})", stacklevel=2)
        return cls(kw.pop("w13"), kw.pop("w2"), kw.pop("top_k"), fused=fused, dispatcher=dispatcher,
                   fold_shared=fold_shared, **kw)

    def _prefetch(self, l13, l2, m: int, device) -> tuple | None:
        """w2's stacked weight tensors for w13's `prefetch=` at M, or None (runtime/prefetch.py's rule)."""
        if not (self.prefetch_w2 and self.fused and l13.caps.prefetches) or l13.aligned_block_m(m):
            return None
        return PF.pair_for(l13, l2, self.num_experts, m * self.problem13.top_k, self.l2_bytes, device)

    def _one_alignment(self, l13, l2, ids: Tensor, need: tuple) -> tuple[dict, dict]:
        """One routing alignment per layer when both launchers take one as `aligned=` (`need`: their
        `aligned_block_m` at this M; made by the launcher that needs the larger BLOCK_M, regrouped for
        the other); {} otherwise."""
        if None in need:
            return {}, {}
        bm = max(need)
        aligner = self._aligners.get(bm)
        if aligner is None:
            owner = l13 if need[0] == bm else l2
            aligner = self._aligners[bm] = owner.aligner(self.num_experts, bm)
        al = aligner(ids)
        return {"aligned": al.regroup(need[0])}, {"aligned": al.regroup(need[1])}

    def warmup(self, ms: Sequence[int]) -> None:
        """Run every kernel these batch sizes reach (before CUDA-graph capture), largest first."""
        dev = self.w13_packed.device
        for m in sorted(set(ms), reverse=True):
            x = torch.randn(m, self.hidden, device=dev).to(torch.bfloat16)
            ids = (torch.arange(m * self.top_k, device=dev).reshape(m, self.top_k) % self.global_experts)
            self._run(x, ids.to(torch.int32), torch.full((m, self.top_k), 1.0 / self.top_k, device=dev))

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Every problem this block dispatches: w13 and w2, and the shared expert's two when apart."""
        return (self.problem13, self.problem2) + (self.shared_mlp.problems if self.shared_mlp is not None else ())

    def extra_repr(self) -> str:
        shared = " + shared folded in" if self.shared_folded else ""
        return (f"{self.problem13.key} + {self.problem2.key}, experts {self.routed_experts}/{self.global_experts}"
                f"{shared}")

    @staticmethod
    def shared_from_float(gate: Tensor, up: Tensor, down: Tensor, fmt: str = "nvfp4") -> tuple:
        """`shared=` from a dense shared expert gate/up [I, H], down [H, I], quantized like from_float."""
        g, u, d = quantize(gate, fmt), quantize(up, fmt), quantize(down, fmt)
        return _stack13(g, u), d, (u.global_scale if fmt == "nvfp4" else None)


def _block(layer_id: int) -> FP4MoE:
    try:
        return _BLOCKS[layer_id]
    except KeyError:
        raise RuntimeError(f"fp4_autotune: MoE block {layer_id} no longer exists") from None


@torch.library.custom_op("fp4_autotune::moe_block", mutates_args=())
def _moe_block_impl(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, layer_id: int) -> Tensor:
    return _block(layer_id)._run(x, topk_ids, topk_weights)


@_moe_block_impl.register_fake
def _moe_block_fake(x: Tensor, topk_ids: Tensor, topk_weights: Tensor, layer_id: int) -> Tensor:
    return x.new_empty((x.shape[0], _block(layer_id).hidden), dtype=torch.bfloat16)
