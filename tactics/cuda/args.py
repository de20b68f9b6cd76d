"""The cuda kernels' parameters, declared once by name.

Each kernel's `Params` is the one place its parameters are listed: the C parameter list (a macro
build.text puts before the kernel, `<KERNEL>_PARAMS`: the .cu texts declare none of their own), the
launch's struct format (pdl.py), the launchers' argument tuples (`pack`, by keyword: a name missing or
unknown is an error) and the repeat path's positions (moe_plan.py: `index`) all come from it, so no
positional list lies between Python and C.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str           # the C type, e.g. "const uint4*" (pointers get __restrict__) or "int"

    @property
    def pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def code(self) -> str:
        """struct's format character: 'P' per pointer, 'i' per int (C's kernel ABI, native alignment)."""
        return "P" if self.pointer else "i"

    def c(self) -> str:
        return f"{self.ctype} __restrict__ {self.name}" if self.pointer else f"{self.ctype} {self.name}"


class Params:
    """A kernel's parameters in C order."""

    def __init__(self, kernel: str, *params: tuple[str, str]):
        self.kernel = kernel
        self.params = tuple(Param(n, t) for n, t in params)
        self.names = tuple(p.name for p in self.params)
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"{kernel}: a parameter declared twice")
        for p in self.params:
            if not (p.pointer or p.ctype == "int") or not re.fullmatch(r"[A-Za-z_]\w*", p.name):
                raise ValueError(f"{kernel}: parameter {p.name} {p.ctype!r} is neither a pointer nor an int")
        self._at = {n: i for i, n in enumerate(self.names)}

    @property
    def macro_name(self) -> str:
        return f"{self.kernel.upper()}_PARAMS"

    def c_list(self) -> str:
        return ", ".join(p.c() for p in self.params)

    def macro(self) -> str:
        """The C parameter list as the macro the kernel's text declares itself with."""
        return f"#define {self.macro_name} {self.c_list()}\n"

    def fmt(self) -> str:
        return "@" + "".join(p.code for p in self.params)

    def index(self, name: str) -> int:
        return self._at[name]

    def pack(self, **values: Any) -> tuple:
        """The launch's argument tuple in C order; every parameter by name, none unknown."""
        if len(values) != len(self.names) or any(n not in values for n in self.names):
            missing = [n for n in self.names if n not in values]
            unknown = [n for n in values if n not in self._at]
            raise TypeError(f"{self.kernel}: arguments missing {missing}, unknown {unknown}")
        return tuple(values[n] for n in self.names)


_PTR = "const uint4*", "const u32*", "const u16*", "u16*", "const float*"
#: the prefix every kernel shares: weight words, scale words, x, y, global scale (moe_plan's open
#: pointers, x and y, are read by name)
_HEAD = tuple(zip(("wq", "sq", "x", "y", "gscale"), _PTR))
_ROUTING = (("ids", "const void*"), ("tw", "const float*"))
_FORM = tuple((n, "int") for n in ("top_k", "n_exp", "ids64", "x_pair", "routed", "gs_stride", "shared_e",
                                   "ids_cols"))

W4A16_MMA = Params("w4a16_mma", *_HEAD, ("M", "int"), ("N", "int"), ("K", "int"), ("ws", "float*"),
                   ("locks", "int*"))
MOE_MMA = Params("moe_mma", *_HEAD, *_ROUTING, ("ws", "float*"), ("locks", "int*"), ("bad", "int*"),
                 ("red", "float*"), ("cnt", "int*"), ("P", "int"), ("N", "int"), ("K", "int"), *_FORM,
                 ("srt", "const int*"), ("blk_e", "const int*"), ("g_main", "int"), ("bm", "int"),
                 ("pfa", "const char*"), ("pfb", "const char*"), ("pfa_bytes", "int"), ("pfb_bytes", "int"))
MOE_TOK = Params("moe_tok", *_HEAD, *_ROUTING, ("bad", "int*"), ("M", "int"), ("N", "int"), ("K", "int"), *_FORM)
#: the layer kernel (moe_layer.cu): both GEMMs' weights, h [P][I] scratch, the protocol's words (state:
#: tick, done, epoch, error; cnt: one per expert), H = w13's K = w2's N, I = w2's K
MOE_LAYER = Params("moe_layer", ("wq13", "const uint4*"), ("sq13", "const u32*"), ("gs13", "const float*"),
                   ("wq2", "const uint4*"), ("sq2", "const u32*"), ("gs2", "const float*"), ("x", "const u16*"),
                   ("y", "u16*"), ("h", "u16*"), *_ROUTING, ("state", "int*"), ("cnt", "u32*"), ("bad", "int*"),
                   ("M", "int"), ("H", "int"), ("I", "int"), ("n13_tiles", "int"), ("n2_tiles", "int"),
                   *((n, t) for n, t in _FORM if n != "x_pair"))
#: each kernel's declaration by name
PARAMS = {p.kernel: p for p in (W4A16_MMA, MOE_MMA, MOE_TOK, MOE_LAYER)}
