"""An idle pause before a measurement, so the GPU's clock recovers from the previous one.

Back-to-back timed calls run a GPU such as the H200 under its software power cap at lower SM
clocks than a short burst does (the report's Status page shows each sweep's clocks). A pause
before each measurement (`repeat.cooldown_s`, a peer practice) lets a sweep measure at the
clocks a burst sees instead; without it, rows measure the sustained clocks a training job sees.
"""

from __future__ import annotations

import time

import torch


def cool_down(seconds: float | None, device: torch.device) -> float:
    """Wait for the device's queued work, then idle for `seconds`; the wall seconds spent idle
    (0.0 when `seconds` is unset or 0)."""
    if not seconds:
        return 0.0
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    time.sleep(float(seconds))
    return time.perf_counter() - t0
