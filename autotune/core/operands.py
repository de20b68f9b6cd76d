"""The one operand check every kernel entry shares: what a call is given against its Problem.

Split by cost so the hot path pays only for what can change between calls:
  check_weight    once per weight (bind time, layer load, or per call in the unbound form)
  check_x         per call: a few attribute reads (shape, dtype, device)
  check_routing   per MoE call: shape and dtype; values (ids in [-1, E)) are read where the ids
                  already are on the host, else checked on the device without a host sync
  check_layer_x   per layer forward (FP4Linear, FP4GroupedGEMM, FP4MoE): the activation dtypes a
                  layer takes (it computes in bf16 and returns x's dtype)
Every failure is one line that names what was expected and what came. The accepted dtypes are
the two tables below, stated once in docs/serving.md ("Accepted inputs"), whose table
tests/test_input_contract.py runs every entry against.
"""
from __future__ import annotations

from typing import Any

import torch

from autotune.core.formats import held_layout
from autotune.core.problem import Problem

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
#: x a kernel entry (dispatch's kernel, a bound launcher) takes, per the problem's activation
#: format: bf16 as is; a W4A4 kernel (nvfp4/mxfp4 activations) quantizes bf16 itself; an fp8
#: path takes bf16 (quantized per tensor on the fly) or e4m3 already quantized. No cast anywhere:
#: anything else (fp16, fp32, integer, bool) is refused, never converted.
KERNEL_X: dict[str, tuple[torch.dtype, ...]] = {
    "bf16": (torch.bfloat16,), "nvfp4": (torch.bfloat16,), "mxfp4": (torch.bfloat16,),
    "fp8": (torch.bfloat16, torch.float8_e4m3fn)}
#: x the FP4 layers take: cast to bf16 for the kernel, the result cast back to x's dtype (both
#: exact or rounding only). Integer and bool inputs are refused: a cast would compute garbage.
LAYER_X: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
#: id meaning "this expert is not on this rank" (vLLM's expert_map): no contribution, no work
NO_EXPERT = -1


class OperandError(ValueError):
    """An operand that does not match its problem."""


def _shape(t: Any) -> str:
    return "x".join(map(str, getattr(t, "shape", ()))) or "scalar"


def check_weight(problem: Problem, w: Any) -> None:
    """`w` (an FP4Weight or a family's packed form of one) holds this problem's weight."""
    fmt = getattr(w, "fmt", None)
    packed = getattr(w, "packed", None)
    if packed is None or fmt is None:
        raise OperandError(f"{problem.key}: expected an FP4 weight, got {type(w).__name__}")
    if fmt != problem.w_fmt:
        raise OperandError(f"{problem.key}: weight format is {fmt}, the problem's is {problem.w_fmt}")
    want = (problem.n, problem.k // 2)
    if problem.kind == "grouped_moe":
        want = (problem.experts, *want)
    if tuple(packed.shape) != want:
        lead = "E x " if problem.kind == "grouped_moe" else ""
        raise OperandError(f"{problem.key}: weight packed {_shape(packed)} does not match the problem's "
                           f"{'x'.join(map(str, want))} ({lead}N x K/2)")
    if packed.device.type == "meta":
        raise OperandError(f"{problem.key}: the weight is on the meta device")
    held = held_layout(packed)
    if held is not None and getattr(w, "layout", None) != held:
        raise OperandError(f"{problem.key}: the weight's bytes hold the {held} layout (packed in place by a "
                           f"one-copy layer), not the checkpoint's; only that layout's pack can be bound")


def x_per_pair(problem: Problem, x: Any) -> bool:
    """Does x hold one row per (token, slot), [M, top_k, K]? Always for the reduce epilogue (w2
    reads each slot's own activation); a plain grouped_moe problem takes [M, K] or [M, top_k, K]."""
    return problem.epilogue == "reduce" or (problem.kind == "grouped_moe" and problem.epilogue == "none"
                                            and getattr(x, "ndim", 0) == 3)


def check_x(problem: Problem, x: Any, w: Any) -> None:
    """Activations [M, K] (or [M, top_k, K], one row per routed pair) in the problem's dtype, on the
    weight's device."""
    if not isinstance(x, torch.Tensor):
        raise OperandError(f"{problem.key}: x must be a tensor, got {type(x).__name__}")
    if x_per_pair(problem, x):
        if x.ndim != 3 or x.shape[1:] != (problem.top_k, problem.k):
            raise OperandError(f"{problem.key}: x is {_shape(x)}, expected M x {problem.top_k} x {problem.k} "
                               "(one row per token and slot)")
    elif x.ndim != 2 or x.shape[1] != problem.k:
        raise OperandError(f"{problem.key}: x is {_shape(x)}, expected M x {problem.k}")
    want = KERNEL_X[problem.a_fmt]
    if x.dtype not in want:
        raise OperandError(f"{problem.key}: x is {x.dtype}, expected {' or '.join(map(str, want))}")
    dev = w.packed.device
    if x.device != dev:
        raise OperandError(f"{problem.key}: x is on {x.device}, the weight on {dev}")
    if x.device.type == "meta":
        raise OperandError(f"{problem.key}: x is on the meta device")


def x_checker(problem: Problem, w: Any):
    """`check(x)`: check_x for one bound weight, with the common case answered by four attribute
    reads (dtype, the shape past M, device index) and check_x's one-line error for anything else.
    The shape past M is (K,), or (top_k, K) for the grouped `reduce` variant (one row per pair); a
    grouped plain problem's [M, top_k, K] form takes check_x."""
    want = KERNEL_X[problem.a_fmt][0]           # the common dtype; check_x accepts the others
    k, dev = problem.k, w.packed.device
    tail = (problem.top_k, k) if problem.kind == "grouped_moe" and problem.epilogue == "reduce" else (k,)
    idx = dev.index if dev.type == "cuda" else None

    if dev.type not in ("cpu", "cuda"):
        def check(x: Any) -> None:
            check_x(problem, x, w)
        return check
    if idx is None:
        def check_cpu(x: Any) -> None:
            if x.__class__ is not torch.Tensor or x.dtype is not want or x.shape[1:] != tail or not x.is_cpu:
                check_x(problem, x, w)
        return check_cpu

    def check_cuda(x: Any) -> None:
        if x.__class__ is not torch.Tensor or x.dtype is not want or x.shape[1:] != tail or not x.is_cuda \
                or x.get_device() != idx:
            check_x(problem, x, w)
    return check_cuda


def check_layer_x(key: str, x: Any) -> None:
    """The FP4 layers' activation check (before any cast): a tensor of a LAYER_X dtype. One
    attribute compare on the accepted path; integer, bool, fp64 and fp8 are refused in one line."""
    if not isinstance(x, torch.Tensor):
        raise OperandError(f"{key}: x must be a tensor, got {type(x).__name__}")
    if x.dtype not in LAYER_X:
        raise OperandError(f"{key}: x is {x.dtype}; the FP4 layers take torch.bfloat16, torch.float16 or "
                           "torch.float32 (computed in bf16, returned in x's dtype), never an integer or bool cast")


def out_checker(problem: Problem):
    """`check(x, out)`: check_out for a dense bound launcher, the common case answered by attribute
    reads (class, dtype, shape, same device as x) and check_out's one-line error for anything else."""
    want, n = _DTYPES[problem.out_dtype], problem.out_n

    def check(x: Any, out: Any) -> None:
        if out.__class__ is not torch.Tensor or out.dtype is not want or out.ndim != 2 or out.shape[1] != n \
                or out.shape[0] != x.shape[0] or out.get_device() != x.get_device() or out.is_meta:
            check_out(problem, x, out)
    return check


def check_routing(problem: Problem, x: torch.Tensor, topk_ids: Any, topk_weights: Any = None,
                  values: bool = True) -> None:
    """topk_ids [M, top_k] integer ids in [-1, E); topk_weights [M, top_k] when given. values=False:
    shape, dtype and device only (for a kernel that checks the ids itself)."""
    m = x.shape[0]
    if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype.is_floating_point or topk_ids.dtype == torch.bool:
        raise OperandError(f"{problem.key}: topk_ids must be an integer tensor, got "
                           f"{getattr(topk_ids, 'dtype', type(topk_ids).__name__)}")
    if tuple(topk_ids.shape) != (m, problem.top_k):
        raise OperandError(f"{problem.key}: topk_ids is {_shape(topk_ids)}, expected {m}x{problem.top_k}")
    if topk_ids.device != x.device:
        raise OperandError(f"{problem.key}: topk_ids is on {topk_ids.device}, x on {x.device}")
    if topk_weights is not None:
        if not isinstance(topk_weights, torch.Tensor) or tuple(topk_weights.shape) != (m, problem.top_k):
            raise OperandError(f"{problem.key}: topk_weights is {_shape(topk_weights)}, expected "
                               f"{m}x{problem.top_k}")
        if topk_weights.device != x.device:
            raise OperandError(f"{problem.key}: topk_weights is on {topk_weights.device}, x on {x.device}")
        if not topk_weights.is_floating_point():
            raise OperandError(f"{problem.key}: topk_weights must be floating point, got {topk_weights.dtype}")
    if topk_ids.numel() == 0 or not values:
        return
    if topk_ids.device.type == "cpu":
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < NO_EXPERT or hi >= problem.experts:
            bad = lo if lo < NO_EXPERT else hi
            raise OperandError(f"{problem.key}: expert id {bad} outside [-1, {problem.experts}) "
                               "(-1 = not on this rank)")
    elif topk_ids.device.type == "cuda":
        # no host sync: a device-side assert stops the stream instead of computing a wrong row
        torch._assert_async(((topk_ids >= NO_EXPERT) & (topk_ids < problem.experts)).all(),
                            f"{problem.key}: expert id outside [-1, {problem.experts})")


def routing_checker(problem: Problem):
    """`check(x, topk_ids, topk_weights)`: check_routing(values=False) for one layer, the common case
    (int32/int64 ids and float weights, [M, top_k] on x's device) answered by attribute reads and
    check_routing's one-line error for anything else."""
    shape_k, ok_ids = problem.top_k, (torch.int32, torch.int64)

    def check(x: torch.Tensor, topk_ids: Any, topk_weights: Any) -> None:
        dev, cuda, cpu = x.get_device(), x.is_cuda, x.is_cpu      # one device type and index, not just an index
        if (not (cuda or cpu) or topk_ids.__class__ is not torch.Tensor or topk_ids.dtype not in ok_ids
                or topk_ids.shape != (x.shape[0], shape_k) or topk_ids.get_device() != dev
                or topk_ids.is_cuda is not cuda or topk_ids.is_cpu is not cpu
                or (topk_weights is not None
                    and (topk_weights.__class__ is not torch.Tensor or not topk_weights.is_floating_point()
                         or topk_weights.shape != topk_ids.shape or topk_weights.get_device() != dev
                         or topk_weights.is_cuda is not cuda or topk_weights.is_cpu is not cpu))):
            check_routing(problem, x, topk_ids, topk_weights, values=False)
    return check


def check_operands(problem: Problem, x: Any, w: Any, topk_ids: Any = None, topk_weights: Any = None,
                   out: Any = None) -> None:
    """Everything a kernel call is given, checked against its problem (the unbound form)."""
    check_weight(problem, w)
    check_x(problem, x, w)
    if problem.kind == "grouped_moe":
        check_routing(problem, x, topk_ids, topk_weights)
    if out is not None:
        check_out(problem, x, out)


def out_shape(problem: Problem, m: int) -> tuple[int, ...]:
    if problem.kind != "grouped_moe":
        return (m, problem.out_n)           # dense: N, or N/2 after SwiGLU
    if problem.epilogue == "reduce":
        return (m, problem.n)
    return (m, problem.top_k, problem.out_n)


def check_out(problem: Problem, x: torch.Tensor, out: Any) -> None:
    want = out_shape(problem, x.shape[0])
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        raise OperandError(f"{problem.key}: out is {_shape(out)}, expected {'x'.join(map(str, want))}")
    if out.dtype != _DTYPES[problem.out_dtype] or out.device != x.device:
        raise OperandError(f"{problem.key}: out is {out.dtype} on {out.device}, expected "
                           f"{_DTYPES[problem.out_dtype]} on {x.device}")


class Checked:
    """`kernel(x, w, ...)` with every operand checked on each call (the unbound form, where the
    weight arrives per call). Bound launchers check the weight once instead (autotune.tactics.base).
    The kernel is a Launcher (autotune.tactics.base): its `caps` and the rest of the protocol pass through."""

    __slots__ = ("problem", "inner", "caps")

    def __init__(self, problem: Problem, kernel: Any):
        self.problem, self.inner, self.caps = problem, kernel, kernel.caps

    @property
    def smem_compiled(self) -> int | None:
        return self.inner.smem_compiled

    def aligned_block_m(self, m: int) -> int | None:
        return self.inner.aligned_block_m(m)

    def aligner(self, experts: int, block_m: int) -> Any:
        return self.inner.aligner(experts, block_m)

    def release(self) -> None:
        self.inner.release()

    def attach(self, scratch: Any = None, bad_word: Any = None) -> None:
        self.inner.attach(scratch, bad_word)

    def bad_word(self) -> Any:
        return self.inner.bad_word()


class _CheckedDense(Checked):
    __slots__ = ()

    def __call__(self, x, w, out=None):
        check_operands(self.problem, x, w, out=out)
        return self.inner(x, w, out=out)


class _CheckedMoE(Checked):
    __slots__ = ()

    def __call__(self, x, w, topk_ids, topk_weights=None, out=None):
        check_operands(self.problem, x, w, topk_ids, topk_weights, out)
        return self.inner(x, w, topk_ids, topk_weights, out=out)


def checked(problem: Problem, kernel: Any) -> Checked:
    return (_CheckedMoE if problem.kind == "grouped_moe" else _CheckedDense)(problem, kernel)
