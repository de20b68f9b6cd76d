"""Every timeout and deadline in tests/ is reviewed: a hang guard (it only turns a hang into a
failure, far past anything the code does when it works), an event deadline (--timeout-s of a test
that uses `event_deadlines`: only a tactic whose process said it hangs expires), SQLite's busy wait
of a read beside a writer (a failed read reads as "not yet"), or a value under test (no wait). A
new `timeout=`/deadline fails here until it is added to REVIEWED with its kind: no test verdict
may depend on wall-clock speed."""
from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent
PATTERN = re.compile(r"\btimeout(_s)?\s*=|\bdeadline\s*=|\balarm\(|\bGUARD_S\s*=|\bguard_s\b\s*[:=]")
GUARD, EVENT, BUSY, VALUE = "hang guard", "event deadline", "sqlite busy wait", "value under test"

#: (file under tests/, kind, the line as written, stripped)
REVIEWED = [
    ('claims_race.py', GUARD, 'results = [out.get(timeout=120) for _ in ps]'),
    ('helpers.py', GUARD, 'return subprocess.run(argv, cwd=ROOT, env=e, capture_output=True, text=True, timeout=timeout)'),
    ('helpers.py', GUARD, 'def wait_for(cond, what: str, proc: subprocess.Popen | None = None, guard_s: float = 600) -> None:'),
    ('helpers.py', GUARD, 'deadline = time.monotonic() + guard_s'),
    ('helpers.py', GUARD, 'raise AssertionError(f"hang guard: no {what} in {guard_s:g} s")'),
    ('test_adversarial.py', VALUE, '@pytest.mark.parametrize("query", ["?mode=rwc&uri=true", "?mode=rwc", "?timeout=5"])'),
    ('test_batch_invariant.py', GUARD, 'text=True, timeout=900)'),
    ('test_bench_driver.py', GUARD, 'r = subprocess.run(["bash", str(DRIVER)], cwd=ROOT, env=e, capture_output=True, text=True, timeout=6000)'),
    ('test_bench_driver.py', GUARD, 'text=True, check=True, timeout=300).stdout.split()'),
    ('test_bench_smoke.py', GUARD, 'text=True, timeout=600)'),
    ('test_bench_smoke.py', GUARD, 'env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)'),
    ('test_bench_smoke.py', GUARD, 'timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "AUTOTUNE_CACHE": str(never)})'),
    ('test_bench_smoke.py', GUARD, '"--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)'),
    ('test_bench_smoke.py', GUARD, 'capture_output=True, text=True, timeout=900)'),
    ('test_cache_bad.py', GUARD, 'return run_cli(*args, cache=cache, timeout=300)'),
    ('test_cache_hostile.py', GUARD, 'r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)'),
    ('test_claims.py', GUARD, 'so, se = p.communicate(timeout=600)'),
    ('test_claims.py', BUSY, 'con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)'),
    ('test_claims.py', GUARD, 'return run_cli(*cli(cfg, cache)[3:], env=env, timeout=600)'),
    ('test_cli.py', GUARD, '"--max-tokens", "1", *args, cache=tmp_path / "c.db", timeout=300)'),
    ('test_cli.py', GUARD, '_one_line_error(autotune("search", "--model", "/dev/zero", "--dry-run", timeout=120), "/dev/zero")'),
    ('test_code_keys.py', GUARD, 'run = subprocess.run([py, "-c", prog, str(ROOT)], capture_output=True, text=True, timeout=120)'),
    ('test_cuda_pdl.py', GUARD, 'input=B.text(c), capture_output=True, text=True, timeout=300)'),
    ('test_cutlass.py', GUARD, 'cwd=ROOT, capture_output=True, text=True, timeout=300)'),
    ('test_dispatch.py', GUARD, 'text=True, timeout=600)'),
    ('test_dispatch_parts.py', GUARD, 'r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)'),
    ('test_exporters.py', GUARD, 'capture_output=True, text=True, timeout=300)'),
    ('test_flashinfer_export.py', GUARD, 'env=env, timeout=120)'),
    ('test_flashinfer_export.py', GUARD, 'capture_output=True, text=True, env=env, timeout=180)'),
    ('test_golden.py', GUARD, 'p = subprocess.run([sys.executable, "cli.py", *args], cwd=root, env=_env(root), capture_output=True, timeout=300)'),
    ('test_hostile_readers.py', GUARD, 'GUARD_S = 120      # a hang guard for the subprocesses, not a speed assertion'),
    ('test_hostile_readers.py', GUARD, 'r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S)'),
    ('test_hostile_readers.py', GUARD, 'one_line_error(run_cli("cache", "import", bad, "--cache", tmp_path / "target.db", timeout=GUARD_S),'),
    ('test_hostile_readers.py', GUARD, 'one_line_error(run_cli("show", "--cache", bad, timeout=GUARD_S), "a view \'winners\'")'),
    ('test_hostile_readers.py', GUARD, 'one_line_error(run_cli("cache", "merge", bad, "-o", tmp_path / "m.db", timeout=GUARD_S), "a view \'winners\'")'),
    ('test_hostile_readers.py', GUARD, 'one_line_error(run_cli("cache", "import", deep, "--cache", tmp_path / "t.db", timeout=GUARD_S), "nested deeper")'),
    ('test_hostile_readers.py', GUARD, 'one_line_error(run_cli("cache", "merge", deep, "-o", tmp_path / "m.db", timeout=GUARD_S), "nested deeper")'),
    ('test_hostile_readers.py', GUARD, 'one_line_error(run_cli("search", "--model", cfg, "--cache", tmp_path / "s.db", "--dry-run", timeout=GUARD_S),'),
    ('test_launcher.py', GUARD, 'cwd=ROOT, capture_output=True, text=True, timeout=300)'),
    ('test_launcher.py', GUARD, 'r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)'),
    ('test_main_job.py', GUARD, 'r = autotune("search", "--model", "glm5", "--tp", "8", "--max-tokens", "16", cache=path, timeout=2400)'),
    ('test_moe_align.py', GUARD, 'capture_output=True, text=True, timeout=300)'),
    ('test_moe_block.py', GUARD, 'r = subprocess.run([sys.executable, "-c", _INTERP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)'),
    ('test_moe_decode.py', GUARD, 'capture_output=True, text=True, timeout=300)'),
    ('test_moe_shared.py', GUARD, 'r = subprocess.run([sys.executable, "-c", _INTERP], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)'),
    ('test_nosync.py', GUARD, 'timeout=900)'),
    ('test_operands.py', GUARD, 'capture_output=True, text=True, timeout=600)'),
    ('test_options.py', VALUE, '(lambda: Runner(timeout_s=float("inf")), "timeout_s must be a positive number of seconds", "--timeout-s must"),'),
    ('test_options.py', VALUE, 'o = options.build({"margin": 0.05, "strategy": None, "runner": Runner(timeout_s=60)},'),
    ('test_options.py', VALUE, "assert o.runner == Runner(gpus=(0, 1), workers=2, timeout_s=60, isolate=False)   # over the caller's Runner"),
    ('test_options.py', VALUE, 'api.run("glm5", tp=8, only="mlp.down_proj", families="torch", max_tokens=1, timeout_s=0,'),
    ('test_pipeline.py', GUARD, 'GUARD_S = 120.0           # a hang guard: far past anything the family does when it works'),
    ('test_pipeline.py', GUARD, 'def _search(store, fam, problems, buckets=(4,), *, timeout_s=GUARD_S, compile_workers=1, overlap=True,'),
    ('test_pipeline.py', GUARD, 'runner=Runner(timeout_s=timeout_s, compile_workers=compile_workers, overlap_compile=overlap), **kw)'),
    ('test_pipeline.py', EVENT, '_search(store, corder, [P1, P2], timeout_s=3, overlap=False)'),
    ('test_pipeline.py', EVENT, 'rep = _search(store, corder, [P1], buckets=(1, 4), timeout_s=8, compile_workers=2, strategy="ranked",'),
    ('test_pipeline.py', GUARD, 'pool = precompile.Pool("cpu", 1, fams, timeout_s=GUARD_S, preload=["corder"])'),
    ('test_pipeline.py', GUARD, 'pool = precompile.Pool("cpu", 1, fams, timeout_s=GUARD_S)'),
    ('test_postgres.py', GUARD, 'subprocess.run(pre + list(cmd), check=True, capture_output=True, timeout=120)'),
    ('test_rename.py', GUARD, 'timeout=120)'),
    ('test_replay.py', GUARD, 'runner=Runner(isolate=isolate, timeout_s=60), halving=Halving(host_window=0))'),
    ('test_replay.py', GUARD, 'capture_output=True, text=True, timeout=900)'),
    ('test_report.py', GUARD, 'return subprocess.run(cmd, capture_output=True, text=True, timeout=60)'),
    ('test_stage_timeouts.py', GUARD, 'GUARD_S = 240'),
    ('test_stage_timeouts.py', GUARD, 'signal.alarm(GUARD_S)'),
    ('test_stage_timeouts.py', GUARD, 'signal.alarm(0)'),
    ('test_stage_timeouts.py', EVENT, 'halving=Halving(budget_s=0.2), runner=Runner(timeout_s=3, compile_workers=compile_workers))'),
    ('test_stage_timeouts.py', EVENT, 'halving=Halving(budget_s=0.2), runner=Runner(timeout_s=3))'),
    ('test_stage_timeouts.py', GUARD, 'deadline = time.monotonic() + GUARD_S           # hang guard only'),
    ('test_stage_timeouts.py', GUARD, 'out, err = p.communicate(timeout=GUARD_S)'),
    ('test_stage_timeouts.py', BUSY, 'c = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)'),
    ('test_triton_family.py', GUARD, 'r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)'),
    ('test_triton_family.py', GUARD, 'capture_output=True, text=True, timeout=600)'),
    ('test_triton_family.py', GUARD, 'capture_output=True, text=True, timeout=600)'),
    ('test_triton_w4a4.py', GUARD, 'capture_output=True, text=True, timeout=300)'),
    ('test_trust_cases.py', GUARD, '"--flashinfer-version", "0.7.4", "--sign-key", key, "--cache", _fi_cache(tmp_path), timeout=300)'),
    ('test_wheel.py', GUARD, '"-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=600)'),
    ('test_wheel.py', GUARD, '"--target", str(target), str(wheel)], check=True, capture_output=True, timeout=600)'),
    ('test_wheel.py', GUARD, 'text=True, timeout=300)'),
    ('test_wheel.py', GUARD, 'capture_output=True, text=True, timeout=300)'),
    ('test_worker_memory.py', GUARD, 'ex = ProcessExecutor("cpu", timeout_s=120, families={"scratchy": "tests.families.scratchy:ScratchyFamily"})'),
    ('test_workers.py', EVENT, 'halving=Halving(budget_s=0.5), runner=Runner(timeout_s=4, compile_workers=2))'),
    ('test_workers.py', EVENT, 'halving=Halving(budget_s=0.5), runner=Runner(timeout_s=4))'),
    ('test_workers.py', GUARD, 'halving=Halving(exhaustive=True), runner=Runner(timeout_s=30))'),
    ('test_workers.py', GUARD, 'halving=Halving(budget_s=0.5, host_window=0.0), runner=Runner(timeout_s=30))'),
    ('test_workers.py', GUARD, 'out = run_cli(*_search_args(cfg, db), timeout=600)'),
    ('test_workers.py', BUSY, 'con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)'),
    ('test_workers.py', GUARD, 'env=CPU, runner=Runner(timeout_s=30))'),
    ('test_workers_gpu.py', GUARD, 'halving=Halving(budget_s=0.3), runner=Runner(timeout_s=120), strategy="halving")'),
    ('test_workers_gpu.py', GUARD, 'ex = ProcessExecutor("cuda", timeout_s=240)'),
]


def _found() -> list[tuple[str, str, int]]:
    out = []
    for p in sorted(TESTS.rglob("*.py")):
        if p.name == Path(__file__).name:
            continue
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if PATTERN.search(line):
                out.append((str(p.relative_to(TESTS)), line.strip(), n))
    return out


def test_every_timeout_in_tests_is_reviewed():
    found = Counter((f, s) for f, s, _ in _found())
    listed = Counter((f, s) for f, _, s in REVIEWED)
    assert not found - listed, f"timeouts not reviewed (add each with its kind): {sorted(found - listed)}"
    assert not listed - found, f"reviewed timeouts no longer in tests/ (drop them): {sorted(listed - found)}"


def test_an_event_deadline_is_in_a_test_that_uses_event_deadlines():
    """--timeout-s decides a verdict only where deadlines are events: the enclosing test asks for
    the `event_deadlines` fixture."""
    events = Counter((f, s) for f, k, s in REVIEWED if k == EVENT)
    assert events
    for f, s, n in _found():
        if (f, s) not in events:
            continue
        tree = ast.parse((TESTS / f).read_text())
        fn = [d for d in ast.walk(tree) if isinstance(d, ast.FunctionDef) and d.lineno <= n <= d.end_lineno]
        assert fn and "event_deadlines" in [a.arg for a in fn[0].args.args], (f, n)


def test_guards_are_far_past_the_work():
    """A literal hang guard is at least 30 s (the work it guards takes well under that)."""
    for f, k, s in REVIEWED:
        if k == GUARD:
            for v in re.findall(r"(?:timeout(?:_s)?=|GUARD_S = |guard_s: float = )([0-9.]+)", s):
                assert float(v) >= 30, (f, s)
