"""The GPU timer's sizing of a graph-replay run, on the CPU: as many samples as fit the budget at
the first batch's time per replay (`samples_for`: the spin kernel that keeps the host's launch
latency out of each sample counted), never fewer than min_reps nor more than max_reps; with the
precision stop, as many as make the median's standard error that share of it (`precise_for`).
The timer itself runs in tests/test_gpu.py."""
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


def test_the_precision_stop_asks_for_samples_by_the_spread():
    steady = [10.0, 10.01, 9.99, 10.0, 10.02]
    noisy = [10.0, 10.4, 9.6, 10.2, 9.8]
    assert timing.precise_for(steady, 0.0025) <= timing.FIRST_SAMPLES     # already precise: stop now
    n = timing.precise_for(noisy, 0.0025)
    rel_iqr = (10.3 - 9.7) / 10.0          # statistics.quantiles' IQR of `noisy`
    assert n == pytest.approx((timing.SE_PER_IQR * rel_iqr / 0.0025) ** 2, rel=0.02) and n > 100
    assert timing.precise_for(noisy, 0.01) < n                          # a looser target, fewer samples
    assert timing.precise_for(noisy, 0) == len(noisy) == timing.precise_for([0.0] * 5, 0.0025)



def test_a_count_bound_timer_takes_max_reps():
    """The bench harness's timer (budget_s = inf, min_reps = max_reps): the count, not an overflow."""
    cfg = TimerConfig(budget_s=float("inf"), min_reps=20, max_reps=20)
    assert timing.samples_for(80.0, cfg) == 20 == timing.samples_for(0.0, cfg)
