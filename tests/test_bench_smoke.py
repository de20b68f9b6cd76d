"""bench/ under test: every script's CPU smoke run, `--help` that creates nothing, the shell
scripts' syntax and the python they call, and mypy over bench/ and the package (a call of a name
that no longer exists fails here, not on the next GPU session).

SMOKE below names, for each bench script, what CI runs of it: a command on tiny fixture data (a
CPU search of a 4-problem model made once per run, or a small committed cache opened
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
    "compare_winners.py": ("run", "{db} {db2} --json {out}/c.json"),
    "dispatch_check.py": ("run", "{db} --model {model} --tp 1 --device cpu --m 1,4"),
    "trial_timeline.py": ("run", "{db}"),
    "slice_table.py": ("run", "{db}"),
    "moe_search_summary.py": ("run", "{moe_db}"),
    "full_search_summary.py": ("run", "{db}"),
    "batch_invariant_cost.py": ("run", "{db} --json {out}/b.json"),
    "rank_h200.py": ("here", "test_smoke_outputs_say_what_they_measured: compare re-times the differing winner"),
    "eager_cpu.py": ("run", "--reps 2 --batch 8 --json {out}/e.json"),
    "moe_host.py": ("run", "--experts 8 --reps 2 --batch 4 --profile 3 --json {out}/h.json"),
    "dispatch_latency.py": ("run", "--reps 2 --batch 4 --calls 16 --json {out}/d.json"),
    "triton_smem_table.py": ("run", "--jobs 1 --limit 1 --archs sm90"),
    "moe_decode_sass.py": ("run", "--arch sm90"),
    "cuda_dispatch.py": ("run", "--out {out} --model {model} --tp 1 --device cpu --m 1,4"),
    # the fused MoE down_proj: one footprint-rejected Triton config on sm90 (the dense problems have
    # 24), so --compile-check's verdict audit compiles 1 config, not 24, in each compile row
    "search_cost.py": ("run", "--only grouped_moe:bf16*nvfp4->bf16:n6144:k256:e256:top8:reduce --buckets 1 "
                              "--max-tactics 2 --compile-tactics 1"),
    "w4a4_h200.py": ("env W4A4_SMOKE=1", "run --out {out}"),
    "moe_decode_h200.py": ("env MOE_DECODE_SMOKE=1", "--out {out}"),
    "mlp_step_graph_h200.py": ("env MLP_GRAPH_SMOKE=1", "--out {out} --cache {moe_db} --mlp linear,fold --prefetch 0,1"),
    "rank_eval.py": ("elsewhere", "tests/test_ranked.py runs main() on the committed full search"),
    "moe_mlp_step_h200.py": ("elsewhere", "tests/test_moe_shared.py runs it with MOE_STEP_SMOKE=1"),
    "triton_h200.py": ("parts", "candidates() of every bucket checked by the family; render on a made JSON"),
    "triton_h200_render.py": ("parts", "render() of a JSON made in test_triton_h200_parts"),
    "triton_explore.py": ("parts", "its candidate lists (built at import) checked by the family"),
    "cuda_h200.py": ("parts", "tests/test_doc_numbers.py renders the committed JSON; candidates checked here"),
    "cublaslt_h200.py": ("parts", "import and --help: every path needs nvmath's cuBLASLt on a GPU"),
    "eager_h200.py": ("parts", "import and --help: every row times CUDA calls or graphs"),
    "capture_leak_h200.py": ("parts", "import and --help: every part captures CUDA graphs"),
    "fold_routing_ab_h200.py": ("run", "--plan --cache {main13}"),     # the folded problems' stored bests
    "cuda_moe_h200.py": ("run", "--plan"),
    "pdl_h200.py": ("run", "--plan"),
    "rank_bests.py": ("run", "--json {out}/rb.json"),
    "precompile_cost.py": ("run", "--problem grouped_moe:bf16*nvfp4->bf16:n6144:k256:e257:top9:reduce --n 1 "
                                  "--json {out}/pc.json"),
    "cuda_moe_regs.py": ("run", "--json {out}/regs.json"),     # nvcc (CI has it), this tree's text only
    "moe_latency_h200.py": ("run", "--plan"),
    "verdict_audit.py": ("parts", "import and --help; the audit it drives is tested in tests/test_code_keys.py"),
    "checkpoint_gpu.py": ("parts", "import and --help: it builds the checkpoint layers on a CUDA device"),
    "moe_scan_ab_h200.py": ("run", "--plan --cache {main13}"),
    "kernel_coverage.py": ("run", "{db} --json {out}/kc.json"),
    "ncu_phases.py": ("run", "{ncu_src} --kernel 5 --json {out}/ph.json"),   # the fourteenth's committed export
    "floor_table.py": ("run", "{main13} --json {out}/ft.json"),    # the thirteenth main job's committed cache
    "main_job_summary.py": ("run", "{db} --model {model} --tp 1 --max-tokens 4 --device cpu -o {out}/s.json"),
    "common.py": ("parts", "used by the others' --help (test_help_creates_nothing)"),
}

def test_every_bench_script_has_a_smoke_entry():
    scripts = {p.name for p in BENCH.glob("*.py")}
    assert scripts == set(SMOKE), (scripts - set(SMOKE), set(SMOKE) - scripts)
    for script, (how, note) in SMOKE.items():
        if how == "elsewhere":      # the test named runs the script
            test = ROOT / note.split()[0]
            assert script.removesuffix(".py") in test.read_text(), (script, test)


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
    # qkv, o, gate_up, down + gate_up's SwiGLU form FP4MLP serves (a whole-model search lists it), 2 buckets
    assert rep.failed == 0 and len(rep.winners) == 10
    # a second cache whose winner at one (problem, bucket) is another measured tactic
    import sqlite3
    a, b = sqlite3.connect(d / "c.db"), sqlite3.connect(d / "c2.db")
    a.backup(b)
    a.close()
    (key, bucket, other), = b.execute(
        "select w.problem_key, w.bucket, t.tactic_id from winners w join trials t on t.problem_key = w.problem_key "
        "and t.bucket = w.bucket and t.status = 'ok' and t.tactic_id != w.tactic_id limit 1").fetchall()
    b.execute("update winners set tactic_id = ? where problem_key = ? and bucket = ?", (other, key, bucket))
    b.commit()
    b.close()
    return {"db": str(d / "c.db"), "db2": str(d / "c2.db"), "model": str(d / "model"),
            "moe_db": str(DATA / "moe-search-h200.db"), "main13": str(DATA / "main-job-h200-thirteenth.db.xz"),
            "ncu_src": str(DATA / "ncu-h200-fourteenth" / "ncu_source.csv.gz")}


RUN = sorted(s for s, (how, _) in SMOKE.items() if how == "run" or how.startswith("env "))


@pytest.mark.parametrize("script", RUN)
def test_smoke_run(script, fixtures, tmp_path):
    how, args = SMOKE[script]
    # what serves by default (FP4Linear's dispatcher, misses) reads and writes a copy of the fixture,
    # never the user's cache
    import sqlite3
    src, serve = sqlite3.connect(fixtures["db"]), sqlite3.connect(tmp_path / "serve.db")
    src.backup(serve)
    src.close(), serve.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_CACHE": str(tmp_path / "serve.db")}
    env.pop("AUTOTUNE_MISSES", None)
    if how.startswith("env "):
        k, v = how[4:].split("=")
        env[k] = v
    argv = [a.format(out=tmp_path, **fixtures) for a in shlex.split(args)]
    r = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.strip() or len(list(tmp_path.iterdir())) > 1, "printed and wrote nothing"


def test_smoke_outputs_say_what_they_measured(fixtures, tmp_path):
    """The analysis scripts read the fixture's numbers, not a constant: counts from the cache."""
    import sqlite3
    con = sqlite3.connect(fixtures["db"])
    winners = con.execute("select count(*) from winners").fetchone()[0]
    ok = con.execute("select count(*) from trials where status = 'ok'").fetchone()[0]
    tl = subprocess.run([sys.executable, str(BENCH / "trial_timeline.py"), fixtures["db"]], capture_output=True,
                        text=True, cwd=tmp_path)
    assert f"torch ok: {ok}" in tl.stdout and "trials spent on rejected tactics: 0" in tl.stdout
    cw = _load("compare_winners").compare(fixtures["db"], fixtures["db2"])
    assert (cw["pairs"], cw["same"]) == (winners, winners - 1)
    rh = subprocess.run([sys.executable, str(BENCH / "rank_h200.py"), "compare", fixtures["db"], fixtures["db2"],
                         "--device", "cpu", "--json", str(tmp_path / "r.json")], capture_output=True, text=True,
                        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert rh.returncode == 0, rh.stderr[-2000:]
    res = json.loads((tmp_path / "r.json").read_text())
    assert (res["pairs"], res["differ"], len(res["rows"])) == (winners, 1, 1) and res["rows"][0]["a_us"] > 0


def _scripts():
    return sorted(p.name for p in BENCH.glob("*.py"))


def _sh():
    return sorted(BENCH.glob("*.sh"))


#: scripts whose first argument is a cache: a missing one is refused, not created
CACHE_ARG = ("trial_timeline.py", "slice_table.py", "moe_search_summary.py", "full_search_summary.py",
             "dispatch_check.py", "batch_invariant_cost.py", "rank_eval.py")
SUBCOMMANDS = {"w4a4_h200.py": ("run", "render"), "triton_h200.py": ("run", "render"), "cuda_h200.py": ("run", "render"),
               "rank_h200.py": ()}

_DRIVER = r"""
import contextlib, io, json, os, runpy, sys, tempfile
cases, out = json.loads(sys.argv[1]), {}
for path, args in cases:
    d = tempfile.mkdtemp()
    os.chdir(d)
    sys.argv = [path, *args]
    so, se = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
            runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:
        code = f"{type(e).__name__}: {e}"
    out[" ".join([os.path.basename(path), *args])] = {"code": code, "stdout": so.getvalue(), "stderr": se.getvalue(),
                                                       "created": os.listdir(d)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helps(tmp_path_factory):
    """Each script run in one process (each in an empty cwd) with --help (and each subcommand's),
    and the cache-taking ones with a missing cache: exit code, output, files created."""
    cases = [(str(BENCH / s), ["--help"]) for s in _scripts() if s != "common.py"]
    cases += [(str(BENCH / s), [sub, "--help"]) for s, subs in SUBCOMMANDS.items() for sub in subs]
    cases += [(str(BENCH / s), ["nope.db"]) for s in CACHE_ARG]
    never = tmp_path_factory.mktemp("help") / "never.db"
    r = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(cases)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_CACHE": str(never)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert not never.exists()                   # nothing opened the default cache
    return json.loads(r.stdout.splitlines()[-1])


def test_help_creates_nothing(helps):
    """`--help` of every script (and subcommand) exits 0, prints a usage and creates no file."""
    bad = {k: (v["code"], v["created"], v["stderr"][-300:]) for k, v in helps.items()
           if k.endswith("--help") and (v["code"] != 0 or v["created"] or "usage:" not in v["stdout"])}
    assert bad == {}


def test_a_missing_cache_is_refused_and_not_created(helps):
    for s in CACHE_ARG:
        v = helps[f"{s} nope.db"]
        assert v["code"] == 2 and "no such file: nope.db" in v["stderr"] and v["created"] == [], (s, v)


# -- the shell scripts ---------------------------------------------------------------------------

@pytest.mark.parametrize("sh", _sh(), ids=lambda p: p.name)
def test_shell_script_parses_and_its_python_exists(sh):
    assert subprocess.run(["bash", "-n", str(sh)], capture_output=True).returncode == 0
    for script in re.findall(r"python3 (bench/\w+\.py)", sh.read_text()):
        assert (ROOT / script).is_file(), f"{sh.name} calls {script}, which does not exist"


def _calls(text: str) -> list[tuple[str, list[str]]]:
    """(script, flags) of each `python3 bench/x.py ...` (continuations joined)."""
    text = text.replace("\\\n", " ")
    return [(m.group(1), re.findall(r"(?<!\S)(--[a-z][\w-]*)", m.group(2)))
            for m in re.finditer(r"python3 bench/(\w+\.py)([^\n|>;&]*)", text)]


def test_shell_scripts_pass_only_flags_the_scripts_have(helps):
    """Each flag a .sh passes to a bench script appears in that script's (or a subcommand's) --help."""
    text = {s: "".join(v["stdout"] for k, v in helps.items() if k.split()[0] == s and k.endswith("--help"))
            for s in _scripts()}
    bad = [f"{sh.name}: {script} {f}" for sh in _sh() for script, flags in _calls(sh.read_text())
           for f in flags if f not in text[script]]
    assert bad == []


# -- the GPU-only scripts' CPU parts -------------------------------------------------------------

def _triton_h200_result(th) -> dict:
    """The JSON `triton_h200.py run` writes, with one row per section and made-up times."""
    from autotune.core.arch import get_arch
    from autotune.core.problem import Problem
    t16, dflt = th.candidates(16)[0], th.FAM.default(Problem.dense(3072, 6144), get_arch("sm90"))
    timed = lambda t, us: {"tactic": t.params, "us": us}   # noqa: E731
    row = {"problem": "TP8 gate_up_proj", "n": 3072, "k": 6144, "m": 16, "tuned": timed(t16, 10.0),
           "tuned_fused": timed(t16, 10.0), "default": timed(dflt, 20.0), "cublas_us": 30.0, "bytes": 1e7,
           "flop": 2 * 16 * 3072 * 6144, "fails": [], "smem_mismatch": [], "n_cands": 3}
    sample = [t.params for t in th.search_sample()[:3]]
    return {"command": "python3 bench/triton_h200.py run", "date": "made by the test",
            "env": {"gpu": "none (smoke)", "sms": 132, "l2_MiB": 50, "arch": "sm90", "torch": "x", "triton": "y"},
            "ceilings": {"copy_GBps": 3000.0, "bf16_TFLOPs": 700.0},
            "precompile": {"compiled": 3, "wall_s": 1.0, "errors": []}, "table": [row],
            "search_sample": sample,
            "search_ours": {"wall_s": 1.0, "precompile_s": 0.5, "compiled": 3},
            "search_autotune": {"wall_s": 12.0, "problems": [{"failed_configs": 1}]},
            "search_exhaustive": [{"key": "k", "m": 16, "best_us": 10.0, "ours_us": 10.0, "autotune_us": 11.0}],
            "moe": [{"key": "moe", "m": 1, "tuned": timed(t16, 5.0), "default": {"us": 6.0}, "torch_us": 50.0,
                     "fails": []}]}


def test_triton_h200_parts(tmp_path):
    """Every candidate of the table (each bucket) and of the search sample is a valid triton
    tactic; the render module (which the run script imports, never the other way) renders."""
    from autotune.tactics.triton_fp4.family import TritonFamily
    th = _load("triton_h200")
    fam = TritonFamily()
    for m in th.BUCKETS:
        bad = [t for t in th.candidates(m) if fam.validate(t)]
        assert bad == [], (m, bad[:2], fam.validate(bad[0]) if bad else None)
    assert [t for t in th.search_sample() if fam.validate(t)] == []
    render_src = (BENCH / "triton_h200_render.py").read_text()
    assert "import triton_h200\n" not in render_src and "from triton_h200 " not in render_src
    (tmp_path / "r.json").write_text(json.dumps(_triton_h200_result(th)))
    r = subprocess.run([sys.executable, str(BENCH / "triton_h200.py"), "render", str(tmp_path / "r.json"),
                        str(tmp_path / "r.md")], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    md = (tmp_path / "r.md").read_text()
    assert "| 16 | 10.0 | 16×32×128 w4 s3 | 10.0 | 20.0 | 30.0 | 3.00× |" in md
    assert "geometric mean over 1 buckets: 2.00×" in md and "12.0 s → 12.0× less" in md and "| moe | 1 | 5.0 |" in md


def test_triton_explore_candidates_are_valid():
    from autotune.tactics.triton_fp4.family import TritonFamily
    te = _load("triton_explore")
    fam = TritonFamily()
    assert [t for t in [*te.DECODE, *te.PREFILL, te.DQ] if fam.validate(t)] == []


def test_cuda_h200_tactics_are_the_families():
    from autotune.tactics.triton_fp4.family import TritonFamily
    ch = _load("cuda_h200")
    fam = TritonFamily()
    ts = ch.triton_tactics()
    assert ts and [t for t in ts if fam.validate(t)] == []


def test_cuda_moe_regs_space_flags_a_new_spill_only(tmp_path):
    """--space: every build of the main job's grouped cuda tactics (hundreds; two compiled here), and
    the rule that fails it: a spill the revision had not (or any spill without one)."""
    import shutil
    regs = _load("cuda_moe_regs")
    configs = regs.space_configs()
    assert len(configs) > 100 and len({type(c).__name__ for c in configs.values()}) == 1
    r0 = {"registers": 72, "smem": 1, "spills": False}
    r1 = {"registers": 64, "smem": 1, "spills": True}
    assert regs.space_verdict({"a": r1, "b": r0}, {"a": r0, "b": r0})[0] == ["a"]     # new: fails
    assert regs.space_verdict({"a": r1, "b": r0}, {"a": r1, "b": r0})[0] == []        # the revision's own
    assert regs.space_verdict({"a": r1}, None)[0] == ["a"]
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, str(BENCH / "cuda_moe_regs.py"), "--space", "--limit", "2", "--rev", "HEAD",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert len(got["now"]) == 2 and all(v["registers"] > 0 for v in got["now"].values()) and got["new_spills"] == []
    if not subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD", "--", "tactics/cuda"]).returncode:
        assert got["rev_resources"] == got["now"]        # the committed text is this text: the same builds


def test_fold_routing_ab_draws_the_served_routing():
    """FP4MoE's folded routing: top_k - 1 distinct routed experts (< E - 1) per token, expert E - 1 in
    the last slot with weight 1; the activations and weights are the search draw's own."""
    from autotune.core import inputs
    from autotune.core.problem import Problem
    fr = _load("fold_routing_ab_h200")
    p = Problem.moe(64, 32, 9, 4)
    sets = inputs.make_inputs(p, 5, "cpu", 3, 2)
    served = fr.served_routing(sets, 5, p.experts, p.top_k, 1)
    for s, v in zip(sets, served):
        ids, tw = v.topk_ids, v.topk_weights
        assert v.x is s.x and v.w is s.w and ids.shape == (5, 4) and tw.shape == (5, 4)
        assert (ids[:, -1] == 8).all() and (tw[:, -1] == 1).all() and (ids[:, :-1] < 8).all()
        assert all(len(set(r)) == 3 for r in ids[:, :-1].tolist())
        assert abs(float(tw[:, :-1].sum(1).mean()) - 1.0) < 1e-6


# -- the static check ----------------------------------------------------------------------------

def test_mypy_finds_no_missing_names(tmp_path):
    """mypy over bench/, tools/ and the package with setup.cfg's [mypy] (attr-defined, name-defined
    and call-arg on): a call of a removed or renamed name fails here."""
    pytest.importorskip("mypy")
    cache = Path(os.environ.get("MYPY_CACHE_DIR", ROOT / ".mypy_cache"))
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
