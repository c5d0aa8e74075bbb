"""The SM clock and throttle reasons during a cell's timed window, sampled on a thread.

A clock read before the window can catch the GPU still idle (345 MHz, reason "GPU idle") and one
after it only the end; rows therefore also carry what a sampler thread saw while the cell's calls
ran: the median and lowest SM clock and every throttle reason seen (NVML's bit mask, OR-ed).
NVML calls release the GIL (ctypes), and a sample every 10 ms costs nothing the GPU sees.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable
from typing import Any

PERIOD_S = 0.01


class ClockSampler:
    """`with ClockSampler(read) as s: ...` samples `read()` (a dict with `clock_mhz` and `throttle`,
    as longca.measure.env.gpu_clock_state returns; empty where NVML is missing) every `period_s`
    while the block runs, once at least; `s.summary()` gives the row's columns."""

    def __init__(self, read: Callable[[], dict[str, Any]], period_s: float = PERIOD_S) -> None:
        self.read, self.period_s = read, period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            got = self.read()
            if got:
                self.samples.append(got)
            if self._stop.wait(self.period_s):
                return

    def __enter__(self) -> ClockSampler:
        self._thread = threading.Thread(target=self._run, name="longca-clock-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        got = self.read()  # the window's last state, also for a window shorter than one period
        if got:
            self.samples.append(got)

    def summary(self) -> dict[str, Any]:
        """clock_window_mhz (median), clock_window_min_mhz and throttle_window (hex of every reason
        seen), all None where nothing was read."""
        clocks = [int(s["clock_mhz"]) for s in self.samples if s.get("clock_mhz") is not None]
        masks = [int(s["throttle"], 16) for s in self.samples if s.get("throttle")]
        seen = 0
        for m in masks:
            seen |= m
        return {
            "clock_window_mhz": int(statistics.median(clocks)) if clocks else None,
            "clock_window_min_mhz": min(clocks) if clocks else None,
            "throttle_window": hex(seen) if masks else None,
        }


def no_sampler() -> ClockSampler:
    """A sampler that reads nothing (CPU cells): its summary is all None."""
    return ClockSampler(dict, period_s=3600.0)
