"""bench/ under test: every script's CPU smoke run, `--help` that creates nothing, the harness's
device record and output, the size targets of bench/, each kept script cited by a decision or a
measurement entry, and mypy over bench/, tools/ and the package (a call of a name that no longer
exists fails here, not on the next GPU call). The device driver's DRY=1 run is
tests/test_bench_driver.py.

SMOKE names, for each bench script, what CI runs of it: a command on tiny fixture data (a CPU
search of a 4-problem model made once per run, or a committed cache opened read-only), or a test
elsewhere that runs it.
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
DOCS = ROOT / "docs"

# a tiny llama-shaped model: 4 dense problems, N, K <= 1024
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000,
        "hidden_act": "silu", "torch_dtype": "bfloat16"}

#: script -> (how CI runs it, arguments with {db} {db2} {model} {out} {moe_db} {main_db} filled in)
SMOKE: dict[str, tuple[str, str]] = {
    "harness.py": ("elsewhere", "tests/test_bench_smoke.py test_harness_writes_the_record_and_the_table runs it"),
    "compare_winners.py": ("run", "{db} {db2} --json {out}/c.json"),
    "eager_cpu.py": ("run", "--reps 2 --batch 8 --json {out}/e.json"),
    # the driver's DRY=1 HOST=1 stage runs it with these very arguments (and reads its JSON)
    "moe_host.py": ("elsewhere", "tests/test_bench_driver.py runs it: --experts 8 --reps 2 --batch 4 --profile 3"),
    "dispatch_latency.py": ("run", "--reps 2 --batch 4 --calls 16 --json {out}/d.json"),
    "triton_smem_table.py": ("run", "--jobs 1 --limit 1 --archs sm90"),
    "mlp_step_graph.py": ("env MLP_GRAPH_SMOKE=1", "--out {out} --cache {moe_db} --mlp linear,fold --prefetch 0,1"),
    "bucket_cut_eval.py": ("elsewhere", "tests/test_bucket_cut_eval.py runs its core on the committed full search"),
    "cuda_moe_regs.py": ("run", "--json {out}/regs.json"),     # nvcc (CI has it), this tree's text only
    "floor_table.py": ("run", "{main_db} --json {out}/ft.json"),    # a committed main-job cache
    "main_job_summary.py": ("run", "{db} --model {model} --tp 1 --max-tokens 4 --device cpu -o {out}/s.json"),
    "rank_eval.py": ("elsewhere", "tests/test_ranked.py runs main() on the committed full search"),
    "stop_rule_eval.py": ("run", "{main_db} --draws 3 --precision 0.0025 --json {out}/sr.json"),
    "verdict_audit.py": ("help", "--help only: each arch cross-compiles hundreds of rejected tactics (minutes)"),
    "device_run.sh": ("elsewhere", "tests/test_bench_driver.py runs it with DRY=1"),
}
#: the shared module, not a measurement: no decision or entry needs to cite it
SHARED = ("harness.py",)


def _scripts() -> list[str]:
    return sorted(p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh"))


def test_every_bench_script_has_a_smoke_entry():
    assert set(_scripts()) == set(SMOKE), (set(_scripts()) - set(SMOKE), set(SMOKE) - set(_scripts()))
    for script, (how, note) in SMOKE.items():
        if how == "elsewhere":      # the test named exists and names the script
            test = ROOT / note.split()[0]
            assert test.is_file() and script.removesuffix(".py").removesuffix(".sh") in test.read_text(), (script, test)


def test_bench_meets_its_size_targets():
    """bench/ is one harness and the scripts behind quoted figures: at most 15 scripts, 3,000 lines,
    400 lines a module, and every script takes the harness's parser or is the driver."""
    lines = {s: len((BENCH / s).read_text().splitlines()) for s in _scripts()}
    assert len(lines) <= 15 and sum(lines.values()) <= 3000, lines
    assert {s: n for s, n in lines.items() if n > 400} == {}
    for s in _scripts():
        if s.endswith(".py") and s != "harness.py":
            assert "harness" in (BENCH / s).read_text(), f"{s} does not use bench/harness.py"


def _cited(text: str, script: str) -> bool:
    return re.search(rf"bench/{re.escape(script)}\b", text) is not None


def test_each_kept_script_is_cited_by_a_decision_or_a_measurement():
    """A script stays in bench/ while a decision (docs/decisions/) or a measurement entry
    (docs/measurements/) cites it; one whose A/B is decided goes, its decision naming the commit."""
    if not (DOCS / "decisions").is_dir():
        pytest.skip("docs/decisions/ does not exist in this tree (the decision records are not written yet)")
    texts = "\n".join(p.read_text() for d in ("decisions", "measurements") if (DOCS / d).is_dir()
                      for p in sorted((DOCS / d).glob("*.md")))
    uncited = [s for s in _scripts() if s not in SHARED and not _cited(texts, s)]
    assert uncited == [], f"bench scripts no decision or measurement entry cites: {uncited}"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_smoke_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """A cache from a real CPU search (torch family, buckets 1 and 4) of the tiny model, and a copy
    whose winner at one (problem, bucket) is another measured tactic."""
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
            "moe_db": str(ROOT / "tests" / "data" / "2026-12-01-h200-moe-search.db"),
            "main_db": str(DOCS / "data" / "2026-12-05-h200-7a8be9d-main-job.db.xz")}


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


def test_harness_writes_the_record_and_the_table(tmp_path):
    """The harness's smoke run: its JSON names the command and where it ran (card, versions, commit,
    date), holds one row per size timed through engine.timing, and its table has those rows."""
    r = subprocess.run([sys.executable, str(BENCH / "harness.py"), "--smoke", "--json", str(tmp_path / "h.json"),
                        "--table", str(tmp_path / "h.md")], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads((tmp_path / "h.json").read_text())
    dev = doc["machine"]
    assert dev["card"] == "cpu" and dev["versions"]["torch"] and re.match(r"\d{4}-\d\d-\d\d ", dev["date"])
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert dev["commit"].split("+")[0] == head.stdout.strip()
    assert [row["n"] for row in doc["rows"]] == [16, 64]
    assert all(row["median_us"] > 0 and row["reps"] == 5 for row in doc["rows"])
    assert "harness.py --smoke" in doc["command"]
    md = (tmp_path / "h.md").read_text().splitlines()
    assert md[0] == "| n | median_us | iqr_us | reps |" and len(md) == 4
    assert not list(tmp_path.glob("*.tmp"))                 # written whole


def test_harness_refuses_a_run_without_smoke(tmp_path):
    r = subprocess.run([sys.executable, str(BENCH / "harness.py")], cwd=tmp_path, capture_output=True, text=True,
                       env={**{k: v for k, v in os.environ.items() if k != "BENCH_SMOKE"}, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "--smoke" in r.stderr and list(tmp_path.iterdir()) == []


def test_compare_winners_reads_the_fixtures_numbers(fixtures):
    """compare_winners counts from the caches, not a constant: one winner differs between them."""
    import sqlite3
    con = sqlite3.connect(fixtures["db"])
    winners = con.execute("select count(*) from winners").fetchone()[0]
    con.close()
    cw = _load("compare_winners").compare(fixtures["db"], fixtures["db2"])
    assert (cw["pairs"], cw["same"]) == (winners, winners - 1)


#: scripts whose first argument is a cache: a missing one is refused, not created
CACHE_ARG = ("floor_table.py", "rank_eval.py")

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
    """Each script run in one process (each in an empty cwd) with --help, and the cache-taking
    ones with a missing cache: exit code, output, files created."""
    cases = [(str(BENCH / s), ["--help"]) for s in _scripts() if s.endswith(".py")]
    cases += [(str(BENCH / s), ["nope.db"]) for s in CACHE_ARG]
    never = tmp_path_factory.mktemp("help") / "never.db"
    r = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(cases)], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_CACHE": str(never)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert not never.exists()                   # nothing opened the default cache
    return json.loads(r.stdout.splitlines()[-1])


def test_help_creates_nothing(helps):
    """`--help` of every script exits 0, prints a usage and creates no file."""
    bad = {k: (v["code"], v["created"], v["stderr"][-300:]) for k, v in helps.items()
           if k.endswith("--help") and (v["code"] != 0 or v["created"] or "usage:" not in v["stdout"])}
    assert bad == {}


def test_a_missing_cache_is_refused_and_not_created(helps):
    for s in CACHE_ARG:
        v = helps[f"{s} nope.db"]
        assert v["code"] == 2 and "no such file: nope.db" in v["stderr"] and v["created"] == [], (s, v)


def _calls(text: str) -> list[tuple[str, list[str]]]:
    """(script, flags) of each `python3 bench/x.py ...` (continuations joined)."""
    text = text.replace("\\\n", " ")
    return [(m.group(1), re.findall(r"(?<!\S)(--[a-z][\w-]*)", m.group(2)))
            for m in re.finditer(r"python3 bench/(\w+\.py)([^\n|>;&]*)", text)]


def test_the_driver_passes_only_flags_the_scripts_have(helps):
    """Each bench script the driver calls exists, and each flag it passes is in that script's --help."""
    sh = (BENCH / "device_run.sh").read_text()
    assert subprocess.run(["bash", "-n", str(BENCH / "device_run.sh")], capture_output=True).returncode == 0
    calls = _calls(sh)
    assert {s for s, _ in calls} >= {"main_job_summary.py", "compare_winners.py", "mlp_step_graph.py", "moe_host.py"}
    text = {k.split()[0]: v["stdout"] for k, v in helps.items() if k.endswith("--help")}
    bad = [f"{script} {f}" for script, flags in calls for f in flags if f not in text.get(script, "")]
    assert bad == []


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


# -- the static check ----------------------------------------------------------------------------

def test_mypy_finds_no_missing_names(tmp_path):
    """mypy over bench/, tools/ and the package with setup.cfg's [mypy] (attr-defined, name-defined
    and call-arg on): a call of a removed or renamed name fails here."""
    pytest.importorskip("mypy")
    cache = Path(os.environ.get("MYPY_CACHE_DIR", ROOT / ".mypy_cache"))
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
