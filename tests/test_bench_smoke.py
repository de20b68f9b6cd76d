"""bench/ under test: every script's CPU smoke run, `--help` that creates nothing, the shell
scripts' syntax and the python they call, and mypy over bench/ and the package (a call of a name
that no longer exists fails here, not on the next GPU session).

SMOKE below names, for each bench script, what CI runs of it: a command on tiny fixture data (a
CPU search of a 4-problem model made once per session, or a small committed cache opened
read-only), a test elsewhere that runs it, or, for the GPU-only scripts, the CPU parts a test here
calls (the GPU parts — CUDA events and graphs, device memory — are left to the device runs).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
DATA = ROOT / "docs" / "data"

# a tiny llama-shaped model: 4 dense problems, N, K <= 1024
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
        "hidden_act": "silu", "torch_dtype": "bfloat16"}

#: script -> (how CI runs it, arguments with {db} {model} {out} {moe_db} filled in) or a note
SMOKE: dict[str, tuple[str, str]] = {
    "compare_winners.py": ("run", "{db} {db} --json {out}/c.json"),
    "dispatch_check.py": ("run", "{db} --model {model} --tp 1 --device cpu --m 1,4"),
    "trial_timeline.py": ("run", "{db}"),
    "slice_table.py": ("run", "{db}"),
    "moe_search_summary.py": ("run", "{moe_db}"),
    "full_search_summary.py": ("run", "{db}"),
    "batch_invariant_cost.py": ("run", "{db} --json {out}/b.json"),
    "rank_h200.py": ("run", "compare {db} {db} --device cpu --json {out}/r.json"),
    "eager_cpu.py": ("run", "--reps 2 --batch 8 --json {out}/e.json"),
    "dispatch_latency.py": ("run", "--reps 2 --batch 4 --calls 16 --json {out}/d.json"),
    "triton_smem_table.py": ("run", "--jobs 1 --limit 1 --archs sm90"),
    "moe_decode_sass.py": ("run", "--arch sm90"),
    "cuda_dispatch.py": ("run", "--out {out} --model {model} --tp 1 --device cpu --m 1,4"),
    "search_cost.py": ("run", "--only dense:bf16*nvfp4->bf16:n6144:k256 --buckets 1 --max-tactics 2 "
                              "--compile-tactics 1"),
    "w4a4_h200.py": ("env W4A4_SMOKE=1", "run --out {out}"),
    "moe_decode_h200.py": ("env MOE_DECODE_SMOKE=1", "--out {out}"),
    "rank_eval.py": ("elsewhere", "tests/test_ranked.py runs main() on the committed full search"),
    "moe_mlp_step_h200.py": ("elsewhere", "tests/test_moe_shared.py runs it with MOE_STEP_SMOKE=1"),
    "triton_h200.py": ("parts", "candidates() of every bucket checked by the family; render on a made JSON"),
    "triton_h200_render.py": ("parts", "render() of a JSON made in test_triton_h200_parts"),
    "triton_explore.py": ("parts", "its candidate lists (built at import) checked by the family"),
    "cuda_h200.py": ("parts", "tests/test_doc_numbers.py renders the committed JSON; candidates checked here"),
    "cublaslt_h200.py": ("parts", "import and --help: every path needs nvmath's cuBLASLt on a GPU"),
    "eager_h200.py": ("parts", "import and --help: every row times CUDA calls or graphs"),
    "common.py": ("parts", "used by the others' --help (test_help_creates_nothing)"),
}

SLOW = {"search_cost.py", "w4a4_h200.py", "moe_decode_h200.py"}     # a minute or so of CPU each


def test_every_bench_script_has_a_smoke_entry():
    scripts = {p.name for p in BENCH.glob("*.py")}
    assert scripts == set(SMOKE), (scripts - set(SMOKE), set(SMOKE) - scripts)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_smoke_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """A cache from a real CPU search (torch family, buckets 1 and 4) of the tiny model."""
    from autotune import api
    from autotune.core.env import cpu
    from autotune.engine import timing
    d = tmp_path_factory.mktemp("bench")
    (d / "model").mkdir()
    (d / "model" / "config.json").write_text(json.dumps(TINY))
    rep = api.search(str(d / "model"), tp=1, families="torch", buckets=[1, 4], cache=str(d / "c.db"), env=cpu(),
                     timer=timing.TimerConfig(warmup=0, min_reps=2, max_reps=3, budget_s=0.01))
    assert rep.failed == 0 and len(rep.winners) == 8
    return {"db": str(d / "c.db"), "model": str(d / "model"), "moe_db": str(DATA / "moe-search-h200.db")}


RUN = sorted(s for s, (how, _) in SMOKE.items() if how == "run" or how.startswith("env "))


@pytest.mark.parametrize("script", RUN)
def test_smoke_run(script, fixtures, tmp_path):
    how, args = SMOKE[script]
    if script in SLOW and os.environ.get("BENCH_SMOKE_SLOW", "1") == "0":
        pytest.skip("BENCH_SMOKE_SLOW=0")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if how.startswith("env "):
        k, v = how[4:].split("=")
        env[k] = v
    argv = [a.format(out=tmp_path, **fixtures) for a in shlex.split(args)]
    r = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip() or list(tmp_path.iterdir()), "printed and wrote nothing"


def test_smoke_outputs_say_what_they_measured(fixtures, tmp_path):
    """The analysis scripts read the fixture's numbers, not a constant: counts from the cache."""
    import sqlite3
    con = sqlite3.connect(fixtures["db"])
    winners = con.execute("select count(*) from winners").fetchone()[0]
    ok = con.execute("select count(*) from trials where status = 'ok'").fetchone()[0]
    tl = subprocess.run([sys.executable, str(BENCH / "trial_timeline.py"), fixtures["db"]], capture_output=True,
                        text=True, cwd=tmp_path)
    assert f"torch ok: {ok}" in tl.stdout and "trials spent on rejected tactics: 0" in tl.stdout
    cw = _load("compare_winners").compare(fixtures["db"], fixtures["db"])
    assert (cw["pairs"], cw["same"]) == (winners, winners)


def _scripts():
    return sorted(p.name for p in BENCH.glob("*.py"))


_HELP = r"""
import os, runpy, sys, tempfile
bad = []
for path in sys.argv[1:]:
    d = tempfile.mkdtemp()
    os.chdir(d)
    sys.argv = [path, "--help"]
    try:
        runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code or 0
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    left = os.listdir(d)
    if code != 0 or left:
        bad.append(f"{os.path.basename(path)}: exit {code}, created {left}")
print("HELP-RESULT", repr(bad))
"""


def test_help_creates_nothing():
    """`--help` of every script exits 0 and creates no file (one process, each in an empty cwd)."""
    paths = [str(BENCH / s) for s in _scripts() if s != "common.py"]
    r = subprocess.run([sys.executable, "-c", _HELP, *paths], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "HELP-RESULT []", r.stdout.splitlines()[-1]


def test_a_missing_cache_is_refused_and_not_created(tmp_path):
    for script in ("trial_timeline.py", "slice_table.py", "moe_search_summary.py", "full_search_summary.py",
                   "dispatch_check.py"):
        r = subprocess.run([sys.executable, str(BENCH / script), "nope.db"], cwd=tmp_path, capture_output=True, text=True)
        assert r.returncode == 2 and "no such file: nope.db" in r.stderr, (script, r.stderr)
    assert list(tmp_path.iterdir()) == []


# -- the shell scripts ---------------------------------------------------------------------------

def _sh():
    return sorted(BENCH.glob("*.sh"))


@pytest.mark.parametrize("sh", _sh(), ids=lambda p: p.name)
def test_shell_script_parses_and_its_python_exists(sh):
    assert subprocess.run(["bash", "-n", str(sh)], capture_output=True).returncode == 0
    text = sh.read_text()
    for script in re.findall(r"python3 (bench/\w+\.py)", text):
        assert (ROOT / script).is_file(), f"{sh.name} calls {script}, which does not exist"


def _calls(text: str) -> list[tuple[str, list[str]]]:
    """(script, flags) of each `python3 bench/x.py ...` line (continuations joined; $VARS kept)."""
    text = text.replace("\\\n", " ")
    out = []
    for m in re.finditer(r"python3 (bench/\w+\.py)([^\n|>;&]*)", text):
        out.append((m.group(1), re.findall(r"(?<!\S)(--[a-z][\w-]*)", m.group(2))))
    return out


def test_shell_scripts_pass_only_flags_the_scripts_have():
    """Each flag a .sh passes to a bench script appears in that script's --help."""
    helps: dict[str, str] = {}
    bad = []
    for sh in _sh():
        for script, flags in _calls(sh.read_text()):
            if script not in helps:
                helps[script] = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True,
                                               text=True, cwd=ROOT).stdout
                if script.endswith(("w4a4_h200.py", "triton_h200.py", "cuda_h200.py")):   # subcommands: their help too
                    for sub in ("run", "render"):
                        helps[script] += subprocess.run([sys.executable, str(ROOT / script), sub, "--help"],
                                                        capture_output=True, text=True, cwd=ROOT).stdout
            bad += [f"{sh.name}: {script} {f}" for f in flags if f not in helps[script]]
    assert bad == []


# -- the GPU-only scripts' CPU parts -------------------------------------------------------------

def test_triton_h200_parts(tmp_path):
    """Every candidate of the table (each bucket) and the search sample is a valid triton tactic;
    the render module (which the run script imports, never the other way) renders a made JSON."""
    from tactics.triton_fp4.family import TritonFamily
    th = _load("triton_h200")
    fam = TritonFamily()
    for m in th.BUCKETS:
        bad = [t for t in th.candidates(m) if fam.validate(t)]
        assert bad == [], (m, bad[:2], fam.validate(bad[0]) if bad else None)
    render_src = (BENCH / "triton_h200_render.py").read_text()
    assert "import triton_h200\n" not in render_src and "from triton_h200 " not in render_src
    assert th.FAM is th.render.__globals__["FAM"]


def test_triton_explore_candidates_are_valid():
    from tactics.triton_fp4.family import TritonFamily
    te = _load("triton_explore")
    fam = TritonFamily()
    assert [t for t in [*te.DECODE, *te.PREFILL, te.DQ] if fam.validate(t)] == []


def test_cuda_h200_tactics_are_the_families():
    from tactics.triton_fp4.family import TritonFamily
    ch = _load("cuda_h200")
    fam = TritonFamily()
    ts = ch.triton_tactics()
    assert ts and [t for t in ts if fam.validate(t)] == []


# -- the static check ----------------------------------------------------------------------------

def test_mypy_finds_no_missing_names(tmp_path):
    """mypy over bench/, tools/ and the package with setup.cfg's [mypy] (attr-defined, name-defined
    and call-arg on): a call of a removed or renamed name fails here."""
    pytest.importorskip("mypy")
    cache = Path(os.environ.get("MYPY_CACHE_DIR", ROOT / ".mypy_cache"))
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
