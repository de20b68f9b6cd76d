"""The GPU timer's sizing of a graph-replay run (autotune.engine.timing.samples_for), on the CPU:
as many samples as fit the budget at the first batch's time per replay (the spin kernel that keeps
the host's launch latency out of each sample counted), never fewer than min_reps nor more than
max_reps. The timer itself runs in tests/test_gpu.py."""
import pytest

from autotune.engine import timing
from autotune.engine.options import TimerConfig


@pytest.mark.parametrize("est_us, want", [
    (80.0, 100),        # 10 ms at (80 + 20) us a sample
    (980.0, 10),
    (0.0, 200),         # a replay that took nothing still costs its spin: capped at max_reps
    (1e7, 3),           # a replay longer than the budget: min_reps
])
def test_a_replay_run_is_sized_by_the_budget_within_min_and_max_reps(est_us, want):
    cfg = TimerConfig(budget_s=0.01, min_reps=3, max_reps=200, lead_us=20.0)
    assert timing.samples_for(est_us, cfg) == want


def test_without_a_spin_the_replay_alone_sizes_the_run():
    cfg = TimerConfig(budget_s=0.001, min_reps=1, max_reps=1000, lead_us=0.0)
    assert timing.samples_for(10.0, cfg) == 100
    assert timing.samples_for(-5.0, cfg) == 1000       # a nonsense estimate cannot divide by <= 0
