"""Read FP4 weights from Hugging Face checkpoints: one reader for every loader.

    ck = Checkpoint.open("/ckpt/Model-NVFP4")     # a directory, one .safetensors, or an index.json
    w = ck.linear("model.layers.0.mlp.down_proj", tp_rank=1, tp_size=2, parallel="row")
    e = ck.experts("model.layers.3.mlp", experts=[4, 5, 6, 7])

Only the tensors a call names are read (`safe_open` per shard, lazily; `get_slice` reads only a
rank's rows or columns). The quantization is recognised from `config.json` /
`hf_quant_config.json` and each format maps exactly onto `FP4Weight`:

| producer | tensors per linear | FP4Weight |
|---|---|---|
| ModelOpt NVFP4 (`quant_algo: NVFP4`) | `weight` u8 [N, K/2], `weight_scale` e4m3 [N, K/16], `weight_scale_2` f32, `input_scale` f32 | as stored |
| compressed-tensors `nvfp4-pack-quantized` | `weight_packed`, `weight_scale`, `weight_global_scale` [1], `input_global_scale` [1] | global and input scales are the reciprocals: `1 / weight_global_scale`, `1 / input_global_scale` (fp32 division) |
| compressed-tensors `mxfp4-pack-quantized` | `weight_packed`, `weight_scale` u8 E8M0 [N, K/32] | global 1 |
| gpt-oss MXFP4 (`quant_method: mxfp4`) | stacked `*_blocks` u8 [E, N, K/32, 16], `*_scales` u8 [E, N, K/32], `*_bias` | global 1 |
| ModelOpt NVFP4, stacked experts (gpt-oss / Llama-4 bmm experts) | `gate_up_proj` u8 [E, K/2, N], `gate_up_proj_weight_scale` [E, K/16, N], `…_weight_scale_2`, `…_input_scale` | transposed to [E, N, K/2] (the packing runs along K) |

Anything else (FP8, int4, a mix of formats, no quantization config) is refused in one line that
names what was found. W4A4: a checkpoint whose scheme quantizes activations with a static scale
(ModelOpt NVFP4, compressed-tensors NVFP4 with `input_activations`) reports `scheme.w4a4`; the
static input scale rides on `FP4Weight.input_scale` (per expert for stacked experts).

Slicing (one rank's bytes): column-parallel splits N (rows; each row keeps its own scales),
row-parallel splits K on scale-block boundaries; a split that would cut a block (or leave ranks
unequal) is refused in one line. Expert parallelism reads only the listed experts.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal, Optional

import torch
from torch import Tensor

from autotune.core.formats import FORMATS, FP4Weight
from autotune.core.quant_config import (MODELOPT_NVFP4, CheckpointError, MissingTensor, QuantScheme, detect_quant,
                                        glob_rx)

__all__ = ["CheckpointError", "MissingTensor", "QuantScheme", "Checkpoint", "detect_quant", "shard_range",
           "MODELOPT_NVFP4"]

Parallel = Literal["column", "row", None]
#: a config.json / index.json is small; past this it is not one
_MAX_JSON = 64 << 20


def shard_range(size: int, rank: int, world: int, block: int, what: str) -> tuple[int, int]:
    """[start, stop) of `rank`'s equal share of `size` elements, on `block` boundaries, or refuse."""
    if not (isinstance(world, int) and world >= 1 and isinstance(rank, int) and 0 <= rank < world):
        raise CheckpointError(f"{what}: tp_rank {rank!r} is not in [0, tp_size={world!r})")
    if size % (world * block):
        per = size / world
        raise CheckpointError(f"{what}: {size} does not split into {world} equal shards of whole {block}-element "
                              f"blocks ({per:g} per rank{'' if per == int(per) else ''}); pick a tp_size that "
                              f"divides {size // block if size % block == 0 else size} blocks")
    per = size // world
    return rank * per, (rank + 1) * per


def _read_json(p: Path) -> dict:
    """A checkpoint's JSON (config.json, hf_quant_config.json, the index): bounded in size and
    depth (autotune.core.jsonread), every failure one CheckpointError line."""
    from autotune.core.jsonread import JSONLimitError, read
    try:
        d = read(p, max_bytes=_MAX_JSON)
    except JSONLimitError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{p}: top level must be a JSON object")
    return d


_ST_DTYPES = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float32: "F32", torch.bfloat16: "BF16",
              torch.float16: "F16", torch.int8: "I8", torch.int32: "I32", torch.float64: "F64"}


@dataclass
class _Tensor:
    file: Optional[Path]
    dtype: str
    shape: tuple[int, ...]


#: a quantizer scale (weight_scale_2, input_scale and their compressed-tensors reciprocals) lies in
#: [2^-96, 2^96]: beyond it an FP4 product (|e2m1 x e4m3| <= 2688) summed over K <= 2^20 leaves
#: bf16's range, so the layer would serve inf / 0 instead of refusing
_SCALE_EXP = 96


def _plausible(t: Tensor) -> Tensor:
    lo, hi = 2.0 ** -_SCALE_EXP, 2.0 ** _SCALE_EXP
    return torch.isfinite(t) & (t >= lo) & (t <= hi)


class Checkpoint:
    """A safetensors checkpoint opened lazily: the headers name every tensor's file, dtype and
    shape; bytes are read only when a loader asks for a tensor (or a slice of it)."""

    def __init__(self, root: Optional[Path], files: dict, config: Optional[dict], hf_quant: Optional[dict],
                 src: str, assume: Optional[QuantScheme] = None, tensors: Optional[dict] = None):
        self.root, self.src = root, src
        self._assume = assume
        self._tensors = tensors                  # an in-memory state dict instead of files
        self.config = config or {}
        self._hf_quant = hf_quant
        self._files = files                      # tensor name -> shard
        self._meta: dict[str, _Tensor] = {}
        self._open: dict[Path, object] = {}
        self._scheme: Optional[QuantScheme] = None
        self.reads: list[tuple[str, tuple]] = []  # (tensor, slice) pairs read: what a rank touched

    # ---- opening -------------------------------------------------------------------------------
    @classmethod
    def from_tensors(cls, tensors, scheme: QuantScheme, src: str = "tensors") -> "Checkpoint":
        """A state dict (name -> tensor) read through the same code as files."""
        return cls(None, {k: None for k in tensors}, None, None, src, scheme, dict(tensors))

    @classmethod
    def open(cls, path: str | os.PathLike, assume: Optional[QuantScheme] = None) -> "Checkpoint":
        """`assume`: the scheme to use when the checkpoint has no quantization config at all
        (a bare tensor file); a config that is present always wins."""
        p = Path(path)
        if p.is_dir():
            root = p
            idx = p / "model.safetensors.index.json"
            if idx.is_file():
                files = cls._from_index(idx)
            else:
                shards = sorted(q for q in p.glob("*.safetensors"))
                if not shards:
                    raise CheckpointError(f"{p}: directory has no model.safetensors.index.json and no .safetensors file")
                files = cls._from_headers(shards)
        elif p.is_file() and p.name.endswith(".index.json"):
            root, files = p.parent, cls._from_index(p)
        elif p.is_file() and p.suffix == ".safetensors":
            root, files = p.parent, cls._from_headers([p])
        elif p.exists():
            raise CheckpointError(f"{p}: not a checkpoint directory, .safetensors file or model.safetensors.index.json")
        else:
            raise CheckpointError(f"{p}: no such file or directory")
        cfg = _read_json(root / "config.json") if (root / "config.json").is_file() else None
        hq = _read_json(root / "hf_quant_config.json") if (root / "hf_quant_config.json").is_file() else None
        return cls(root, files, cfg, hq, str(p), assume)

    @staticmethod
    def _from_index(idx: Path) -> dict[str, Path]:
        wm = _read_json(idx).get("weight_map")
        if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
            raise CheckpointError(f"{idx}: no weight_map of tensor name -> shard file")
        out = {}
        for name, f in wm.items():
            shard = idx.parent / f
            if Path(f).is_absolute() or ".." in Path(f).parts:
                raise CheckpointError(f"{idx}: shard {f!r} of {name!r} lies outside the checkpoint directory")
            out[name] = shard
        missing = sorted({str(s.name) for s in out.values() if not s.is_file()})
        if missing:
            raise CheckpointError(f"{idx}: shard file(s) {', '.join(missing[:3])} named in the index are missing")
        return out

    @staticmethod
    def _from_headers(shards: Iterable[Path]) -> dict[str, Path]:
        from safetensors import safe_open
        out = {}
        for s in shards:
            try:
                with safe_open(str(s), framework="pt") as f:
                    names = list(f.keys())
            except Exception as e:       # safetensors raises its own SafetensorError
                raise CheckpointError(f"{s}: not a readable .safetensors file ({e})") from None
            for k in names:
                if k in out:             # which copy an engine loads depends on its file order
                    raise CheckpointError(f"{s}: tensor {k!r} is also in {out[k].name}; a checkpoint names each "
                                          f"tensor once (add a model.safetensors.index.json or remove one copy)")
                out[k] = s
        return out

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- what is in it -------------------------------------------------------------------------
    @property
    def scheme(self) -> QuantScheme:
        if self._scheme is None:
            cfg_q = (self.config or {}).get("quantization_config") is not None or self._hf_quant is not None
            if self._assume is not None and not cfg_q:
                self._scheme = self._assume
            else:
                self._scheme = detect_quant(self.config, self._hf_quant, self.src)
        return self._scheme

    def has(self, name: str) -> bool:
        return name in self._files

    def names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self._files if n.startswith(prefix))

    def excluded(self, module: str) -> bool:
        rx = glob_rx(self.scheme.exclude)
        return bool(rx is not None and rx.fullmatch(module))

    def meta(self, name: str) -> _Tensor:
        m = self._meta.get(name)
        if m is None:
            if name not in self._files:
                raise MissingTensor(f"{self.src}: tensor {name!r} is missing")
            if self._tensors is not None:
                t = self._tensors[name]
                m = self._meta[name] = _Tensor(None, _ST_DTYPES.get(t.dtype, str(t.dtype)), tuple(t.shape))
            else:
                sl = self._handle(self._files[name]).get_slice(name)
                m = self._meta[name] = _Tensor(self._files[name], sl.get_dtype(), tuple(sl.get_shape()))
        return m

    def _handle(self, f: Path):
        h = self._open.get(f)
        if h is None:
            from safetensors import safe_open
            try:
                h = self._open[f] = safe_open(str(f), framework="pt")
            except Exception as e:
                raise CheckpointError(f"{f}: not a readable .safetensors file ({e})") from None
        return h

    def read(self, name: str, index: tuple = ()) -> Tensor:
        """Tensor `name`, or only `index` (a tuple of slices / ints, leading dims first) of it."""
        self.meta(name)
        self.reads.append((name, index))
        if self._tensors is not None:
            t = self._tensors[name]
            return t[index] if index else t
        h = self._handle(self._files[name])
        if not index:          # whole tensor (a 0-dim scale cannot be sliced)
            return h.get_tensor(name)
        return h.get_slice(name)[index]

    # ---- one quantized linear ------------------------------------------------------------------
    def is_quantized(self, module: str) -> bool:
        """The module is stored FP4 (a MIXED_PRECISION checkpoint's FP8 layer is not)."""
        if self.other_format(module) is not None:
            return False
        return any(self.has(f"{module}.{k}") for k in ("weight_scale", "weight_packed")) \
            or self.has(f"{module}_blocks") or self.has(f"{module}_weight_scale")

    def other_format(self, module: str) -> Optional[str]:
        """A MIXED_PRECISION checkpoint's algorithm for a module that is not FP4 ("" where its
        quantized_layers do not name the module: unquantized); None for an FP4 module or a
        checkpoint with one algorithm."""
        try:
            algo = self.scheme.layer_algo(module)
        except CheckpointError:
            return None
        return None if algo is None or self.scheme.fp4_layer(module) else algo

    def _not_fp4(self, module: str, algo: str) -> CheckpointError:
        what = f"{algo}" if algo else "not quantized (no quantized_layers entry)"
        return CheckpointError(f"{self.src}: {module} is {what} in this ModelOpt MIXED_PRECISION checkpoint, not FP4: "
                               f"it is neither planned nor served as FP4 (run it with the engine's "
                               f"{algo or 'bf16'} layer)")

    def _not_quantized(self, module: str) -> CheckpointError:
        scale = self._names(module)["scales"]
        if self.has(f"{module}.weight"):
            m = self.meta(f"{module}.weight")
            if m.dtype != "U8":
                return MissingTensor(f"{self.src}: {module} is not quantized in this checkpoint ({scale!r} is missing, "
                                     f"weight kept as {m.dtype} {list(m.shape)}); load it as a plain nn.Linear")
        for name in self._names(module).values():
            if not self.has(name):
                return MissingTensor(f"{self.src}: {self.scheme.describe()} tensor {name!r} is missing")
        return MissingTensor(f"{self.src}: no FP4 tensors for module {module!r}")

    def linear(self, module: str, *, tp_rank: int = 0, tp_size: int = 1, parallel: Parallel = None) -> FP4Weight:
        """One quantized nn.Linear as FP4Weight (this rank's slice: column = rows of N, row = K)."""
        module = module.rstrip(".")
        other = self.other_format(module)
        if other is not None:
            raise self._not_fp4(module, other)
        need = self._names(module)
        if not all(self.has(need[k]) for k in ("packed", "scales") + (("global",) if self.scheme.fmt == "nvfp4" else ())):
            raise self._not_quantized(module)
        if tp_size != 1 and parallel not in ("column", "row"):
            raise CheckpointError(f"{module}: tp_size={tp_size} needs parallel='column' or 'row'")
        return self._linear(module, tp_rank, tp_size, parallel if tp_size != 1 else None)

    def bias(self, module: str, *, tp_rank: int = 0, tp_size: int = 1, parallel: Parallel = None) -> Optional[Tensor]:
        name = f"{module}.bias"
        if not self.has(name):
            return None
        n = self.meta(name).shape[-1]
        if tp_size == 1 or parallel == "row":
            return self.read(name) if tp_rank == 0 or parallel != "row" else torch.zeros(n, dtype=torch.bfloat16)
        r0, r1 = shard_range(n, tp_rank, tp_size, 1, f"{module}.bias (column-parallel N)")
        return self.read(name, (slice(r0, r1),))

    def _names(self, module: str) -> dict[str, str]:
        s = self.scheme
        if s.producer == "compressed-tensors":
            return {"packed": f"{module}.weight_packed", "scales": f"{module}.weight_scale",
                    "global": f"{module}.weight_global_scale", "input": f"{module}.input_global_scale"}
        return {"packed": f"{module}.weight", "scales": f"{module}.weight_scale",
                "global": f"{module}.weight_scale_2", "input": f"{module}.input_scale"}

    def _scalar(self, name: str, reciprocal: bool) -> Tensor:
        t = self.read(name)
        if not t.is_floating_point() or t.numel() != 1:
            raise CheckpointError(f"{self.src}: {name} must be one float32 scale, got {t.dtype} {list(t.shape)}")
        v = t.reshape(()).float()
        if not bool(_plausible(v)):     # a zero / NaN / huge scale would dequantize to garbage
            raise CheckpointError(f"{self.src}: {name} = {float(v):g} is not a positive finite scale in "
                                  f"[2^-{_SCALE_EXP}, 2^{_SCALE_EXP}]")
        if reciprocal:         # compressed-tensors stores the multiplier of the quantizer: 1 / ModelOpt's
            v = torch.ones((), dtype=torch.float32) / v
        return v

    def _scalar_or_per_expert(self, name: str, e: int) -> Tensor:
        """One scale, or one per expert, checked as _scalar checks one: float, positive, finite."""
        t = self.read(name)
        if not t.is_floating_point():
            raise CheckpointError(f"{self.src}: {name} must be float32 scales, got {t.dtype} {list(t.shape)}")
        t = t.float()
        if t.numel() not in (1, e):
            raise CheckpointError(f"{self.src}: {name} has {t.numel()} values, expected 1 or one per expert ({e})")
        ok = _plausible(t)
        if not bool(ok.all()):
            i = int((~ok).reshape(-1).nonzero()[0])
            raise CheckpointError(f"{self.src}: {name}[{i}] = {float(t.reshape(-1)[i]):g} is not a positive finite scale "
                                  f"in [2^-{_SCALE_EXP}, 2^{_SCALE_EXP}]"
                                  + (f" ({int((~ok).sum())} of {t.numel()} experts)" if t.numel() > 1 else ""))
        return t.reshape(()).expand(e) if t.numel() == 1 else t.reshape(e)

    def _linear(self, module: str, tp_rank: int, tp_size: int, parallel: Parallel) -> FP4Weight:
        s = self.scheme
        nm = self._names(module)
        spec = FORMATS[s.fmt]
        pm = self.meta(nm["packed"])
        if pm.dtype != "U8" or len(pm.shape) < 2:
            raise CheckpointError(f"{self.src}: {nm['packed']} must be uint8 [N, K/2], got {pm.dtype} {list(pm.shape)}")
        n, k = pm.shape[-2], pm.shape[-1] * 2
        want_scale = "F8_E4M3" if s.fmt == "nvfp4" else "U8"
        sm = self.meta(nm["scales"])
        if sm.dtype != want_scale or tuple(sm.shape[-2:]) != (n, k // spec.block):
            raise CheckpointError(f"{self.src}: {nm['scales']} is {sm.dtype} {list(sm.shape)}, expected {want_scale} "
                                  f"[{n}, {k // spec.block}] for {nm['packed']} {list(pm.shape)} ({s.fmt}, K={k})")
        rows = cols = slice(None)
        scols = slice(None)
        if parallel == "column":
            r0, r1 = shard_range(n, tp_rank, tp_size, 1, f"{module} (column-parallel, N)")
            rows = slice(r0, r1)
        elif parallel == "row":
            c0, c1 = shard_range(k, tp_rank, tp_size, spec.block, f"{module} (row-parallel, K, {s.fmt} block {spec.block})")
            cols, scols = slice(c0 // 2, c1 // 2), slice(c0 // spec.block, c1 // spec.block)
        packed = self.read(nm["packed"], (rows, cols)).contiguous()
        scales = self.read(nm["scales"], (rows, scols)).contiguous()
        if s.fmt == "nvfp4":
            g = self._scalar(nm["global"], s.producer == "compressed-tensors")
        else:
            g = torch.ones((), dtype=torch.float32)
        isc = None
        if s is MODELOPT_NVFP4:              # a bare file: W4A4 exactly where the module has an input_scale
            if self.has(nm["input"]):
                isc = self._scalar(nm["input"], False)
        elif s.fmt == "nvfp4" and s.layer_w4a4(module):
            if not self.has(nm["input"]):
                raise CheckpointError(f"{self.src}: {module} has no static activation scale {nm['input']!r} although "
                                      f"the scheme is {s.describe()}")
            isc = self._scalar(nm["input"], s.producer == "compressed-tensors")
        return FP4Weight(packed, scales, g, s.fmt, isc)

    # ---- MoE experts ---------------------------------------------------------------------------
    def expert_layout(self, block: str) -> str:
        """'per_expert' (`experts.{e}.{gate,up,down}_proj`), 'stacked_nvfp4' (ModelOpt bmm experts) or
        'gpt_oss_mxfp4' (`experts.{gate_up,down}_proj_blocks`)."""
        if self.has(f"{block}.experts.gate_up_proj_blocks"):
            return "gpt_oss_mxfp4"
        if self.has(f"{block}.experts.gate_up_proj_weight_scale"):
            return "stacked_nvfp4"
        if self.is_quantized(f"{block}.experts.0.gate_proj") or self.has(f"{block}.experts.0.down_proj.weight"):
            return "per_expert"
        raise CheckpointError(f"{self.src}: {block} has no routed experts this reader knows (tried "
                              f"{block}.experts.0.gate_proj, {block}.experts.gate_up_proj[_blocks])")

    def num_experts(self, block: str) -> int:
        lay = self.expert_layout(block)
        if lay == "gpt_oss_mxfp4":
            return self.meta(f"{block}.experts.gate_up_proj_blocks").shape[0]
        if lay == "stacked_nvfp4":
            return self.meta(f"{block}.experts.gate_up_proj").shape[0]
        pat = re.compile(re.escape(block) + r"\.experts\.(\d+)\.")
        return 1 + max(int(m.group(1)) for n in self._files if (m := pat.match(n)))
