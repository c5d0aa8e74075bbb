"""The in-window clock sampler: what it reports from the reads it makes (a fake NVML here)."""

from __future__ import annotations

import itertools
import time

from longca.measure.clocks import ClockSampler, no_sampler


def test_a_window_reports_median_lowest_and_every_reason_seen():
    reads = itertools.cycle(
        [
            {"clock_mhz": 345, "throttle": "0x1"},
            {"clock_mhz": 1980, "throttle": "0x0"},
            {"clock_mhz": 1980, "throttle": "0x4"},
        ]
    )
    with ClockSampler(lambda: next(reads), period_s=0.001) as s:
        time.sleep(0.05)
    got = s.summary()
    assert len(s.samples) >= 3
    assert got["clock_window_mhz"] == 1980 and got["clock_window_min_mhz"] == 345
    assert got["throttle_window"] == "0x5"  # idle (0x1) and power cap (0x4) were both seen


def test_a_short_window_still_has_a_read_and_no_nvml_gives_nothing():
    with ClockSampler(lambda: {"clock_mhz": 1755, "throttle": "0x0"}, period_s=60.0) as s:
        pass
    assert s.summary() == {"clock_window_mhz": 1755, "clock_window_min_mhz": 1755, "throttle_window": "0x0"}
    with no_sampler() as s:
        pass
    assert s.summary() == {"clock_window_mhz": None, "clock_window_min_mhz": None, "throttle_window": None}


def test_the_thread_stops_with_the_window():
    with ClockSampler(lambda: {"clock_mhz": 1}, period_s=0.001) as s:
        time.sleep(0.01)
    n = len(s.samples)
    time.sleep(0.02)
    assert len(s.samples) == n and not s._thread.is_alive()
