"""Worker isolation on a real GPU (skipped elsewhere): a sticky CUDA error costs one worker only."""
import pytest

from autotune.engine import timing
from autotune.core.buckets import Buckets
from autotune.core.env import current
from autotune.engine.halving import Halving
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
                 halving=Halving(budget_s=0.3), runner=Runner(timeout_s=120))
    got = {Tactic.from_json(t.params_json): t for t in store.get_trials(p.key, 16, env.device_key)}
    bad = got[Tactic("cuda_faults", mode="illegal_address")]
    assert bad.status == "failed" and "CUDA context unusable" in bad.reason, bad.reason
    after = got[Tactic("cuda_faults", mode="good_b")]            # measured in the restarted worker
    assert after.status in ("ok", "dropped") and after.rel_err < 1e-2
    assert rep.failed == 1 and rep.winners
