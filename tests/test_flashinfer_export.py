"""`autotune cache export --format flashinfer`, judged by the real FlashInfer releases.

Each supported flashinfer-python release is installed into its own folder by
tools/install_flashinfer_targets.sh ($FP4_FLASHINFER_TARGETS, default .flashinfer/); the tests that
need one skip, naming the script, when it is absent. FlashInfer runs in a subprocess per release
(tests/flashinfer_probe.py): its loader reads our file, its AutoTuner.choose_one looks shapes up
outside tuning, its blocklist filters the runner's tactics. Winners are written through the public
Store API under an SM120 device key, as a tuning run on an RTX 5090 would write them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.core.buckets import Buckets
from autotune.core.env import Env
from autotune.core.problem import Problem
from autotune.core.records import Trial, Winner
from autotune.core.tactic import Tactic
from autotune.integrations.flashinfer import ExportError, export_flashinfer, keys as K, render
from autotune.cache import Store
from autotune.tactics.cutlass import flashinfer_map as fim
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
TARGETS = Path(os.environ.get("FP4_FLASHINFER_TARGETS", REPO / ".flashinfer"))
VERSIONS = ("0.7.2.post1", "0.7.4")
GPU = "NVIDIA GeForce RTX 5090"
DEPS = ("flashinfer-python", "torch")
SM120 = Env(GPU, "12.0", 170, "cuda", libs=(("flashinfer-python", "0.7.4"), ("torch", "2.13.0")))
H200 = Env("NVIDIA H200", "9.0", 132, "cuda", libs=(("flashinfer-python", "0.7.4"), ("torch", "2.13.0")))
DENSE = Problem.dense(256, 512)
#: our bucket -> FlashInfer SM120 tactic integer of its winner (vLLM-style buckets: 24 splits
#: FlashInfer's bucket 32, so M 17..24 differ)
PICKS = {1: 0, 8: 4, 16: 5, 24: 8, 32: 9, 64: 12, 128: 13, 256: 16, 512: 20}
FAILED, REJECTED, DROPPED = 30, 29, 31


def _tactic(idx: int) -> Tactic:
    return Tactic("cutlass", fim.configs("sm120")[idx].params())


def _trial(env: Env, idx: int, status: str, reason: str) -> Trial:
    t = _tactic(idx)
    return Trial(DENSE.key, 16, t.id, "cutlass", t.to_json(), env.device_key, env.lib_key(DEPS), status, reason)


def _winner(env: Env, problem: Problem, bucket: int, t: Tactic) -> Winner:
    d = _tactic(0)
    return Winner(problem.key, bucket, env.device_key, t.id, t.family, t.to_json(), env.lib_key(DEPS), 10.0,
                  d.id, 11.0, 1.1)


@pytest.fixture(scope="module")
def cache_db(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("fi") / "cache.db")
    with Store(path) as s:
        for env in (SM120, H200):
            s.put_environment(env, DEPS)
        for b, idx in PICKS.items():
            s.put_winner(_winner(SM120, DENSE, b, _tactic(idx)))
        moe = Problem.moe(256, 512, 8, 2)
        s.put_winner(_winner(SM120, moe, 16, Tactic("cutlass", fim.configs("sm120")[0].params()
                                                     | {"op": "grouped_moe", "epilogue_c": "bf16"})))
        s.put_trial(_trial(SM120, FAILED, "failed", "illegal instruction (worker died)"))
        s.put_trial(_trial(SM120, REJECTED, "rejected", "SharedStorageSize over the opt-in limit"))
        s.put_trial(_trial(SM120, DROPPED, "dropped", "cut by halving"))
        tri = Tactic("triton_fp4", {"kernel": "w4a16", "block_m": 16, "block_n": 64, "block_k": 128, "group_m": 8,
                                    "num_warps": 4, "num_stages": 2, "split_k": 1})
        s.put_winner(_winner(H200, DENSE, 16, tri))
    return path


def _meta(version: str, **over: str) -> dict[str, str]:
    m = {f: "unknown" for f in K.META_FIELDS}
    m.update({"flashinfer_version": version, "gpu": GPU, **over})
    return m


def _export(cache_db: str, out: Path, version: str, meta: dict | None = None, **kw):
    with Store(cache_db, readonly=True) as s:
        return export_flashinfer(s, out, gpu=GPU, version=version, metadata=meta or _meta(version), **kw)


# ------------------------------------------------------------------------ without FlashInfer

def test_export_picks_buckets_and_reports_differences(cache_db, tmp_path):
    rep = _export(cache_db, tmp_path / "fi.json", "0.7.4")
    doc = json.loads((tmp_path / "fi.json").read_text())
    assert rep.problems == [DENSE.key] and rep.entries == 10          # FlashInfer buckets 1..512
    assert any("grouped MoE" in s for s in rep.skipped)
    ours = Buckets(tuple(PICKS))
    for fb in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
        for alpha in K.ALPHA_SHAPES:
            entry = doc[K.file_key(K.nearest_profile(fb, 256, 512, alpha))]
            assert entry == [K.RUNNER, PICKS[ours.bucket(fb)], K.POLICY]
    diffs = [(d.m_lo, d.m_hi, d.fi_bucket, d.ours, d.flashinfer) for d in rep.differences]
    assert diffs == [(17, 24, 32, PICKS[24], PICKS[32])]
    assert doc[K.GENERATION_KEY] == K.generation({k: v for k, v in doc.items() if k != K.GENERATION_KEY})
    bl = json.loads((tmp_path / "fi.blocklist.json").read_text())
    assert bl["invalid_tactics"] == {K.BLOCKLIST_KEY: [REJECTED, FAILED]}
    assert rep.measured_with == {"0.7.4": len(PICKS)}


def test_m_buckets_follow_flashinfer_hybrid_rule():
    assert [K.m_bucket(m) for m in (1, 3, 200, 257, 2049, 4097, 9000)] == [1, 4, 256, 512, 2560, 8192, 16384]


@pytest.mark.parametrize("version,meta,needle", [
    ("0.7.3", None, "known for 0.7.2.post1, 0.7.4 only"),
    ("0.7.4", _meta("0.7.4", gpu="*"), "gpu cannot be the wildcard"),
    ("0.7.4", _meta("0.7.4", flashinfer_version="0.7.2.post1"), "metadata says flashinfer 0.7.2.post1"),
    ("0.7.4", _meta("0.7.4", gpu="NVIDIA H200"), "measured on 'NVIDIA GeForce RTX 5090'"),
])
def test_refuses_bad_requests(cache_db, tmp_path, version, meta, needle):
    with pytest.raises(ExportError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        _export(cache_db, tmp_path / "x.json", version, meta or _meta("0.7.4"))
    assert not (tmp_path / "x.json").exists()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli("cache", "export", "--format", "flashinfer", *args)


@pytest.mark.parametrize("extra,needle", [
    (["--gpu", "H200", "--flashinfer-version", "0.7.4"], "no cutlass winners for NVIDIA H200"),
    (["--gpu", "5090", "--flashinfer-version", "0.6.0"], "0.6.0 is not supported"),
    (["--gpu", "5090", "--flashinfer-version", "0.7.4", "--model", "no-such-model"], "unknown model"),
])
def test_cli_refuses_with_one_line(cache_db, tmp_path, extra, needle):
    r = _cli("-o", str(tmp_path / "o.json"), "--cache", cache_db, *extra)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_flashinfer_flags_need_the_format(cache_db, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(REPO / "cli.py"), "cache", "export", "-o", str(tmp_path / "o.db"),
                        "--cache", cache_db, "--flashinfer-version", "0.7.4"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 2 and "need --format flashinfer" in r.stderr and not (tmp_path / "o.db").exists()


def test_cli_writes_with_wildcards(cache_db, tmp_path):
    meta = [a for f in K.META_FIELDS if f not in K.NO_WILDCARD for a in ("--meta", f"{f}=*")]
    r = _cli("-o", str(tmp_path / "o.json"), "--cache", cache_db, "--gpu", "5090", "--flashinfer-version",
             "0.7.2.post1", *meta)
    assert r.returncode == 0, r.stderr
    assert "differs: dense:bf16*nvfp4->bf16:n256:k512 M 17-24" in r.stdout
    assert json.loads((tmp_path / "o.json").read_text())[K.META_KEY]["cuda_version"] == "*"


# --------------------------------------------------------------------- the real FlashInfer

def _target(version: str) -> Path:
    root = TARGETS / version
    if not (root / "flashinfer" / "autotuner").is_dir() or not (TARGETS / "deps" / "tvm_ffi").is_dir():
        pytest.skip(f"flashinfer-python {version} not installed under {TARGETS} "
                    f"(run tools/install_flashinfer_targets.sh)")
    return root


def _probe(version: str, req: dict, blocklist: Path | None = None, plugin_file: Path | None = None) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_target(version)), str(TARGETS / "deps"), str(REPO)])}
    env.pop("FLASHINFER_TACTICS_BLOCKLIST", None)
    env.pop("FP4_AUTOTUNE_FLASHINFER_CACHE", None)
    if blocklist:
        env["FLASHINFER_TACTICS_BLOCKLIST"] = str(blocklist)
    if plugin_file:
        env["FP4_AUTOTUNE_FLASHINFER_CACHE"] = str(plugin_file)
    req = {"gpu": GPU, "tactic_num": len(fim.configs("sm120", version)), "load": [], "queries": [], **req}
    r = subprocess.run([sys.executable, str(REPO / "tests" / "flashinfer_probe.py"), json.dumps(req)],
                       capture_output=True, text=True, env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


#: (M, N, K, alpha rank) in every FlashInfer bucket we tuned, twice where our buckets split one,
#: then shapes we did not tune: another N, and an M above our largest FlashInfer bucket
QUERIES = [[m, 256, 512, a] for m in (1, 2, 3, 8, 12, 20, 30, 60, 100, 200, 300, 512) for a in (0, 1)] + \
          [[16, 384, 512, 0], [600, 256, 512, 0]]


TUNED = [q for q in QUERIES if q[1] == 256 and q[0] <= 512]


def _expected(m: int, n: int) -> int:
    if n != 256 or m > 512:
        return -1       # FlashInfer's own fallback
    return PICKS[Buckets(tuple(PICKS)).bucket(K.m_bucket(m))]


@pytest.fixture(scope="module")
def judged(cache_db, tmp_path_factory) -> dict[str, dict]:
    """Per release: the environment's metadata, then FlashInfer loading the other release's file
    (refused) and its own (accepted), its lookups and its blocklist filter."""
    d = tmp_path_factory.mktemp("judged")
    envs = {v: _probe(v, {}) for v in VERSIONS}
    for v in VERSIONS:
        _export(cache_db, d / f"{v}.json", v, {f: envs[v]["metadata"][f] for f in K.META_FIELDS})
        (d / f"{v}.tune.json").write_bytes((d / f"{v}.json").read_bytes())   # warm-up saves into it
    out = {}
    for v in VERSIONS:
        other = next(o for o in VERSIONS if o != v)
        from_env = {"cache": cache_db, "out": str(d / f"{v}.env.json"), "gpu": "5090", "other_gpu": "NVIDIA H200"}
        out[v] = {"env": envs[v], **_probe(v, {"load": [str(d / f"{other}.json"), str(d / f"{v}.json"),
                                                         from_env["out"]], "export_from_env": from_env,
                                                "queries": QUERIES, "tune_cache": str(d / f"{v}.tune.json"),
                                                "tune_queries": TUNED}, blocklist=d / f"{v}.blocklist.json")}
    # the vLLM hook, without vLLM: the entry point loads the file named in its variable
    out["hook"] = _probe(VERSIONS[0], {"plugin": True, "queries": QUERIES}, plugin_file=d / f"{VERSIONS[0]}.json")
    return out


@pytest.mark.parametrize("version", VERSIONS)
def test_table_matches_the_release_header(version):
    header = _target(version) / "flashinfer/data/include/flashinfer/gemm/fp4_gemm_cutlass_template_sm120.h"
    assert fim.sm120_configs_from_header(header.read_text()) == fim.sm120_names(version)


@pytest.mark.parametrize("version", VERSIONS)
def test_flashinfer_loads_our_files_and_refuses_the_other_release(judged, version):
    j = judged[version]
    assert j["version"] == version and j["runner"] == K.RUNNER
    assert j["loaded"] == [False, True, True]      # other release's file, ours, ours --metadata-from-env


@pytest.mark.parametrize("version", VERSIONS)
def test_metadata_from_env_refuses_an_image_on_another_gpu(judged, version):
    assert judged[version]["other_gpu_refusal"] == (
        f"metadata GPU is 'NVIDIA H200' but the winners were measured on '{GPU}' (this environment)")


@pytest.mark.parametrize("version", VERSIONS)
def test_choose_one_serves_our_tactics_and_its_fallback(judged, version):
    assert judged[version]["chosen"] == [_expected(m, n) for m, n, _, _ in QUERIES]


@pytest.mark.parametrize("version", VERSIONS)
def test_tuning_warmup_takes_our_entries_as_tuned(judged, version):
    assert judged[version]["tuned"] == [_expected(m, n) for m, n, _, _ in TUNED]


@pytest.mark.parametrize("version", VERSIONS)
def test_blocklist_removes_rejected_and_failed_tactics(judged, version):
    j = judged[version]
    assert j["blocklist_loaded"] is True
    assert j["profiled"] == [i for i in range(len(fim.configs("sm120", version))) if i not in (FAILED, REJECTED)]


@pytest.mark.parametrize("version", VERSIONS)
def test_metadata_from_env_is_flashinfers_own(judged, version):
    env = judged[version]["env"]
    assert env["ours_from_env"] == {f: str(env["metadata"][f]) for f in K.META_FIELDS}
    assert env["metadata"]["gpu"] == GPU


def test_vllm_hook_loads_the_file_into_flashinfer(judged):
    hook = judged["hook"]
    assert hook["plugin"] is True
    assert hook["chosen"] == [_expected(m, n) for m, n, _, _ in QUERIES]


def test_vllm_hook_is_registered_as_a_general_plugin(monkeypatch):
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    eps = cfg["options.entry_points"]["vllm.general_plugins"]
    assert "autotune.integrations.vllm_plugin:register" in eps
    from autotune.integrations import vllm_plugin
    monkeypatch.delenv(vllm_plugin.ENV, raising=False)
    assert vllm_plugin.register() is None         # a no-op unless the variable names a file


# ------------------------------------------------- a blocklisted tactic is never written

P2 = Problem.dense(512, 1024)
#: tactic 11 failed on P2 and 7 was rejected on P2: both go to the blocklist, so neither may be
#: written for DENSE either (FlashInfer applies its blocklist only to what it profiles)
BL_FAILED, BL_REJECTED = 11, 7
#: DENSE: bucket 8's winner 11 has measured alternatives (7 is blocked, 3 is the best other one);
#: bucket 16's winner 7 has none, so FlashInfer's fallback serves it, never bucket 32's winner
BL_WINNERS = {DENSE: {1: 0, 8: BL_FAILED, 16: BL_REJECTED, 32: 9}, P2: {16: 5, 64: 12}}
BL_MEASURED = {(DENSE, 8): {BL_FAILED: 9.0, BL_REJECTED: 9.5, 3: 12.0, 4: 13.0}}
BL_CHOICE = {DENSE: {1: 0, 8: 3, 16: -1, 32: 9}, P2: {16: 5, 64: 12}}


def _bl_trial(env: Env, p: Problem, bucket: int, idx: int, status: str, reason: str = "",
              us: float | None = None) -> Trial:
    t = _tactic(idx)
    return Trial(p.key, bucket, t.id, "cutlass", t.to_json(), env.device_key, env.lib_key(DEPS), status, reason,
                 median_us=us, reps=10 if us else 0)


def _bl_store(path: str, extra_failed: tuple[int, ...] = ()) -> str:
    with Store(path) as s:
        s.put_environment(SM120, DEPS)
        for p, wins in BL_WINNERS.items():
            for b, idx in wins.items():
                s.put_winner(_winner(SM120, p, b, _tactic(idx)))
        for (p, b), times in BL_MEASURED.items():
            for idx, us in times.items():
                s.put_trial(_bl_trial(SM120, p, b, idx, "ok", us=us))
        s.put_trial(_bl_trial(SM120, P2, 16, BL_FAILED, "failed", "illegal instruction (worker died)"))
        s.put_trial(_bl_trial(SM120, P2, 1, BL_REJECTED, "rejected", "SharedStorageSize over the opt-in limit"))
        for idx in extra_failed:
            s.put_trial(_bl_trial(SM120, P2, 64, idx, "failed", "wrong result"))
    return path


@pytest.fixture(scope="module")
def bl_db(tmp_path_factory) -> str:
    return _bl_store(str(tmp_path_factory.mktemp("bl") / "cache.db"))


def _bl_expected(p: Problem, m: int) -> int:
    """The tactic FlashInfer must serve at M: the choice of our bucket that FlashInfer's bucket of M
    maps to, -1 where that bucket gets no entry or M is past our largest bucket's FlashInfer bucket."""
    ch = BL_CHOICE[p]
    fb = K.m_bucket(m)
    if fb > K.m_bucket(max(ch)):
        return -1
    return ch[Buckets(tuple(ch)).bucket(min(fb, max(ch)))]


BL_QUERIES = [[m, p.n, p.k, 0] for p in BL_WINNERS for m in range(1, 2 * max(BL_WINNERS[p]) + 1)]


def test_export_never_writes_a_blocklisted_tactic(bl_db, tmp_path):
    rep = _export(bl_db, tmp_path / "fi.json", "0.7.4")
    doc = json.loads((tmp_path / "fi.json").read_text())
    assert set(rep.blocked) == {BL_FAILED, BL_REJECTED}
    written = {v[1] for k, v in doc.items() if not k.startswith("_")}
    assert not written & set(rep.blocked)
    for p, ch in BL_CHOICE.items():
        for fb in sorted({K.m_bucket(m) for m in range(1, max(ch) + 1)}):
            key = K.file_key(K.nearest_profile(fb, p.n, p.k, ()))
            want = _bl_expected(p, fb)
            assert (doc[key][1] if key in doc else -1) == want, (p.key, fb)
    lines = "\n".join(rep.skipped)
    assert (f"{DENSE.key} bucket 8: winner tactic {BL_FAILED} is blocklisted" in lines
            and "written: tactic 3, this bucket's best measured tactic (12.00 us)" in lines)
    assert (f"{DENSE.key} bucket 16: winner tactic {BL_REJECTED} is blocklisted" in lines
            and "so FlashInfer falls back to -1 (tactic 21 in 0.7.2.post1, 21 in 0.7.4, not blocklisted)" in lines)


def test_export_refuses_when_the_fallback_is_blocklisted(tmp_path):
    """21 is what -1 runs on SM120: blocklisted, a bucket without a measured alternative cannot be
    left to FlashInfer's fallback, so nothing is written."""
    db = _bl_store(str(tmp_path / "c.db"), extra_failed=(21,))
    with pytest.raises(ExportError, match=r"bucket 16: winner tactic 7 is blocklisted .* fallback -1 runs a "
                                          r"blocklisted kernel \(0\.7\.2\.post1: tactic 21, 0\.7\.4: tactic 21\)"):
        _export(db, tmp_path / "fi.json", "0.7.4")
    assert not (tmp_path / "fi.json").exists() and not (tmp_path / "fi.blocklist.json").exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_fallback_is_the_release_runner_default(version):
    csrc = _target(version) / "flashinfer" / "data" / "csrc"
    for arch, f in (("sm120", "fp4_gemm_cutlass_sm120.cu"), ("sm100", "fp4_gemm_cutlass.cu")):
        assert K.fallback_from_source((csrc / f).read_text(), arch) == K.FALLBACK[arch]
    assert K.fallback_index("sm120", version) == 21 and K.fallback_index("sm100", version) == 0


@pytest.mark.parametrize("version", VERSIONS)
def test_choose_one_serves_no_blocklisted_tactic(bl_db, tmp_path, version):
    """FlashInfer's own choose_one, every M of both problems up to twice our largest bucket: 0
    lookups serve a blocklisted tactic (-1 counted as the kernel it launches), none a neighbour's."""
    _target(version)
    env = _probe(version, {})
    rep = _export(bl_db, tmp_path / "fi.json", version, {f: env["metadata"][f] for f in K.META_FIELDS})
    got = _probe(version, {"load": [str(tmp_path / "fi.json")], "queries": BL_QUERIES},
                 blocklist=tmp_path / "fi.blocklist.json")
    assert got["loaded"] == [True] and len(got["chosen"]) == len(BL_QUERIES)
    served = [K.fallback_index("sm120", version) if t == -1 else t for t in got["chosen"]]
    assert sum(t in rep.blocked for t in served) == 0
    by_key = {p.key: p for p in BL_WINNERS}
    assert got["chosen"] == [_bl_expected(by_key[Problem.dense(n, k).key], m) for m, n, k, _ in BL_QUERIES]
    assert got["profiled"] == [i for i in range(len(fim.configs("sm120", version))) if i not in rep.blocked]


# ------------------------------------------------------------------- predicted winners

@pytest.fixture(scope="module")
def predicted_db(tmp_path_factory) -> str:
    """Measured winners at buckets 1, 8, 16 and a predicted one (never timed) at 64."""
    path = str(tmp_path_factory.mktemp("fi_pred") / "cache.db")
    with Store(path) as s:
        s.put_environment(SM120, DEPS)
        for b in (1, 8, 16):
            s.put_winner(_winner(SM120, DENSE, b, _tactic(PICKS[b])))
        s.put_winner(replace(_winner(SM120, DENSE, 64, _tactic(PICKS[64])), predicted=True))
    return path


def _entry(path: Path, m: int) -> list | None:
    doc = json.loads(path.read_text())
    return doc.get(K.file_key(K.nearest_profile(m, 256, 512, K.ALPHA_SHAPES[0])))


def test_predicted_winners_are_left_out_unless_asked(predicted_db, tmp_path):
    rep = _export(predicted_db, tmp_path / "out.json", "0.7.4")
    assert rep.predicted_left == 1 and rep.measured_with == {"0.7.4": 3}
    assert _entry(tmp_path / "out.json", 64) != [K.RUNNER, PICKS[64], K.POLICY]
    assert any("1 predicted winners (never timed) left out" in line for line in render(rep))
    left_out = rep.entries
    rep = _export(predicted_db, tmp_path / "all.json", "0.7.4", include_predicted=True)
    assert rep.predicted_left == 0 and rep.measured_with == {"0.7.4": 4} and rep.entries > left_out
    assert _entry(tmp_path / "all.json", 64) == [K.RUNNER, PICKS[64], K.POLICY]
    assert not any("left out" in line for line in render(rep))


def test_only_predicted_winners_refuse_and_name_the_flag(tmp_path):
    path = str(tmp_path / "c.db")
    with Store(path) as s:
        s.put_environment(SM120, DEPS)
        s.put_winner(replace(_winner(SM120, DENSE, 16, _tactic(PICKS[16])), predicted=True))
    with pytest.raises(ExportError, match="1 predicted, never timed, left out: --include-predicted"):
        _export(path, tmp_path / "x.json", "0.7.4")
    assert not (tmp_path / "x.json").exists()


def test_cli_says_how_many_predicted_were_left_out(predicted_db, tmp_path):
    meta = [a for f in K.META_FIELDS if f not in K.NO_WILDCARD for a in ("--meta", f"{f}=*")]
    args = ("--cache", predicted_db, "--gpu", "5090", "--flashinfer-version", "0.7.4", *meta)
    r = _cli("-o", str(tmp_path / "o.json"), *args)
    assert r.returncode == 0, r.stderr
    assert "1 predicted winners (never timed) left out: --include-predicted exports them" in r.stdout
    r = _cli("-o", str(tmp_path / "p.json"), *args, "--include-predicted")
    assert r.returncode == 0, r.stderr
    assert "left out" not in r.stdout and _entry(tmp_path / "p.json", 64) == [K.RUNNER, PICKS[64], K.POLICY]
