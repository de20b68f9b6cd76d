"""The cuda kernels' texts as shared parts plus each kernel's route and store, with their parameters
declared once (tactics/cuda/args.py): the C parameter list, the launch's struct format, the argument
tuples and the repeat path's positions all follow the declaration; the SASS against the base
commit's texts (tools/cuda_sass_same.py) on a sample of the kept configs."""
import random
import re

import numpy as np
import pytest

from autotune.tactics.cuda import args as A
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import moe_plan as MP
from autotune.tactics.cuda import pdl

TEXTS = sorted({f for files in B.SOURCES.values() for f in files})
MAX_FUNCTION_LINES = 120


def _functions(text: str):
    """(name, lines) of every function definition with a body in a .cu / .cuh text (brace matching)."""
    out = []
    for m in re.finditer(r"^[^\n#/]*?\b(\w+)\s*\([^;{]*?\)\s*(?:const\s*)?\{", text, re.M | re.S):
        if m.group(1) in ("if", "for", "while", "switch"):
            continue
        depth, i = 0, m.end() - 1
        while True:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                break
            i += 1
        out.append((m.group(1), text.count("\n", m.start(), i) + 1))
    return out


def test_no_kernel_function_over_120_lines_and_one_issue_helper():
    long, issues = [], 0
    for f in TEXTS:
        for name, lines in _functions(f.read_text()):
            if lines > MAX_FUNCTION_LINES:
                long.append(f"{f.name}: {name} {lines} lines")
            issues += name == "issue"
    assert not long, long
    assert issues == 1


def test_the_texts_cite_no_numbered_sections():
    for f in TEXTS:
        assert not re.search(r"moe-decode\.md part \d", f.read_text()), f.name


def test_every_kernel_text_declares_its_parameters_by_the_declarations_macro():
    for kernel, params in A.PARAMS.items():
        own = B.SOURCES[kernel][-1].read_text()
        assert re.search(rf'extern "C" __global__ void __launch_bounds__\(NTHREADS\) {kernel}\({params.macro_name}\)', own)
        text = B.source_text(kernel)
        assert params.macro() in text
        assert pdl.signature(text, kernel) == params.fmt()


def test_pack_takes_every_parameter_by_name_and_nothing_else():
    vals = {n: i for i, n in enumerate(A.MOE_TOK.names)}
    assert A.MOE_TOK.pack(**vals) == tuple(range(len(vals)))
    with pytest.raises(TypeError, match="missing \\['ids_cols'\\]"):
        A.MOE_TOK.pack(**{n: 0 for n in A.MOE_TOK.names[:-1]})
    with pytest.raises(TypeError, match="unknown \\['idz'\\]"):
        A.MOE_TOK.pack(**{n: 0 for n in A.MOE_TOK.names[:-1]}, idz=0)
    with pytest.raises(ValueError, match="declared twice"):
        A.Params("k", ("a", "int"), ("a", "int"))
    with pytest.raises(ValueError, match="neither a pointer nor an int"):
        A.Params("k", ("a", "float"))


def test_two_swapped_arguments_move_in_the_c_list_the_format_and_the_tuple_together(monkeypatch):
    """Swap two declared parameters (an int and a pointer, then two ints): the kernel's C list in its
    text, the launch's struct format and the packed tuple all follow, so every value still reaches the
    C parameter of its name; a tuple packed for the old order no longer matches the new text's list."""
    for a, b in (("tw", "P"), ("top_k", "n_exp")):
        old = A.MOE_MMA
        names = list(old.names)
        i, j = names.index(a), names.index(b)
        params = [(p.name, p.ctype) for p in old.params]
        params[i], params[j] = params[j], params[i]
        swapped = A.Params("moe_mma", *params)
        monkeypatch.setitem(A.PARAMS, "moe_mma", swapped)
        text = B.source_text("moe_mma")
        c_names = [re.search(r"(\w+)$", p.strip()).group(1) for p in
                   re.search(r"#define MOE_MMA_PARAMS ([^\n]*)", text).group(1).split(",")]
        assert c_names == list(swapped.names) and c_names != list(old.names)
        assert pdl.signature(text, "moe_mma") == swapped.fmt()
        vals = {n: np.int32(k) if not p.pointer else 1000 + k for k, (n, p) in enumerate(zip(old.names, old.params))}
        packed = swapped.pack(**vals)
        assert [packed[c_names.index(n)] for n in old.names] == [vals[n] for n in old.names]
        assert old.pack(**vals) != packed
        monkeypatch.undo()


def test_the_repeat_paths_positions_come_from_the_declarations():
    for n, at in (("wq", MP.WQ), ("sq", MP.SQ), ("x", MP.X), ("y", MP.OUT), ("gscale", MP.GS), ("ids", MP.IDS),
                  ("tw", MP.TW)):
        assert A.MOE_MMA.names[at] == n == A.MOE_TOK.names[at]


def _compiler_here() -> bool:
    from tools import cuda_sass_same as S
    return S._nvrtc() is not None or B.nvcc() is not None


def test_sass_against_the_base_texts_on_a_sample():
    """A sample of the kept configs, both archs: each compiles without local memory where the base
    text did not, and every config whose SASS differs is one the GPU test of the two texts
    (tests/test_cuda_base_gpu.py) covers by kernel, epilogue and format."""
    from tools import cuda_sass_same as S
    if not _compiler_here():
        pytest.skip("neither NVRTC nor nvcc here")
    cs = S.configs()
    assert len(cs) > 1000                      # the whole kept space (GLM-5 TP8, both formats)
    sample = random.Random(7).sample(cs, 3)
    rows = S.run(sample, S.ARCHS, jobs=1)
    for r in rows:
        assert r["local"] == 0 and r["stack"] == 0, r
        assert abs(r["registers"] - r["base_registers"]) <= 8, r
