"""The idle pause before a measurement (repeat.cooldown_s), on a clock that only sleeping advances
(exact on any machine, under any load)."""

import time

import pytest
import torch

from longca.measure.cooldown import cool_down


@pytest.fixture
def virtual_clock(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(time, "sleep", lambda s: now.__setitem__(0, now[0] + s))
    return now


def test_no_cooldown_returns_at_once(virtual_clock):
    assert cool_down(None, torch.device("cpu")) == 0.0 and cool_down(0, torch.device("cpu")) == 0.0
    assert virtual_clock[0] == 0.0  # it never slept


def test_cooldown_idles_and_returns_the_seconds_spent(virtual_clock):
    assert cool_down(0.1, torch.device("cpu")) == pytest.approx(0.1)
    assert virtual_clock[0] == pytest.approx(0.1)
