"""The cuda family's members: one kernel each, on the model of the Triton family's (triton_fp4/member.py).

A member is its text (the shared kernel parts it includes, then its own `<kernel>.cu`), its parameters
(args.py), its behaviour (schema, space, verdict, compiled variants, launcher, launch figures: a class
in its launcher's module, moe_mma's in its search policy's (moe_search.py, which imports the launcher
module moe.py and is imported by none of it), named by `behaviour`), the Python that launches it and its GPU tests.
`REGISTRY` lists them; everything that used to name each kernel in its own place comes from it:
build.SOURCES (the files each text joins), checked.LAUNCH (what its GPU-check record digests), its
code key (`Member.code`: its own files and launch modules, as narrow as the GPU-check record), the
family's choice of a tactic's member (`member_of`), KERNEL_TESTS (tools/mark_gpu_checked.py) and the
GPU tests the device driver runs (`python -m autotune.tactics.cuda.members --gpu-tests`). A new
member is its files plus one line in REGISTRY (tests/test_cuda_members.py).

Nothing here imports a launcher or CuPy: `Member.impl()` imports its behaviour's module when asked.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from autotune.core.codekey import Code

_DIR = Path(__file__).parent
#: the shared kernel parts every text starts with, in order: configuration macros, device helpers,
#: the cp.async ring, the main loop, the reductions, the epilogues
SHARED = ("config.cuh", "mma_common.cuh", "ring.cuh", "mainloop.cuh", "reduce.cuh", "epilogue.cuh")
#: the grouped kernels' routing helpers (ids, the shared slot, the L2 prefetch), after the shared parts
ROUTING = ("moe_common.cuh",)
#: the token-major slot cursor (moe_tok and the layer kernel's w2 role), after the routing helpers
TOKEN = ("tok_slots.cuh",)
#: the Python every member's text and launch go through (relative to this package): the -D options
#: and cubins, the layout's bit constants, the launch (PDL), the parameters, this registry
COMMON_CODE = (".build", ".layout", ".pdl", ".args", ".members")
#: what every member's Python imports outside this package: the shared launcher and scratch pool, the
#: core values
CORE_CODE = ("..base", "..scratch", "autotune.core.arch", "autotune.core.codekey", "autotune.core.formats",
             "autotune.core.jsonread", "autotune.core.operands", "autotune.core.problem", "autotune.core.settings",
             "autotune.core.tactic")
#: the grouped members' search policy, GPU-check verdicts and routing alignment (Triton's kernel): in
#: their code keys, not in their GPU-check records (moe_search.py says why)
GROUPED_USES = (".checked", ".moe_search", "..triton_fp4.moe_align")


@dataclass(frozen=True)
class Member:
    kernel: str                    # the .cu's extern "C" kernel, the file's stem and the GPU-check record's key
    parts: tuple[str, ...]         # the shared parts its text includes, in order, before its own file
    launch: tuple[str, ...]        # the Python that launches it (relative to this package), its behaviour's first
    behaviour: str                 # "module:Class" (relative to this package): schema, space, verdict, launcher
    tests: tuple[str, str, bool]   # its GPU tests: (file under tests/, name prefix, True: with it / False: without)
    tactic_kernel: str | None = None   # the tactic's `kernel` value; None: the tactics that name no kernel
    uses: tuple[str, ...] = ()     # Python its code key covers besides its launch (not its GPU-check record)

    @property
    def source(self) -> str:
        return f"{self.kernel}.cu"

    @property
    def files(self) -> tuple[str, ...]:
        return (*self.parts, self.source)

    def paths(self) -> tuple[Path, ...]:
        return tuple(_DIR / f for f in self.files)

    def code_of(self, name: str, *more: str) -> Code:
        """Its files and launch Python (and `more`) as a codekey.Code named `name`."""
        return Code.of(name, __package__, *COMMON_CODE, *self.launch, *more, files=tuple((".", f) for f in self.files))

    @property
    def code(self) -> Code:
        """The sources its measured numbers depend on: its own and the shared parts it includes, the
        Python that builds, launches and chooses it, the core values (not the other members')."""
        return self.code_of(f"cuda/{self.kernel}", *self.uses, *CORE_CODE)

    def owns(self, tactic: Any) -> bool:
        return tactic.params.get("kernel") == self.tactic_kernel

    def impl(self) -> Any:
        """Its behaviour (imported on first use)."""
        got = _IMPL.get(self.kernel)
        if got is None:
            mod, _, cls = self.behaviour.partition(":")
            got = _IMPL[self.kernel] = getattr(importlib.import_module(mod, __package__), cls)(self)
        return got


_IMPL: dict[str, Any] = {}

REGISTRY: tuple[Member, ...] = (
    Member("w4a16_mma", SHARED, (".launch", ".dense"), ".launch:DenseMember", ("test_cuda_gpu.py", "test_", True)),
    Member("moe_mma", SHARED + ROUTING, (".moe", ".moe_checks", ".moe_plan"), ".moe_search:MoeMember",
           ("test_cuda_moe_gpu.py", "test_tok_", False), "moe_mma", GROUPED_USES),
    Member("moe_tok", SHARED + ROUTING + TOKEN, (".moe_tok", ".moe", ".moe_checks", ".moe_plan"), ".moe_tok:TokMember",
           ("test_cuda_moe_gpu.py", "test_tok_", True), "moe_tok", GROUPED_USES),
    Member("moe_layer", SHARED + ROUTING + TOKEN, (".moe_layer", ".moe_layer_protocol", ".moe", ".moe_checks", ".moe_plan"),
           ".moe_layer:LayerMember", ("test_cuda_moe_layer_gpu.py", "test_", True), "moe_layer", GROUPED_USES),
)
#: GPU tests every member's record needs besides its own (the texts against the base commit's, PDL)
COMMON_GPU_TESTS = ("test_cuda_base_gpu.py", "test_cuda_pdl_gpu.py")


def by_kernel(registry: Sequence[Member] = REGISTRY) -> dict[str, Member]:
    return {m.kernel: m for m in registry}


def member_of(tactic: Any, registry: Sequence[Member] = REGISTRY) -> Member:
    """The member running `tactic` (by its `kernel` parameter); ValueError for none."""
    for m in registry:
        if m.owns(tactic):
            return m
    raise ValueError(f"cuda: no member runs kernel={tactic.params.get('kernel')!r}")


def sources(registry: Sequence[Member] = REGISTRY) -> dict[str, tuple[Path, ...]]:
    """build.SOURCES: each kernel's files, in the order build.text joins them."""
    return {m.kernel: m.paths() for m in registry}


def launch(registry: Sequence[Member] = REGISTRY) -> dict[str, tuple[str, ...]]:
    """checked.LAUNCH: each kernel's launch Python (besides COMMON_CODE)."""
    return {m.kernel: m.launch for m in registry}


def kernel_tests(registry: Sequence[Member] = REGISTRY) -> dict[str, tuple[str, str, bool]]:
    """tools/mark_gpu_checked.py's KERNEL_TESTS."""
    return {m.kernel: m.tests for m in registry}


def gpu_tests(registry: Sequence[Member] = REGISTRY) -> list[str]:
    """The GPU test files the device driver runs for the members (tests/...), each once, in order."""
    files = [m.tests[0] for m in registry] + list(COMMON_GPU_TESTS)
    return [f"tests/{f}" for f in dict.fromkeys(files)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The cuda family's members")
    ap.add_argument("--gpu-tests", action="store_true", help="print the members' GPU test files, one line")
    a = ap.parse_args(argv)
    if a.gpu_tests:
        print(" ".join(gpu_tests()))
    else:
        for m in REGISTRY:
            print(m.kernel, " ".join(m.files), " ".join(m.launch), m.behaviour)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
