"""tools/sweep_projection.py: calls per row from the budget and cap, overheads added as declared."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("sweep_projection", ROOT / "tools" / "sweep_projection.py")
sp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sp)


def test_calls_are_bounded_by_the_budget_the_cap_and_the_minimum() -> None:
    # 1 ms calls: the 1 s budget allows 1000, the cap 200 -> 0.2 s timed; no overheads
    assert sp.project([1.0], 1.0, 200, per_row_s=0, per_call_ms=0, fixed_s=0) == pytest.approx((1.0, 0.2))
    # 500 ms calls: the budget allows 2, the minimum makes it 10 -> 5 s timed
    assert sp.project([500.0], 1.0, 200, per_row_s=0, per_call_ms=0, fixed_s=0) == pytest.approx((1.0, 5.0))


def test_overheads_lower_the_share_as_declared() -> None:
    # 2 rows of 10 ms under 1 s: 100 calls each, 1 s timed each; per row 0.5 s, per call 1 ms, fixed 1 s
    share, wall = sp.project([10.0, 10.0], 1.0, 1000, per_row_s=0.5, per_call_ms=1.0, fixed_s=1.0)
    assert wall == pytest.approx(2.0 + 0.2 + 1.0 + 1.0)
    assert share == pytest.approx(2.0 / wall)
