"""Which cuda kernel texts count as GPU-checked (tactics/cuda/checked.py): a kernel is kept by the
family only while its current text's digest is the one recorded in gpu_checked.json from a passing
GPU-test log (tools/mark_gpu_checked.py); any edit to the text makes it `unknown` again by itself."""
import json

import pytest

from autotune.core.arch import get_arch
from autotune.core.problem import Problem
from autotune.core.tactic import Tactic
from autotune.tactics.cuda import build as B
from autotune.tactics.cuda import checked as CK
from autotune.tactics.cuda import moe as MOE
from autotune.tactics.cuda.family import DENSE_UNRUN, CudaFamily
from tools import mark_gpu_checked as MARK

FAM, SM90 = CudaFamily(), get_arch("sm90")
W2R = Problem.moe(6144, 256, 256, 8, epilogue="reduce")
MMA = Tactic("cuda", kernel="moe_mma", warps_k=1, stages=2, tiles_n=1, m_tiles=1, split_k=1)
TOK = Tactic("cuda", kernel="moe_tok", warps_k=1, stages=2, tiles_n=1)
DENSE = Tactic("cuda", warps_k=4, stages=4, tiles_n=1)


@pytest.fixture
def record(tmp_path, monkeypatch):
    path = tmp_path / "gpu_checked.json"
    monkeypatch.setattr(CK, "RECORD", path)
    return path


def _write(path, **digests):
    path.write_text(json.dumps({k: {"digest": d, "log": "x.txt", "passed": 1, "date": "2026-12-04", "gpu": "g"}
                                for k, d in digests.items()}))


def test_the_verdict_follows_the_record(record):
    assert FAM.verdict(W2R, TOK, SM90).unchecked and FAM.verdict(W2R, MMA, SM90).unchecked   # no record
    assert FAM.verdict(Problem.dense(512, 6144), DENSE, SM90).reason == DENSE_UNRUN
    _write(record, moe_tok=CK.digest("moe_tok"), moe_mma="0" * 16, w4a16_mma=CK.digest("w4a16_mma"))
    assert FAM.verdict(W2R, TOK, SM90).ok is True
    v = FAM.verdict(W2R, MMA, SM90)                       # a stale digest: an older text passed, not this one
    assert v.ok is None and v.reason == MOE.UNRUN and v.smem_bytes == B.smem_bytes(MOE.config(W2R, MMA))
    assert FAM.verdict(Problem.dense(512, 6144), DENSE, SM90).ok is True


def test_an_edited_kernel_or_its_launch_code_is_unchecked(record, tmp_path):
    """The digest covers the kernel's text, build/layout/pdl and its launcher: an edit to any of them
    (a comment in the .cu text too) leaves the kernel unrecorded; other kernels keep theirs."""
    import shutil
    from pathlib import Path
    src = Path(B.__file__).parent
    _write(record, moe_tok=CK.digest("moe_tok"), w4a16_mma=CK.digest("w4a16_mma"))
    for name, text in (("moe_tok.cu", "\n// a comment is an edit too\n"), ("moe_tok.py", "\nX = 1\n"),
                       ("moe_common.cuh", "\n// shared by both grouped kernels\n")):
        root = tmp_path / name
        shutil.copytree(src, root / "autotune" / "tactics" / "cuda")
        with open(root / "autotune" / "tactics" / "cuda" / name, "a") as f:
            f.write(text)
        assert CK.checked("moe_tok") and not CK.checked("moe_tok", root=root), name
        assert CK.checked("w4a16_mma", root=root)            # its code is untouched by these edits


def test_the_committed_record_names_committed_logs():
    from pathlib import Path
    docs = Path(__file__).resolve().parents[1] / "docs" / "data"
    rec = CK.record()
    assert set(rec) <= set(B.SOURCES)
    for kernel, entry in rec.items():
        assert len(entry["digest"]) == 16 and (docs / entry["log"]).is_file(), (kernel, entry)
        assert entry["passed"] > 0


@pytest.mark.parametrize("line,n", [("65 passed, 46 deselected, 9 warnings in 169.65s (0:02:49)", 65),
                                    ("=== 3 passed in 1.0s ===", 3)])
def test_a_passing_log_qualifies(line, n):
    assert MARK.passed(f"....\n{line}\n") == n


@pytest.mark.parametrize("log", ["1 failed, 64 passed in 3s", "60 passed, 5 skipped in 3s", "2 errors in 1s",
                                 "0 passed", "collected 65 items\n....", "64 passed, 1 xpassed in 2s",
                                 "SKIPPED [2] tests/test_cuda_moe_gpu.py:40: CuPy not installed\n60 passed, 2 skipped",
                                 "SKIPPED [1] tests/test_bound.py:9: x\n60 passed, 2 skipped in 3s"])
def test_anything_else_does_not(log):
    with pytest.raises(ValueError):
        MARK.passed(log)


def test_a_named_skip_outside_the_cuda_files_is_allowed():
    assert MARK.passed("SKIPPED [2] tests/test_bound.py:9: needs FlashInfer\n60 passed, 2 skipped in 3s") == 60


def test_a_kernel_needs_its_own_passed_tests():
    log = ("PASSED tests/test_cuda_moe_gpu.py::test_matches_float64[w2-nvfp4]\n"
           "PASSED tests/test_cuda_gpu.py::test_configs_match_float64[x]\n")
    assert MARK.evidence(log, "moe_mma") == 1 and MARK.evidence(log, "w4a16_mma") == 1
    assert MARK.evidence(log, "moe_tok") == 0                      # moe_mma's tests say nothing of moe_tok
    assert MARK.evidence("PASSED tests/test_cuda_moe_gpu.py::test_tok_bad_ids_and_the_shared_slot\n", "moe_tok") == 1


def test_the_tool_records_the_current_digests(tmp_path):
    rec = tmp_path / "rec.json"
    rec.write_text(json.dumps({"w4a16_mma": {"digest": "old", "log": "a.txt", "passed": 1}}))
    log = tmp_path / "gpu-tests-full.txt"
    log.write_text("...\n12 passed in 3.2s\n")
    assert MARK.main([str(log), "--record", str(rec), "--kernel", "moe_tok", "--gpu", "H"]) == 1   # no moe_tok test in it
    log.write_text("PASSED tests/test_cuda_moe_gpu.py::test_tok_bad_ids_and_the_shared_slot\n12 passed in 3.2s\n")
    assert MARK.main([str(log), "--record", str(rec), "--kernel", "moe_tok", "--gpu", "H", "--log-name", "t.txt"]) == 0
    got = json.loads(rec.read_text())
    assert got["w4a16_mma"]["digest"] == "old"                      # other kernels left as they were
    assert got["moe_tok"] == {"digest": CK.digest("moe_tok"), "log": "t.txt", "passed": 12,
                              "date": got["moe_tok"]["date"], "gpu": "H"}
    log.write_text("PASSED tests/test_cuda_moe_gpu.py::test_tok_bad_ids_and_the_shared_slot\n1 failed, 11 passed in 3.2s\n")
    before = rec.read_text()
    assert MARK.main([str(log), "--record", str(rec), "--kernel", "moe_tok", "--gpu", "H"]) == 1
    assert rec.read_text() == before                                # nothing written on a failing log


def test_a_built_package_ships_every_file_the_kernels_and_the_record_read():
    """setup.cfg's package data covers each file build.text joins and the record (a wheel of
    2026-12-04 lacked mma_common.cuh: every cuda compile would have failed in such an install)."""
    import configparser
    import fnmatch
    from pathlib import Path
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    pats = [p.strip() for p in cfg["options.package_data"]["autotune.tactics.cuda"].split(",")]
    files = {f.name for fs in B.SOURCES.values() for f in fs} | {CK.RECORD.name}
    assert all(any(fnmatch.fnmatch(f, p) for p in pats) for f in files), (files, pats)


def test_carry_moves_an_entry_to_a_new_digest_form_only_where_the_old_form_saw_this_code(tmp_path):
    """tools/carry_gpu_checked.py: an entry whose digest the old form gives for today's files is
    rewritten with today's digest (log, count, date, GPU kept, `carried` added); an entry the old form
    does not match (other code passed) is left as it was, so its kernel stays `unknown`."""
    import sys
    from pathlib import Path
    from tools import carry_gpu_checked as CARRY
    src = (Path(CK.__file__).resolve().parents[2] / "autotune" / "core" / "codekey.py").read_text()
    assert "_FORM = 2\n" in src
    old = tmp_path / "old_codekey.py"                  # an "earlier form": the same reader, another header
    old.write_text(src.replace("_FORM = 2\n", "_FORM = 1\n"))
    codes = {k: [CK.code(k).member, list(CK.code(k).modules), [list(f) for f in CK.code(k).files]]
             for k in ("moe_mma", "moe_tok")}
    was = CARRY.old_digests(old, sys.executable, codes)
    assert was["moe_mma"] != CK.digest("moe_mma")      # the form is in the digest
    rec = tmp_path / "rec.json"
    entry = {"log": "gpu-tests-x.txt", "passed": 71, "date": "2026-12-05", "gpu": "NVIDIA H200"}
    rec.write_text(json.dumps({"moe_mma": {**entry, "digest": was["moe_mma"]},
                               "moe_tok": {**entry, "digest": "0" * 16}}))
    assert CARRY.main(["--old-codekey", str(old), "--python", sys.executable, "--record", str(rec)]) == 0
    got = json.loads(rec.read_text())
    assert got["moe_mma"] == {**entry, "digest": CK.digest("moe_mma"), "carried": got["moe_mma"]["carried"]}
    assert was["moe_mma"] in got["moe_mma"]["carried"]
    assert got["moe_tok"] == {**entry, "digest": "0" * 16}
    assert CK.checked("moe_mma", rec) and not CK.checked("moe_tok", rec)
    # nothing left to carry: one line, exit 1, the file unchanged
    before = rec.read_text()
    assert CARRY.main(["--old-codekey", str(old), "--python", sys.executable, "--record", str(rec)]) == 1
    assert rec.read_text() == before
