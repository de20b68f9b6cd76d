"""Worker isolation on a real GPU (skipped elsewhere): a sticky CUDA error costs one worker only."""
import pytest

from autotune.engine import timing
from autotune.core.buckets import Buckets
from autotune.core.env import current
from autotune.engine.strategies.successive_halving import Halving
from autotune.core.problem import Problem
from autotune.engine.search import Runner, search
from autotune.cache import Store
from autotune.tactics import registry
from autotune.core.tactic import Tactic

pytestmark = pytest.mark.gpu


@pytest.fixture
def cuda_faults(register_family):
    register_family("cuda_faults", "tests.families.cuda_faults:CudaFaultFamily")


def test_illegal_address_poisons_only_its_worker(tmp_path, cuda_faults):
    env = current()
    p = Problem.dense(1024, 2048)
    store = Store(tmp_path / "c.db")
    rep = search([p], families=[registry.get("cuda_faults"), registry.get("torch")], store=store,
                 buckets=Buckets.of((16,)), env=env, timer=timing.TimerConfig(budget_s=0.02),
                 halving=Halving(budget_s=0.3), runner=Runner(timeout_s=120), strategy="halving")
    got = {Tactic.from_json(t.params_json): t for t in store.get_trials(p.key, 16, env.device_key)}
    bad = got[Tactic("cuda_faults", mode="illegal_address")]
    assert bad.status == "failed" and "CUDA context unusable" in bad.reason, bad.reason
    after = got[Tactic("cuda_faults", mode="good_b")]            # measured in the restarted worker
    assert after.status in ("ok", "dropped") and after.rel_err < 1e-2
    assert rep.failed == 1 and rep.winners


#: tensors a worker may still hold after a job past the problem's weights and packs (a family's small
#: module-level buffers); anything tactic-sized (a split-K workspace, moe_decode's reduce buffer of
#: M·top_k·N fp32, a captured graph's pool) is far larger
AFTER_JOB_BOUND = 256 << 20


def test_memory_returns_to_the_weights_after_every_job_of_a_real_moe_problem():
    """Several buckets of GLM-5 TP8's w2 with the reduce epilogue in ONE worker, the Triton moe_decode
    tactics whose launchers keep M·top_k·N fp32 reduce buffers: after every job the worker's
    allocated memory is back at its weights and packs (plus the bound), and nothing failed."""
    from autotune.core.arch import detect
    from autotune.engine.sink import Collect
    from autotune.engine.workers import ProcessExecutor, run_job
    from autotune.engine.search import Job

    p = Problem.moe(6144, 256, 256, 8, epilogue="reduce")
    fam, arch = registry.get("triton"), detect()
    kept = [t for t in fam.enumerate(p, arch) if fam.verdict(p, t, arch).ok is True][:6]
    assert kept
    ex = ProcessExecutor("cuda", timeout_s=240)
    try:
        for m in (1, 1024, 8192, 64):
            got = Collect()
            failure = run_job(ex, Job(p, m, tuple(kept), kept[0].id), timing.TimerConfig(budget_s=0.01),
                              Halving(budget_s=0.2), 0, got)
            stages, outs = got.stages, got.outcomes
            assert failure is None
            assert all(o.status != "failed" for o in outs), [o.reason for o in outs if o.status == "failed"]
            mem = stages.memory
            assert mem["after_job"] <= mem["kept_after_job"] + AFTER_JOB_BOUND, (m, mem)
            if m == 8192:      # the reduce buffers alone: 6 tactics x 1.6 GB would have stayed before
                assert mem["peak"] < mem["kept_after_job"] + (8 << 30), mem
    finally:
        ex.close()


def test_a_failed_capture_hands_its_memory_pool_back():
    """A call with a host sync inside cannot be captured: the timer times it eagerly instead, and the
    pool the failed capture allocated from goes back (timing.abandon). Left to PyTorch it stays
    reserved for the life of the process: 256 MiB per try here, GBs per torch-family MoE tactic at
    M = 4096 in the main job on an 80 GB H100 (2026-12-05)."""
    import torch

    def call(i):
        t = torch.ones(256 << 20, dtype=torch.uint8, device="cuda")
        return int(t[-1].item())          # a host read: not capturable
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base, stream = torch.cuda.memory_reserved(), torch.cuda.current_stream()
    before = dict(timing.ABANDONED)
    for _ in range(4):
        t = timing.time_calls(call, 1, "cuda", timing.TimerConfig(budget_s=0.001, min_reps=1, max_reps=2), {})
        assert t.median_us > 0
    assert torch.cuda.current_stream() == stream          # not left on the failed capture's stream
    x = torch.zeros(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):                             # the allocator routes nothing stale: a capture works
        x.add_(1)
    g.replay()
    assert x.tolist() == [1.0] * 4
    del g
    torch.cuda.empty_cache()
    assert timing.ABANDONED["captures"] - before["captures"] == 4
    assert timing.ABANDONED["released"] - before["released"] == 4 and timing.ABANDONED["kept"] == before["kept"]
    assert torch.cuda.memory_reserved() <= base + (32 << 20), (base, torch.cuda.memory_reserved())
