"""The distribution-free interval of the median and the adaptive protocol that samples until it is
narrow enough (longca.measure.stats, Timer.time(ci_target=...))."""

from __future__ import annotations

import math
import random

import pytest

from longca.measure.stats import median_ci, min_samples, ranks
from longca.measure.timer import Timer


def _coverage(n: int, j: int, k: int) -> float:
    return sum(math.comb(n, i) for i in range(j, k)) / 2**n


@pytest.mark.parametrize("n", [6, 7, 10, 20, 50, 101, 1000])
def test_ranks_are_the_narrowest_symmetric_pair_reaching_95_percent(n):
    j, k, covered = ranks(n)
    assert covered and k == n + 1 - j
    assert _coverage(n, j, k) >= 0.95
    if j + 1 <= n + 1 - (j + 1):  # one rank further in falls short
        assert _coverage(n, j + 1, n - j) < 0.95


def test_known_ranks():
    # textbook values: n = 6 -> (1, 6) at 96.9%; n = 20 -> (6, 15) at 95.9%
    assert ranks(6) == (1, 6, True)
    assert ranks(20) == (6, 15, True)
    assert ranks(5) == (1, 5, False) and min_samples() == 6


def test_interval_brackets_the_median_and_narrows_with_samples():
    rng = random.Random(0)
    few = [rng.lognormvariate(0, 0.1) for _ in range(10)]
    many = few + [rng.lognormvariate(0, 0.1) for _ in range(990)]
    a, b = median_ci(few), median_ci(many)
    assert a.low <= sorted(few)[4] <= a.high
    assert (b.high - b.low) < (a.high - a.low)


def test_coverage_is_close_to_the_level_on_skewed_draws():
    # a simulation over a skewed (exponential) distribution with a known median, ln 2
    rng = random.Random(1)
    inside = 0
    for _ in range(2000):
        ci = median_ci([rng.expovariate(1.0) for _ in range(30)])
        inside += ci.low <= math.log(2) <= ci.high
    assert 0.94 <= inside / 2000 <= 0.995


class _Scripted(Timer):
    """A timer whose timed calls return scripted durations (ms); the timer module's clock advances
    by them (the `clock` fixture), so budgets see the scripted time."""

    name = "scripted"
    now = [0.0]

    def __init__(self, durations):
        self.durations = iter(durations)

    def _start_one(self, fn):
        fn()
        ms = next(self.durations)
        _Scripted.now[0] += ms / 1000.0
        return ms

    def _elapsed_ms(self, handle):
        return handle


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    import longca.measure.timer as timer_module

    _Scripted.now = [0.0]
    monkeypatch.setattr(timer_module.time, "perf_counter", lambda: _Scripted.now[0])


def test_adaptive_stops_once_the_interval_is_within_the_target():
    # identical calls: the interval has no width once it has 6 samples
    t = _Scripted([1.0] * 1000).time(lambda: None, warmup=0, iters=1000, budget_s=100.0, ci_target=0.01)
    assert t.timed_iters == 6 and t.ci_met is True and t.ci_target == 0.01


def test_adaptive_samples_more_for_noisy_calls_and_says_when_it_fell_short():
    rng = random.Random(2)
    noisy = [1.0 + rng.uniform(-0.2, 0.2) for _ in range(5000)]
    t = _Scripted(noisy).time(lambda: None, warmup=0, iters=40, budget_s=100.0, ci_target=0.001)
    assert t.timed_iters == 40 and t.ci_met is False  # capped by iters, target not reached
    t = _Scripted(noisy).time(lambda: None, warmup=0, iters=5000, budget_s=100.0, ci_target=0.02)
    assert 6 < t.timed_iters < 5000 and t.ci_met is True
    assert t.ci.half_width(t.median_ms) <= 0.02


def test_adaptive_keeps_min_iters_and_three_calls_for_long_ones():
    t = _Scripted([1.0] * 100).time(lambda: None, warmup=0, iters=100, min_iters=12, budget_s=100.0, ci_target=0.05)
    assert t.timed_iters == 12
    # a call over 1 s: at least 3 (the interval then stays the full range: not "met")
    t = _Scripted([1500.0] * 10).time(lambda: None, warmup=0, iters=10, min_iters=1, budget_s=2.0, ci_target=0.05)
    assert t.timed_iters == 3 and t.ci_met is False


def test_adaptive_stops_at_the_budget():
    rng = random.Random(3)
    noisy = [10.0 + rng.uniform(-3, 3) for _ in range(5000)]
    t = _Scripted(noisy).time(lambda: None, warmup=0, iters=5000, budget_s=0.5, ci_target=0.0001)
    assert t.ci_met is False and sum(t.samples_ms) / 1000.0 <= 0.5 + 0.02  # at most one call past it


def test_without_a_target_the_protocol_is_unchanged():
    t = _Scripted([1.0] * 50).time(lambda: None, warmup=0, iters=7, budget_s=100.0)
    assert t.timed_iters == 7 and t.ci_target is None and t.ci_met is None
    assert t.ci.low == t.ci.high == 1.0


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1])
def test_a_target_outside_0_1_is_refused(bad):
    with pytest.raises(ValueError, match="ci_target"):
        _Scripted([1.0] * 10).time(lambda: None, warmup=0, iters=10, ci_target=bad)
