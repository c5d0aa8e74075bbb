"""The idle pause before a measurement (repeat.cooldown_s)."""

import time

import torch

from longca.measure.cooldown import cool_down


def test_no_cooldown_returns_at_once():
    t0 = time.perf_counter()
    assert cool_down(None, torch.device("cpu")) == 0.0 and cool_down(0, torch.device("cpu")) == 0.0
    assert time.perf_counter() - t0 < 0.05


def test_cooldown_idles_and_returns_the_seconds_spent():
    t0 = time.perf_counter()
    spent = cool_down(0.1, torch.device("cpu"))
    assert 0.1 <= spent <= time.perf_counter() - t0
