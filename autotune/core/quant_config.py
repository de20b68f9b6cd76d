"""Which FP4 scheme a Hugging Face checkpoint is: config.json's `quantization_config` and/or
ModelOpt's `hf_quant_config.json` -> QuantScheme (producer, NVFP4/MXFP4, W4A4 or W4A16, the
modules kept unquantized); anything else is refused in one line naming what was found. The
reader (autotune.core.checkpoint) and the model parser (autotune.models.hf_config) both ask here.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence

__all__ = ["CheckpointError", "MissingTensor", "QuantScheme", "MODELOPT_NVFP4", "MODELOPT_FP4", "detect_quant",
           "glob_rx"]


class CheckpointError(ValueError):
    """A checkpoint (path, format, tensor, slice) that cannot be read as asked; one line."""


class MissingTensor(CheckpointError, KeyError):
    """A tensor the module needs is not in the checkpoint (a KeyError too, as dict lookups raise)."""

    def __str__(self) -> str:            # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class QuantScheme:
    """What the checkpoint's quantization config says, in the terms the reader needs.

    producer: "modelopt", "compressed-tensors" or "hf-mxfp4" (gpt-oss / OpenAI MXFP4);
    fmt: "nvfp4" or "mxfp4"; w4a4: activations are FP4 too (static per-tensor input scale for
    NVFP4); exclude: module patterns kept unquantized (globs, or `re:` regexes)."""
    producer: str
    fmt: str
    w4a4: bool
    exclude: tuple[str, ...] = ()
    source: str = ""
    #: ModelOpt MIXED_PRECISION: (module, quant_algo) of every layer its `quantized_layers` names;
    #: empty for a checkpoint with one algorithm. A module it does not name is not quantized.
    layers: tuple[tuple[str, str], ...] = ()

    def layer_algo(self, module: str) -> Optional[str]:
        """The module's own quant_algo in a MIXED_PRECISION checkpoint ("" where it names none of
        the module's prefixes: unquantized), None for a checkpoint with one algorithm."""
        if not self.layers:
            return None
        m = module.rstrip(".")
        for name, algo in self.layers:
            if m == name or m.startswith(name + "."):
                return algo
        return ""

    def fp4_layer(self, module: str) -> bool:
        """The module is FP4 under this scheme's per-layer algorithms (True without them)."""
        algo = self.layer_algo(module)
        return algo is None or algo in MODELOPT_FP4

    def layer_w4a4(self, module: str) -> bool:
        """The module's activations are FP4 too (its own algorithm where the checkpoint has them)."""
        algo = self.layer_algo(module)
        return self.w4a4 if algo is None else MODELOPT_FP4.get(algo, False)

    def not_fp4(self) -> tuple[str, ...]:
        """The modules a MIXED_PRECISION checkpoint quantizes in another format (FP8, …)."""
        return tuple(n for n, a in self.layers if a not in MODELOPT_FP4)

    @property
    def a_fmt(self) -> str:
        return self.fmt if self.w4a4 else "bf16"

    def describe(self) -> str:
        return f"{self.producer} {self.fmt.upper()} ({'W4A4' if self.w4a4 else 'W4A16'})"


#: what a bare ModelOpt tensor file (no config.json) is read as: `from_modelopt`'s contract; W4A4
#: only where the module carries an input_scale
MODELOPT_NVFP4 = QuantScheme("modelopt", "nvfp4", True, (), "ModelOpt NVFP4 (assumed: no quantization config)")


#: ModelOpt FP4 quant_algo values -> W4A4 (activations FP4 under a static input_scale)
MODELOPT_FP4 = {"NVFP4": True, "W4A16_NVFP4": False}


def _mixed(q: dict, exclude: tuple[str, ...], src: str) -> QuantScheme:
    """ModelOpt MIXED_PRECISION: one quant_algo per layer (`quantized_layers`); the FP4 layers are
    served, every other one (FP8, …) is neither planned nor served as FP4."""
    ql = q.get("quantized_layers")
    if not isinstance(ql, dict) or not ql:
        raise _refuse(src, "found ModelOpt quant_algo 'MIXED_PRECISION' without a quantized_layers map")
    layers = []
    for name, v in ql.items():
        algo = v.get("quant_algo") if isinstance(v, dict) else v
        if not isinstance(name, str) or not isinstance(algo, str):
            raise _refuse(src, f"quantized_layers entry {str(name)[:80]!r} has no quant_algo string")
        layers.append((name, algo.upper()))
    fp4 = {a for _, a in layers if a in MODELOPT_FP4}
    if not fp4:
        found = sorted({a for _, a in layers})
        raise _refuse(src, f"found ModelOpt MIXED_PRECISION with no FP4 layer ({', '.join(found[:4])})")
    return QuantScheme("modelopt", "nvfp4", "NVFP4" in fp4, exclude, src, tuple(sorted(layers)))


def _refuse(src: str, what: str) -> CheckpointError:
    return CheckpointError(f"{src}: {what}; this reader loads NVFP4 (ModelOpt, compressed-tensors) and MXFP4 "
                           "(compressed-tensors, gpt-oss) only")


def _strs(q: dict, key: str) -> tuple[str, ...]:
    v = q.get(key) or ()
    if isinstance(v, str):
        v = (v,)
    return tuple(x for x in v if isinstance(x, str))


def _ct_group_fmt(name: str, g: dict, top_format: str, src: str) -> tuple[str, bool]:
    """(fmt, w4a4) of one compressed-tensors config group, or refuse it."""
    fmt = str(g.get("format") or top_format or "").lower()
    w = g.get("weights") or {}
    a = g.get("input_activations")
    desc = (f"compressed-tensors group {name!r}: format {fmt or '?'!r}, weights "
            f"{w.get('type', '?')} {w.get('num_bits', '?')}-bit group {w.get('group_size', '?')}")
    if fmt == "nvfp4-pack-quantized" and w.get("num_bits") == 4 and w.get("type") == "float" \
            and w.get("group_size") in (16, None):
        out = "nvfp4"
    elif fmt == "mxfp4-pack-quantized" and w.get("num_bits") == 4 and w.get("group_size") in (32, None):
        out = "mxfp4"
    else:
        raise _refuse(src, f"found {desc}")
    if not a:
        return out, False
    if a.get("num_bits") == 4 and a.get("type") == "float":
        if out == "nvfp4" and a.get("dynamic") not in (False, "local"):
            raise _refuse(src, f"{desc} with fully dynamic FP4 activations (no static input_global_scale)")
        return out, True
    raise _refuse(src, f"{desc} with {a.get('type', '?')} {a.get('num_bits', '?')}-bit activations")


def detect_quant(config: Optional[dict], hf_quant: Optional[dict] = None, src: str = "checkpoint") -> QuantScheme:
    """The checkpoint's FP4 scheme from config.json's `quantization_config` and/or a ModelOpt
    `hf_quant_config.json`; anything that is not NVFP4/MXFP4 weights raises CheckpointError."""
    qc = (config or {}).get("quantization_config")
    if qc is None and isinstance((config or {}).get("text_config"), dict):
        qc = config["text_config"].get("quantization_config")
    if hf_quant is not None:            # ModelOpt's own file is the more specific of the two
        q = dict(hf_quant)
        if isinstance(hf_quant.get("quantization"), dict):
            q.update(hf_quant["quantization"])
        q.setdefault("quant_method", "modelopt")
    elif isinstance(qc, dict):
        q = dict(qc)
        if isinstance(qc.get("quantization"), dict):
            q.update(qc["quantization"])
    else:
        raise _refuse(src, "no quantization_config in config.json and no hf_quant_config.json (an unquantized "
                           "checkpoint?)")
    method = str(q.get("quant_method") or "").lower()
    algo = str(q.get("quant_algo") or "").upper()
    exclude = _strs(q, "exclude_modules") + _strs(q, "ignore") + _strs(q, "modules_to_not_convert")
    if method == "modelopt" or (algo and method in ("", "modelopt")):
        if algo in MODELOPT_FP4:         # NVFP4 (W4A4) or W4A16_NVFP4 (weight-only)
            return QuantScheme("modelopt", "nvfp4", MODELOPT_FP4[algo], exclude, src)
        if algo == "MIXED_PRECISION":
            return _mixed(q, exclude, src)
        raise _refuse(src, f"found ModelOpt quant_algo {algo or None!r}")
    if method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not isinstance(groups, dict) or not groups:
            raise _refuse(src, f"found compressed-tensors format {q.get('format')!r} without config_groups")
        kinds = {_ct_group_fmt(str(n), g, str(q.get("format") or ""), src) for n, g in groups.items()
                 if isinstance(g, dict)}
        if len(kinds) != 1:
            raise _refuse(src, f"found compressed-tensors groups of different FP4 kinds {sorted(kinds)}")
        fmt, w4a4 = kinds.pop()
        return QuantScheme("compressed-tensors", fmt, w4a4, exclude, src)
    if method == "mxfp4":
        return QuantScheme("hf-mxfp4", "mxfp4", False, exclude, src)
    found = method or algo or "an unnamed method"
    extra = f" (fmt {q.get('fmt')!r})" if q.get("fmt") else ""
    raise _refuse(src, f"found quant_method {found!r}{extra}")


def glob_rx(patterns: Sequence[str]) -> Optional[re.Pattern]:
    alts = []
    for p in patterns:
        if p.startswith("re:"):
            alts.append(f"(?:{p[3:]}).*")
        else:
            core = ".*".join(".".join(re.escape(s) for s in part.split("?")) for part in p.split("*"))
            alts.append(rf"(?:.*\.)?{core}(?:\..*)?")
    return re.compile("|".join(f"(?:{a})" for a in alts), re.DOTALL) if alts else None
