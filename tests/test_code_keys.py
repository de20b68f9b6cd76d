"""Code keys (autotune.core.codekey): every trial and winner carries a digest of the sources of the
member that measured it, so a kernel edit is never served numbers measured by the old kernel."""
from __future__ import annotations

import dataclasses
import shutil
import sqlite3
import warnings
from pathlib import Path

import grimp
import pytest
from helpers import keyed

from autotune import api
from autotune.core import codekey
from autotune.core.buckets import Buckets
from autotune.core.arch import ARCHS
from autotune.core.env import Env, cpu
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic
from autotune.engine import timing
from autotune.engine.search import search
from autotune.engine.workers import Runner
from autotune.integrations.portable import export_cache, import_cache
from autotune.runtime.dispatch import Dispatcher
from autotune.cache import Store
from autotune.tactics import registry
from autotune.tactics.triton_fp4.family import MEMBERS

ROOT = Path(__file__).resolve().parents[1]
CPU = cpu()
LIB = CPU.lib_key(("torch",))
P = Problem.dense(256, 512)
T = Tactic("torch", dequant_dtype="bf16", chunk_n=0)
FAST = timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01)
BUILTIN = ("torch", "triton", "cutlass", "cublaslt", "cuda", "layer")


def _other_python() -> str | None:
    """A Python of the other tokenizer (3.11 beside 3.12 or the reverse) that runs here, if any
    (AUTOTUNE_OTHER_PY names one off PATH)."""
    import os
    import shutil as sh
    import subprocess
    import sys
    want = "3.12" if sys.version_info[:2] <= (3, 11) else "3.11"
    exe = os.environ.get("AUTOTUNE_OTHER_PY") or sh.which(f"python{want}")
    if exe is None:
        return None
    ok = subprocess.run([exe, "-c", "import sys; assert sys.version_info[:2] == tuple(map(int, sys.argv[1].split('.')))", want],
                        capture_output=True)
    return exe if ok.returncode == 0 else None



def _entries():
    """(Code, the module that defines the member) of every built-in member."""
    out = [(m.code, type(m).__module__) for m in MEMBERS]
    from autotune.tactics.cuda import members as cuda_members
    out += [(m.code, type(m.impl()).__module__) for m in cuda_members.REGISTRY]    # each in its own module
    for name in BUILTIN:
        fam = registry.get(name)
        if name not in ("triton", "cuda"):
            out += [(c, type(fam).__module__) for c in fam.codes()]
    return out


def _closure(graph, module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo += graph.find_modules_directly_imported_by(m)
    return seen


def test_every_member_declares_the_project_modules_its_code_imports():
    """Walk each member's imports (function-local ones too) through the project's packages: a
    module reached but not declared is code that could change without changing the key."""
    tops = sorted({m.split(".")[0] for code, _ in _entries() for m in code.modules})
    graph = grimp.build_graph(*tops, cache_dir=None)
    missing = {}
    for code, module in _entries():
        assert module in code.modules, f"{code.member} does not declare its own module {module}"
        lost = _closure(graph, module) - set(code.modules) - set(codekey.BY_VALUE)
        if lost:
            missing[code.member] = sorted(lost)
    assert missing == {}, f"members import project modules they do not declare: {missing}"
    assert {c.member for f in BUILTIN for c in registry.get(f).codes()} == {c.member for c, _ in _entries()}


def _copy(tmp: Path) -> Path:
    """The declared sources of every member, copied under `tmp` as they are laid out here."""
    for code, _ in _entries():
        files = [codekey.module_file(m) for m in code.modules] + [codekey.data_file(p, f) for p, f in code.files]
        for f in files:
            top = next(m.split(".")[0] for m in code.modules)
            rel = f.relative_to(codekey._package_dir(top, None).parent)
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, tmp / rel)
    return tmp


def _digests(root: Path) -> dict[str, str]:
    return {c.member: codekey.digest(c, root) for c, _ in _entries()}


def _edit(root: Path, where: str, old: str, new: str) -> None:
    """Replace the first `old` in module `where` (or the data file "package:name") under `root`."""
    pkg, _, name = where.partition(":")
    f = codekey.data_file(pkg, name, root) if name else codekey.module_file(where, root)
    text = f.read_text()
    assert old in text, (where, old)
    f.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def declared(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The declared sources of every member copied once (_copy), and their digests, which equal
    the installed tree's; each edit below is made to a copy of this copy."""
    root = _copy(tmp_path_factory.mktemp("declared") / "src")
    before = _digests(root)
    assert before == {c.member: codekey.digest(c) for c, _ in _entries()}      # the copy keys as installed
    return root, before


@pytest.mark.parametrize("module, old, new, changed", [
    # one line of one kernel: only its member's key moves
    ("autotune.tactics.triton_fp4.w4a4_kernels", "tl.store(", "tl.store( ", set()),           # whitespace: no code change
    ("autotune.tactics.triton_fp4.moe_decode_kernel", "import triton\n", "import triton\nSCALE_BUG = 2\n", {"triton/moe_decode"}),
    # the layer family's torch composition runs torch_ref's grouped calls
    ("autotune.tactics.torch_ref", "import torch\n", "import torch\nSCALE_BUG = 2\n", {"torch", "layer"}),
    ("autotune.tactics.cuda:w4a16_mma.cu", "struct DenseRows", "#define SCALE_BUG 2\nstruct DenseRows", {"cuda/w4a16_mma"}),
    # a cuda member's key covers its own text and launch and the shared parts it includes, no other member's
    ("autotune.tactics.cuda:ring.cuh", "struct TileBase", "#define SCALE_BUG 2\nstruct TileBase",
     {"cuda/w4a16_mma", "cuda/moe_mma", "cuda/moe_tok", "cuda/moe_layer"}),
    ("autotune.tactics.cuda:moe_common.cuh", "static", "#define SCALE_BUG 2\nstatic", {"cuda/moe_mma", "cuda/moe_tok", "cuda/moe_layer"}),
    ("autotune.tactics.cuda.dense", "import torch\n", "import torch\nSCALE_BUG = 2\n", {"cuda/w4a16_mma"}),
    ("autotune.tactics.cuda.moe_tok", "import torch\n", "import torch\nSCALE_BUG = 2\n", {"cuda/moe_tok"}),
    # kernel.py holds the W4A16 main loop that four members share (moe_decode_kernel imports it)
    ("autotune.tactics.triton_fp4.kernel", "import triton\n", "import triton\nSCALE_BUG = 2\n",
     {"triton/w4a16_dequant", "triton/dequant_cublas", "triton/moe_w4a16", "triton/moe_decode"}),
    # prose is not code: a comment or a docstring keeps every key
    ("autotune.tactics.torch_ref", "import torch\n", "import torch  # the reference\n", set()),
    ("autotune.tactics.triton_fp4.w4a4_kernels", '"""', '"""Edited prose. ', set()),
])
def test_one_edit_changes_only_the_keys_of_the_members_that_run_it(tmp_path, module, old, new, changed, declared):
    src, before = declared
    root = Path(shutil.copytree(src, tmp_path / "src"))        # the same bytes: the same digests as `before`
    _edit(root, module, old, new)
    after = _digests(root)
    assert {m for m in before if before[m] != after[m]} == changed


def _cache(path, *winners) -> Path:
    with Store(path) as s:
        s.put_environment(CPU, ("torch",))
        for w in winners:
            s.put_winner(w)
    return path


def _winner(bucket=4, **kw) -> Winner:
    return Winner(P.key, bucket, CPU.device_key, T.id, "torch", T.to_json(), LIB, 10.0, T.id, 10.0, 1.0, **kw)


# f-strings in every form 3.12's tokenizer splits into pieces (nested fields, format specs, quotes
# inside fields, triple-quoted over lines, a docstring beside them); the expected text is 3.11's
# one-STRING-token view of them, written out so any interpreter is held to it.
F_SRC = '''def f(x, w):
    """A docstring: dropped."""
    a = f"{x!r:>{w}} and {{braces}}"  # a comment
    b = f'{ {"k": x}["k"] } {f"{x}"}'
    c = f"""one
{x}
two"""
    return a + b + c
'''
F_TOKENS = "\n".join([
    "def f ( x , w ) :", "INDENT",
    'a = f"{x!r:>{w}} and {{braces}}"',
    'b = f\'{ {"k": x}["k"] } {f"{x}"}\'',
    'c = f"""one\n{x}\ntwo"""',
    "return a + b + c", "DEDENT"])


def test_the_code_digest_reads_f_strings_alike_on_every_python():
    # the device (Python 3.12) records GPU checks by digest and CI (3.11) reads them: the two
    # tokenizers must give one stream (they differ on f-strings unless folded back)
    assert codekey._python_tokens(F_SRC) == F_TOKENS


def test_another_python_digests_every_project_module_alike():
    other = _other_python()              # asked here, not at import: a subprocess per collection otherwise
    if other is None:
        pytest.skip("no second Python (3.11/3.12) on PATH to compare against")
    import subprocess
    import sys
    prog = ("import hashlib, json, pathlib, sys; sys.path.insert(0, sys.argv[1]); "
            "from autotune.core.codekey import _python_tokens as t; "
            "r = pathlib.Path(sys.argv[1]); print(json.dumps({str(f.relative_to(r)): "
            "hashlib.sha256(t(f.read_text(encoding='utf-8')).encode()).hexdigest() "
            "for d in ('autotune', 'tactics', 'cache') for f in sorted((r / d).rglob('*.py'))}))")
    got = {}
    for py in (sys.executable, other):
        run = subprocess.run([py, "-c", prog, str(ROOT)], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-400:]
        got[py] = __import__("json").loads(run.stdout)
    a, b = got.values()
    assert len(a) > 100 and a == b


def test_dispatch_serves_a_winner_only_under_the_code_that_measured_it(tmp_path):
    current = keyed(_winner())
    other = codekey.code_key_at(LIB, registry.code_of(T), _edited_torch(tmp_path))
    assert other != current.code_key
    db = _cache(tmp_path / "c.db", current, _winner(8, code_key=other), _winner(16))     # edited code; no key
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        d = Dispatcher(db, env=CPU, record_misses=False)
    assert d.skipped == {"torch code differs": 2}
    assert d.table(P).buckets == (4,)
    notes = [str(w.message) for w in seen if "other kernel code" in str(w.message)]
    assert len(notes) == 1 and "2 cached winner(s)" in notes[0] and "`autotune search`" in notes[0]


def _edited_torch(tmp_path) -> Path:
    root = _copy(tmp_path / "edited")
    _edit(root, "autotune.tactics.torch_ref", "import torch\n", "import torch\nSCALE_BUG = 2\n")
    return root


def test_search_measures_again_what_other_code_measured(tmp_path):
    store = Store(tmp_path / "c.db")
    run = dict(families=[registry.get("torch")], store=store, buckets=Buckets.of((4,)), timer=FAST, env=CPU,
               runner=Runner(isolate=False))
    first = search([P], **run)
    assert first.measured > 0 and first.winners and first.winners[0].code_key == keyed(first.winners[0]).code_key
    assert search([P], **run).measured == 0                  # same code: resumed
    con = sqlite3.connect(tmp_path / "c.db")                 # as if measured by an older kernel
    con.execute("UPDATE trials SET code_key = ''")
    con.execute("UPDATE winners SET code_key = ''")
    con.commit()
    con.close()
    again = search([P], **run)
    assert again.measured == first.measured and again.resumed == 0
    assert all(registry.stale_code(w) is None for w in store.winners())
    # the old rows stay beside the new ones (readable), the new winner replaced the old
    assert sum(t.code_key == "" for t in store.trials()) == len(store.trials()) // 2
    store.close()


def test_show_stale_lists_and_prune_stale_code_removes_rows_of_other_code(tmp_path):
    db = _cache(tmp_path / "c.db", keyed(_winner(4)), _winner(8))
    with Store(db) as s:
        s.put_trial(keyed(Trial(P.key, 4, T.id, "torch", T.to_json(), CPU.device_key, LIB, "ok", median_us=10.0)))
        s.put_trial(Trial(P.key, 8, T.id, "torch", T.to_json(), CPU.device_key, LIB, "ok", median_us=10.0))
    shown = api.show(str(db), stale=True)
    assert [(w.bucket, why) for w, why in shown.stale] == [(8, "measured with other code: no code key "
                                                               "(stored before code keys were)")]
    assert shown.stale_trials == 1
    assert api.prune(str(db), stale_code=True, dry_run=True).winners == 1
    rep = api.prune(str(db), stale_code=True)
    assert (rep.trials, rep.winners) == (1, 1)
    with Store(db, readonly=True) as s:
        assert [w.bucket for w in s.winners()] == [4] and len(s.trials()) == 1


def test_exports_carry_the_key_and_import_warns_on_a_mismatch(tmp_path):
    src = _cache(tmp_path / "src.db", keyed(_winner(4)), _winner(8, code_key="0123456789abcdef"))
    with Store(src, readonly=True) as s:
        export_cache(s, tmp_path / "out.json", fmt="json")
    import json
    doc = json.loads((tmp_path / "out.json").read_text())
    assert sorted(w["code_key"] for w in doc["winners"]) == sorted(["0123456789abcdef", keyed(_winner(4)).code_key])
    with Store(tmp_path / "dst.db") as dst:
        rep = import_cache(dst, tmp_path / "out.json", validate=registry.validate)
        assert rep.imported == 2 and rep.stale_code == 1
        assert "1 imported winner(s)" in rep.warning() and "`autotune search`" in rep.warning()
        assert {w.bucket: w.code_key for w in dst.winners()}[8] == "0123456789abcdef"


def test_a_committed_cache_from_older_code_reads_but_is_not_served():
    """tests/data/2026-11-29-h200-glm5-tp8-search.db (schema 1, no code keys): readable read-only, every winner stale;
    under an environment with its very library versions, nothing is served and nothing crashes."""
    db = ROOT / "tests/data/2026-11-29-h200-glm5-tp8-search.db"
    with Store(db, readonly=True) as s:
        ws = s.winners()
        libs = {w.lib_key: s.libset(w.lib_key) for w in ws}
        dev = s.device_records()[ws[0].device_key]
    assert ws and all(w.code_key == "" and registry.stale_code(w) for w in ws)
    versions = {k: v for d in libs.values() for k, v in d.items()}
    h200 = Env(dev["gpu_name"], dev["cc"], dev["sm_count"], "cuda", libs=tuple(sorted(versions.items())))
    assert h200.device_key == ws[0].device_key
    d = Dispatcher(db, env=h200, arch=ARCHS["sm90"], record_misses=False, warn=False)
    assert sum(d.skipped.values()) == len(ws) and {k.split()[-2:] == ["code", "differs"] for k in d.skipped} == {True}


def test_compile_check_audits_kept_and_rejected_verdicts_against_the_compiler(register_family):
    """The verdict audit (both ways): a kept tactic the compiler puts over the limit, and of the
    footprint-rejected ones (seeded sample) those the compiler fits in: lost."""
    from autotune.core.arch import get_arch
    from autotune.report import text
    fam = register_family("footprint", "tests.families.footprint:FootprintFamily")
    big = Problem.dense(4096, 512)                    # every chunk_n < N: nothing rejected by a rule
    rep = search([big], families=[fam], store=Store("sqlite://"), buckets=Buckets.of((1,)), env=CPU,
                 arch=get_arch("sm90"), dry_run=True, compile_check=True, runner=Runner(isolate=False))
    a = rep.audit
    assert (a.kept_compiled, a.footprint_rejected, a.sampled, a.compiled, a.rule_rejected) == (4, 2, 2, 2, 0)
    assert len(a.kept_over) == 1 and "chunk_n=512,dequant_dtype=fp32" in a.kept_over[0].replace(" ", "")
    assert len(a.lost) == 1 and "chunk_n=2048,dequant_dtype=bf16" in a.lost[0].replace(" ", "")
    assert "compiled smem 50000 <= 232448" in a.lost[0]
    lines = list(text.search_lines(rep, []))
    assert any(line.startswith("verdict audit on sm90: 1 of 4 compiled kept tactics over the smem limit; 1 of 2")
               for line in lines)
    again = search([big], families=[fam], store=Store("sqlite://"), buckets=Buckets.of((1,)), env=CPU,
                   arch=get_arch("sm90"), dry_run=True, compile_check=True, audit_rejected=1, seed=3,
                   runner=Runner(isolate=False))
    assert (again.audit.sampled, again.audit.footprint_rejected) == (1, 2)


def test_the_search_says_why_tactics_stayed_unknown():
    from autotune.core.tactic import Verdict
    from autotune.engine.search import Planned, summarize
    t = [Tactic("triton", kernel="w4a16_dequant", block_m=16, block_n=16 * i, block_k=64, group_m=1, num_warps=4,
                num_stages=2, split_k=1) for i in (1, 2, 3)]
    rows = [Planned(P, t[0], Verdict(None, "unknown: block_n=16 is outside; no compiler figure for it")),
            Planned(P, t[1], Verdict(None, "unknown: block_n=32 is outside; no compiler figure for it")),
            Planned(P, t[2], Verdict.keep())]
    [fp] = summarize({P: rows})[P.key]
    assert fp.unknown == 2 and "2 unknown until checked on the device (2× e.g. unknown: block_n=16" in fp.line()
