"""The peak gate: datasheet figures per device and dtype, a loose bound on CPUs."""

import torch

from longca.measure.peak import DATASHEET_TFLOPS, peak_tflops


def test_hopper_gates_fp8_at_twice_its_16_bit_peak():
    for name in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        assert peak_tflops(torch.device("cuda"), name, "float8_e4m3fn") == (1979.0, "datasheet")
        assert peak_tflops(torch.device("cuda"), name, "bfloat16") == (989.0, "datasheet")


def test_a100_lists_no_fp8_peak():
    assert "float8_e4m3fn" not in DATASHEET_TFLOPS["NVIDIA A100-SXM4-80GB"]


def test_cpu_gets_a_per_core_bound_for_every_dtype():
    import os

    bound = 0.5 * (os.cpu_count() or 1)
    for dtype in ("float32", "bfloat16", "float8_e4m3fn"):
        assert peak_tflops(torch.device("cpu"), "cpu", dtype) == (bound, "0.5 TFLOP/s per CPU core bound")
