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


# Worked out by hand (exact binomial sums), not by the functions under test: the 95% interval of the
# median of n samples is (x(j), x(n+1-j)) for the largest j with P(B <= j-1) <= 0.025, B ~ Bin(n, 1/2).
#   n = 6:  P(B <= 0) = 1/64 = 0.0156;      P(B <= 1) = 7/64 = 0.109         -> j = 1: (x1, x6)
#   n = 10: P(B <= 1) = 11/1024 = 0.0107;   P(B <= 2) = 56/1024 = 0.0547     -> j = 2: (x2, x9)
#   n = 20: P(B <= 5) = 21700/2^20 = 0.0207; P(B <= 6) = 60460/2^20 = 0.0577 -> j = 6: (x6, x15)
#   n = 24: P(B <= 6) = 190051/2^24 = 0.0113; P(B <= 7) = 536155/2^24 = 0.0320 -> j = 7: (x7, x18)
#   n = 5:  P(B <= 0) = 1/32 = 0.031 > 0.025: no j; the full range covers 1 - 2/32 = 93.75% only
@pytest.mark.parametrize(
    "samples, low, high, covered",
    [
        ([5.0, 3.0, 6.0, 1.0, 4.0, 2.0], 1.0, 6.0, True),
        ([10.0, 2.0, 9.0, 3.0, 8.0, 4.0, 7.0, 5.0, 6.0, 1.0], 2.0, 9.0, True),
        ([float(v) for v in range(20, 0, -1)], 6.0, 15.0, True),
        ([float(v) for v in range(1, 25)], 7.0, 18.0, True),
        ([2.0, 1.0, 3.0, 5.0, 4.0], 1.0, 5.0, False),
    ],
)
def test_the_interval_of_the_median_is_the_hand_computed_order_statistics(samples, low, high, covered):
    ci = median_ci(samples)
    assert (ci.low, ci.high, ci.covered) == (low, high, covered)


def test_the_half_width_is_the_larger_side():
    from longca.measure.stats import MedianCI

    # median 10, low 9 (10% below), high 10.5 (5% above): the interval's half width is 10%
    assert MedianCI(low=9.0, high=10.5, covered=True).half_width(10.0) == pytest.approx(0.10)
    assert MedianCI(low=9.5, high=12.0, covered=True).half_width(10.0) == pytest.approx(0.20)


def test_the_stopping_rule_on_a_hand_worked_sequence():
    # 6 calls alternating 1.0 / 1.2 ms: interval (1.0, 1.2) about the median 1.1, +-9.1% > 5%: more.
    # The next batch is as large as the samples so far (6), all 1.0: 12 samples, nine 1.0 and three
    # 1.2, interval (x3, x10) = (1.0, 1.2) about 1.0: +20%: more. Next batch 12: 24 samples,
    # twenty-one 1.0, interval (x7, x18) = (1.0, 1.0): within 5%, stop at 24.
    script = [1.0, 1.2] * 3 + [1.0] * 100
    t = _Scripted(script).time(lambda: None, warmup=0, iters=1000, budget_s=100.0, ci_target=0.05)
    assert t.timed_iters == 24 and t.ci_met is True
    assert (t.ci.low, t.ci.high) == (1.0, 1.0)
    # the same calls capped at 20: 6, 12, then a batch of 8 (what the cap leaves) and the stop
    t = _Scripted([1.0, 1.2] * 100).time(lambda: None, warmup=0, iters=20, budget_s=100.0, ci_target=0.05)
    assert t.timed_iters == 20 and t.ci_met is False


def test_another_level_gives_its_own_hand_computed_interval():
    # at 50%: n = 6, P(B <= 1) = 7/64 = 0.109 <= 0.25, P(B <= 2) = 22/64 = 0.344 > 0.25 -> j = 2: (x2, x5);
    # the fewest samples reaching 50% are 2: (x1, x2) covers 1 - 2/4 = 50% (one sample covers nothing)
    ci = median_ci([6.0, 1.0, 5.0, 2.0, 4.0, 3.0], level=0.5)
    assert (ci.low, ci.high, ci.covered) == (2.0, 5.0, True)
    assert min_samples(0.5) == 2 and min_samples() == 6


def test_the_half_width_about_a_zero_median_is_infinite():
    from longca.measure.stats import MedianCI

    assert MedianCI(low=0.0, high=0.0, covered=True).half_width(0.0) == math.inf
