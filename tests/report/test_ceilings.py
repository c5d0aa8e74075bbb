"""The measured matrix-product ceiling (benchmarks/matmul_ceiling.py's JSON) as the report reads it."""

from __future__ import annotations

import json

import pytest

from longca.report import ceilings


def _record(**extra):
    return {
        "what": "matmul",
        "device_name": "NVIDIA H100 80GB HBM3",
        "dtype": "bfloat16",
        "n": 8192,
        "tflops": 679.0,
        "round_tflops": [687.0, 672.0, 679.0],
        "timestamp": "2026-12-07T22:52:47+00:00",
        **extra,
    }


def test_the_rate_per_ghz_is_the_best_rounds_at_its_own_in_window_clock(tmp_path):
    path = tmp_path / "ceiling.json"
    path.write_text(json.dumps([_record(clock_window_mhz=[1800, 1400, 1500], clock_mhz=[1700, 1300, 1400])]))
    (row,) = ceilings.load([path]).to_dicts()
    assert row["matmul_tflops_per_ghz"] == pytest.approx(672.0 / 1.4)  # 480 beats 381.7 and 452.7
    assert (row["matmul_tflops"], row["tflops_min"], row["tflops_max"], row["rounds"]) == (679.0, 672.0, 687.0, 3)


@pytest.mark.parametrize(
    "extra",
    [{}, {"clock_mhz": [1800, 1400, 1500]}, {"clock_window_mhz": [1800, None, 1500]}, {"clock_window_mhz": [1]}],
)
def test_no_rate_per_ghz_without_one_sampled_clock_per_round(extra):
    assert ceilings.per_ghz(_record(**extra)) is None


def test_the_latest_record_per_device_and_dtype_and_refusals(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps([_record(tflops=600.0, timestamp="2026-12-01T00:00:00+00:00")]))
    new.write_text(json.dumps([_record()]))
    assert ceilings.load([new, old]).get_column("matmul_tflops").to_list() == [679.0]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"what": "matmul", "dtype": "bfloat16"}]))
    with pytest.raises(ValueError, match=r"bad.json: a record lacks \['device_name', 'tflops', 'round_tflops'\]"):
        ceilings.load([bad])
