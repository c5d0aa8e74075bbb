"""The timer protocol: warm-up count, timed iterations capped by count and by budget."""

import threading
import time

import pytest

from longca.measure.timer import CpuTimer, RankTimer


def test_counts_are_recorded_and_capped_by_iters():
    calls = []
    t = CpuTimer().time(lambda: calls.append(1), warmup=3, iters=7, min_iters=1, budget_s=100.0)
    assert (t.warmup_iters, t.timed_iters, len(calls)) == (3, 7, 10)
    assert len(t.samples_ms) == 7 and t.p20_ms <= t.median_ms <= t.p80_ms


def test_budget_caps_slow_calls_but_not_below_min_iters():
    # Each call takes >= 20 ms and the budget is 10 ms: only min_iters timed iterations run.
    t = CpuTimer().time(lambda: time.sleep(0.02), warmup=0, iters=50, min_iters=2, budget_s=0.01)
    assert t.timed_iters == 2


def test_before_runs_outside_the_timed_call():
    order = []
    CpuTimer().time(lambda: order.append("call"), warmup=1, iters=2, before=lambda: order.append("before"))
    assert order == ["before", "call"] * 3


class _CountingTimer(CpuTimer):
    """Records when handles are issued and read, to check the deferred read-back."""

    def __init__(self):
        self.events = []

    def _start_one(self, fn):
        self.events.append("start")
        return super()._start_one(fn)

    def _elapsed_ms(self, handle):
        self.events.append("read")
        return super()._elapsed_ms(handle)


def test_first_sample_is_read_at_once_the_rest_after_the_last_call():
    t = _CountingTimer()
    timing = t.time(lambda: None, warmup=0, iters=4, budget_s=100.0)
    # The first read sets the count from the budget; later calls are all issued before any read.
    assert t.events == ["start", "read", "start", "start", "start", "read", "read", "read"]
    assert timing.timed_iters == 4


@pytest.fixture
def virtual_clock(monkeypatch):
    """time.perf_counter and time.sleep on a clock that only sleeping advances: the walls below are
    exact on any machine, under any load (real sleeps with upper bounds flaked on a busy CI). It
    starts far from zero, so a wall taken as a sum of two readings instead of their difference shows."""
    now = [5000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def test_first_warmup_call_beyond_a_steady_one_is_compile_time(virtual_clock):
    # A JIT kernel compiles on its first call; the warm-up absorbs it and reports it as compile_s.
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.3 if len(calls) == 1 else 0.01)

    t = CpuTimer().time(fn, warmup=1, iters=2, budget_s=100.0)
    assert t.compile_s == pytest.approx(0.29)  # the first call's 0.3 s beyond a steady call's 0.01 s
    assert t.samples_ms == pytest.approx([10.0, 10.0])  # never inside a timed sample


def test_compile_time_counts_the_untimed_before_call_too(virtual_clock):
    # Backward cells compile in the fresh forward (`before`) as well as in the timed backward.
    befores = []

    def before():
        befores.append(1)
        time.sleep(0.2 if len(befores) == 1 else 0.0)

    t = CpuTimer().time(lambda: None, warmup=2, iters=1, budget_s=100.0, before=before)
    assert t.compile_s == pytest.approx(0.2)


def test_no_warmup_means_no_compile_estimate():
    assert CpuTimer().time(lambda: None, warmup=0, iters=1).compile_s == 0.0


def test_warmup_time_budget_stops_after_the_first_warmup_once_spent():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.01)

    t = CpuTimer().time(fn, warmup=5, iters=2, budget_s=100.0, warmup_s=1e-6)
    assert t.warmup_iters == 1 and len(calls) == 1 + 2


def test_warmup_time_budget_never_exceeds_the_count():
    calls = []
    t = CpuTimer().time(lambda: calls.append(1), warmup=5, iters=2, budget_s=100.0, warmup_s=1e6)
    assert t.warmup_iters == 5 and len(calls) == 5 + 2


def test_warmup_time_budget_stops_once_reached(virtual_clock):
    # 30 ms per call and a 50 ms budget: the second warm-up reaches it.
    t = CpuTimer().time(lambda: time.sleep(0.03), warmup=10, iters=1, budget_s=100.0, warmup_s=0.05)
    assert t.warmup_iters == 2
    assert t.warmup_wall_s == pytest.approx(0.06)


def test_warmup_time_budget_waits_for_the_device_after_each_warmup():
    # On a GPU the calls are asynchronous: without a sync the budget would see launch time only.
    class Syncs(CpuTimer):
        def __init__(self):
            self.syncs = 0

        def _sync(self):
            self.syncs += 1

    plain, budgeted = Syncs(), Syncs()
    plain.time(lambda: None, warmup=4, iters=1)
    budgeted.time(lambda: None, warmup=4, iters=1, warmup_s=1e6)
    assert plain.syncs == 2  # after the first warm-up (compile estimate) and before timing
    assert budgeted.syncs == 4 + 1


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_non_positive_warmup_budget_is_refused(bad):
    with pytest.raises(ValueError, match="warmup_s"):
        CpuTimer().time(lambda: None, warmup=1, iters=1, warmup_s=bad)


def test_phase_walls_cover_warmup_untimed_calls_and_timed_calls(virtual_clock):
    # 3 warm-ups of 20 ms (+10 ms `before` each), 2 timed calls of 20 ms, each after a 10 ms `before`.
    t = CpuTimer().time(lambda: time.sleep(0.02), warmup=3, iters=2, budget_s=100.0, before=lambda: time.sleep(0.01))
    assert t.warmup_iters == 3
    assert t.warmup_wall_s == pytest.approx(0.09)
    assert t.kernel_s == pytest.approx(0.04)
    other = t.wall_s - t.warmup_wall_s - t.kernel_s  # the `before` calls of the timed iterations
    assert other == pytest.approx(0.02)


def test_no_warmup_has_no_warmup_wall(virtual_clock):
    t = CpuTimer().time(lambda: time.sleep(0.01), warmup=0, iters=1)
    assert t.warmup_iters == 0 and t.warmup_wall_s == 0.0 and t.wall_s == pytest.approx(0.01)


class _CheckedGroup:
    """Ranks as threads whose collectives check that every rank called the same one: a rank that
    issues a call the others do not meets their other collective and fails, where a process group
    would hang (a barrier against an all-reduce)."""

    def __init__(self, world: int) -> None:
        self._gate = threading.Barrier(world, timeout=60)
        self._posted: list = [None] * world

    def _meet(self, rank: int, kind: str, value: float = 0.0) -> float:
        self._posted[rank] = (kind, value)
        self._gate.wait()
        kinds = sorted({k for k, _ in self._posted})
        agreed = max(v for _, v in self._posted)
        self._gate.wait()  # every rank has read before the next collective overwrites
        assert len(kinds) == 1, f"ranks met different collectives: {kinds}"
        return agreed

    def timer(self, rank: int) -> RankTimer:
        return RankTimer(CpuTimer(), lambda: self._meet(rank, "barrier"), lambda v: self._meet(rank, "agree", v))


def test_ranks_of_different_paces_issue_the_same_calls():
    """Adaptive timing on ranks whose calls take different times (one rank's work is most of every
    iteration): the budget left, and so each batch's size, looks different from each rank, yet every
    rank must issue the same calls or a barrier meets another rank's all-reduce."""
    group, timings, errors = _CheckedGroup(2), [None, None], []

    def rank(r: int) -> None:
        try:
            timings[r] = group.timer(r).time(
                lambda: time.sleep(0.0 if r == 0 else 0.03), warmup=0, iters=1000, budget_s=0.6, ci_target=1e-6
            )
        except Exception as e:  # noqa: BLE001 - reported below, with the other rank's
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert timings[0].timed_iters == timings[1].timed_iters >= 6


@pytest.mark.parametrize(
    "first_ms, iters, min_iters, budget_s, planned",
    [
        (10.0, 1000, 3, 2.0, 200),  # 2 s of 10 ms calls
        (10.0, 50, 3, 2.0, 50),  # the count caps
        (1000.0, 1000, 3, 2.0, 3),  # the floor: 2 calls fit, 3 are taken
        (0.0, 7, 1, 1.0, 7),  # a call too short to read: the count caps, no division by zero
        (0.5, 10**9, 1, 1.0, 2000),
        (3.0, 10**9, 1, 1.0, 333),  # int(333.33)
    ],
)
def test_planned_iterations_by_hand(first_ms, iters, min_iters, budget_s, planned):
    from longca.measure.timer import _plan_iters

    assert _plan_iters(first_ms, iters, min_iters, budget_s) == planned


def test_a_call_of_almost_no_time_plans_by_a_microsecond_floor():
    from longca.measure.timer import _plan_iters

    # 1e-9 ms reads as 1e-6 ms: 1 s of budget is 1e9 calls, where the true pace would say 1e12
    assert _plan_iters(1e-9, 10**15, 1, 1.0) == 10**9
