"""The cuda family as members (tactics/cuda/members.py): every list that names the kernels — the
files each text joins, the launch Python each GPU-check record digests, the code keys, the GPU tests
that record a kernel and the ones the device driver runs — is derived from the one registry, so a
new member is its files plus one registry line; each member's code key is its own."""
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

from autotune.core.tactic import Tactic
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import checked as CK
from autotune.tactics.cuda import members as M
from autotune.tactics.cuda.family import CudaFamily

ROOT = Path(__file__).resolve().parents[1]


def _mark():
    spec = importlib.util.spec_from_file_location("mark_gpu_checked", ROOT / "tools" / "mark_gpu_checked.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_kernel_list_is_the_registrys():
    assert B.SOURCES == M.sources() and list(B.SOURCES) == [m.kernel for m in M.REGISTRY]
    assert CK.LAUNCH == M.launch()
    assert _mark().KERNEL_TESTS == M.kernel_tests()
    assert CudaFamily().codes() == tuple(m.code for m in M.REGISTRY)
    for m in M.REGISTRY:
        assert m.paths()[-1].name == f"{m.kernel}.cu" and all(p.exists() for p in m.paths())
        assert set(CK.code(m.kernel).files) <= set(m.code.files)            # the record digests its own files
        assert set(CK.code(m.kernel).modules) <= set(m.code.modules)


def test_a_new_member_is_its_files_plus_one_registry_line():
    new = M.Member("moe_new", M.SHARED + M.ROUTING, (".moe_new",), ".moe_new:NewMember",
                   ("test_cuda_new_gpu.py", "test_", True), "moe_new")
    reg = M.REGISTRY + (new,)
    assert M.sources(reg)["moe_new"] == tuple(Path(M.__file__).parent / f for f in
                                              (*M.SHARED, "moe_common.cuh", "moe_new.cu"))
    assert M.launch(reg)["moe_new"] == (".moe_new",)
    assert M.kernel_tests(reg)["moe_new"] == ("test_cuda_new_gpu.py", "test_", True)
    assert "tests/test_cuda_new_gpu.py" in M.gpu_tests(reg)
    assert M.member_of(Tactic("cuda", kernel="moe_new", warps_k=1), reg) is new
    assert ("autotune.tactics.cuda", "moe_new.cu") in new.code.files
    assert "autotune.tactics.cuda.moe_new" in new.code.modules
    assert new.code.member == "cuda/moe_new"
    # and nothing else of the family names the kernels: the family's choices go through the registry
    src = (Path(M.__file__).parent / "family.py").read_text()
    assert not re.search(r"\bis_(moe|tok)\(", src)


def test_a_tactic_goes_to_its_member():
    fam = CudaFamily()
    dense = Tactic("cuda", warps_k=4, stages=4, tiles_n=1)
    mma = Tactic("cuda", kernel="moe_mma", warps_k=4, stages=4, tiles_n=1, m_tiles=1, split_k=1)
    tok = Tactic("cuda", kernel="moe_tok", warps_k=4, stages=4, tiles_n=1)
    assert [M.member_of(t).kernel for t in (dense, mma, tok)] == ["w4a16_mma", "moe_mma", "moe_tok"]
    assert [fam.code(t).member for t in (dense, mma, tok)] == ["cuda/w4a16_mma", "cuda/moe_mma", "cuda/moe_tok"]
    assert "none of moe_mma, moe_tok" in fam.validate(Tactic("cuda", kernel="moe_nope", warps_k=4))


def test_each_members_code_key_is_narrow():
    """A member's key covers no other member's own text or launch module."""
    own = {m.kernel: {f for f in m.files if f not in M.SHARED + M.ROUTING + M.TOKEN} for m in M.REGISTRY}
    for m in M.REGISTRY:
        files = {f for _, f in m.code.files}
        assert not any(files & own[o] for o in own if o != m.kernel), m.kernel
    dense = M.by_kernel()["w4a16_mma"].code.modules
    assert "autotune.tactics.cuda.moe" not in dense and "autotune.tactics.cuda.family" not in dense
    assert "autotune.tactics.cuda.dense" not in M.by_kernel()["moe_mma"].code.modules


def test_the_device_driver_runs_the_members_gpu_tests():
    sh = (ROOT / "bench" / "device_run.sh").read_text()
    assert "$(python3 -m autotune.tactics.cuda.members --gpu-tests)" in sh
    for f in M.gpu_tests():
        assert (ROOT / f).exists(), f
        assert Path(f).name not in re.sub(r"\$\(python3 -m autotune.tactics.cuda.members --gpu-tests\)", "", sh)


def test_every_launcher_of_every_member_makes_its_output_when_given_none():
    """`kernel(x, w, ...)` without `out=` is the kernel interface (autotune.tactics.base: an engine's
    layers call with out=None): each launch module's callable classes take `out` defaulting to None."""
    seen = []
    for m in M.REGISTRY:
        for rel in m.launch:
            mod = importlib.import_module(rel, "autotune.tactics.cuda")
            for cls in vars(mod).values():
                if not (inspect.isclass(cls) and cls.__module__ == mod.__name__ and "__call__" in vars(cls)):
                    continue
                out = inspect.signature(cls.__call__).parameters.get("out")
                if out is not None and out.kind != inspect.Parameter.VAR_KEYWORD:
                    seen.append(cls.__name__)
                    assert out.default is None, f"{mod.__name__}.{cls.__name__}.__call__: out has no default None"
    assert {"Launch", "MoeLaunch", "TokLaunch"} <= set(seen), seen
