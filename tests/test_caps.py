"""A launcher's capabilities are one value (`Caps`, tactics/base.py), read as `launcher.caps.<flag>`;
its protocol methods (attach, bad_word, aligned_block_m, aligner, release) are on every launcher.
No code probes for either with getattr / hasattr / `except AttributeError` (an AST scan), and the
wrappers pass the inner launcher's caps through whole."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from autotune.core.formats import quantize

from autotune.core.operands import checked
from autotune.core.problem import Problem
from autotune.tactics.base import (NO_CAPS, BoundKernel, BoundMoEKernel, Caps, FunctionKernel, LauncherBase,
                                   Launcher, as_launcher)

ROOT = Path(__file__).resolve().parents[1]
#: the code the scan reads (autotune/tactics and autotune/cache are links to the last two)
SCANNED = ("autotune", "tactics", "cache")
#: the capability and launcher-protocol names no code may probe for
NAMES = {"attach", "bad_word", "shared_slot", "prefetches", "scratch_out", "capture_safe", "checks_ids",
         "aligned_block_m", "aligner", "bad", "release", "smem_compiled", "bound_cls", "batch_invariant",
         "pdl", "caps"}
#: (file, name) pairs where the name is not a launcher's: a cache row's field of the same name
NOT_LAUNCHERS = {("cache/rows.py", "smem_compiled")}


def _attr_names(nodes) -> set[str]:
    return {n.attr for node in nodes for n in ast.walk(node) if isinstance(n, ast.Attribute)}


def _catches_attribute_error(handler: ast.ExceptHandler) -> bool:
    t = handler.type
    kinds = t.elts if isinstance(t, ast.Tuple) else [t] if t is not None else []
    return any(isinstance(k, ast.Name) and k.id == "AttributeError" for k in kinds)


def probes(source: str, path: str = "") -> list[tuple[int, str]]:
    """(line, what) of every capability read by getattr / hasattr / `except AttributeError`."""
    names = NAMES - {n for f, n in NOT_LAUNCHERS if f == path}
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
        elif isinstance(node, ast.Try) and any(_catches_attribute_error(h) for h in node.handlers):
            hit = sorted(_attr_names(node.body) & names)
            if hit:
                found.append((node.lineno, f"except AttributeError around .{', .'.join(hit)}"))
    return sorted(found)


def test_the_scan_finds_each_kind_of_probe():
    src = ("a = getattr(k, 'attach', None)\nb = hasattr(k, 'checks_ids')\nc = getattr(k, 'shape', None)\n"
           "try:\n    k.release()\nexcept (ValueError, AttributeError):\n    pass\n"
           "try:\n    k.shape\nexcept AttributeError:\n    pass\n")
    assert [line for line, _ in probes(src)] == [1, 2, 4]


def test_no_capability_is_read_by_probing():
    files = sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 100
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in files
             for line, what in probes(p.read_text(), p.relative_to(ROOT).as_posix())]
    assert found == [], "capability reads by probing (use launcher.caps / the Launcher protocol):\n" + "\n".join(found)


def test_caps_is_one_frozen_value():
    c = Caps(capture_safe=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.capture_safe = False  # type: ignore[misc]
    assert NO_CAPS == Caps() and not any(dataclasses.astuple(NO_CAPS))
    assert dataclasses.replace(c, checks_ids=True) == Caps(capture_safe=True, checks_ids=True)
    assert LauncherBase.caps is NO_CAPS and LauncherBase.smem_compiled is None


class _Grouped(LauncherBase):
    caps = Caps(capture_safe=True, checks_ids=True, shared_slot=True, prefetches=True, scratch_out=True)

    def __init__(self):
        self.attached, self.released = [], 0

    def __call__(self, x, w, ids, tw=None, out=None, **kw):
        return ("called", kw)

    def aligned_block_m(self, m):
        return 16 if m > 8 else None

    def attach(self, scratch=None, bad_word=None):
        self.attached.append((scratch, bad_word))

    def bad_word(self):
        return "word"

    def release(self):
        self.released += 1


def test_wrappers_carry_the_inner_caps_whole():
    inner = _Grouped()
    p = Problem.moe(64, 128, 4, 2)
    w = quantize(torch.randn(4, 64, 128))
    for wrapped in (checked(p, inner), BoundMoEKernel(p, inner, w)):
        assert isinstance(wrapped, Launcher)
        assert dataclasses.replace(wrapped.caps, batch_invariant=False) == inner.caps
        wrapped.attach("pool", "w")
        assert wrapped.bad_word() == "word" and wrapped.aligned_block_m(9) == 16 and wrapped.aligned_block_m(1) is None
        wrapped.release()
    assert inner.attached == [("pool", "w")] * 2 and inner.released == 2
    assert BoundMoEKernel(p, inner, w, batch_invariant=True).caps.batch_invariant


def test_a_plain_function_gets_its_caps():
    k = as_launcher(lambda x, w, out=None: x)
    assert isinstance(k, FunctionKernel) and k.caps == NO_CAPS
    k2 = FunctionKernel(lambda x, w, out=None: x, capture_safe=True, batch_invariant=True)
    assert k2.caps == Caps(capture_safe=True, batch_invariant=True)
    b = BoundKernel(Problem.dense(128, 64), k2, quantize(torch.randn(128, 64)))
    assert b.caps == Caps(capture_safe=True) and b.smem_compiled is None and b.bad_word() is None
