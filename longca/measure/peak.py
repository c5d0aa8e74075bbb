"""Device dense-throughput peaks: a throughput above them is a bug, recorded as an error row."""

from __future__ import annotations

import os
import time

import torch

from longca.vocab import torch_dtype

# Dense (no sparsity) tensor-core peaks from vendor datasheets, TFLOP/s, by torch device name
# (A100 has no fp8 tensor cores: its fp8 cells are refused before they run).
_HOPPER = {"bfloat16": 989.0, "float16": 989.0, "float32": 494.0, "float8_e4m3fn": 1979.0}
DATASHEET_TFLOPS = {
    "NVIDIA H200": _HOPPER,
    "NVIDIA H100 80GB HBM3": _HOPPER,
    "NVIDIA H100": _HOPPER,
    "NVIDIA A100-SXM4-80GB": {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0},
    "NVIDIA A100-SXM4-40GB": {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0},
    "NVIDIA B200": {"bfloat16": 2250.0, "float16": 2250.0, "float32": 1125.0, "float8_e4m3fn": 4500.0},
}
_measured: dict[tuple[str, str], float] = {}


def measured_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int = 2048) -> float:
    """A quick matrix-product rate, measured once per process and device/dtype."""
    key = (str(device), str(dtype))
    if key not in _measured:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        for _ in range(2):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        reps = 5
        for _ in range(reps):
            a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        _measured[key] = 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12
    return _measured[key]


def peak_tflops(device: torch.device, device_name: str, dtype_name: str) -> tuple[float, str]:
    """The gate for one (device, dtype): datasheet where known, else 2 x a measured matmul rate."""
    table = DATASHEET_TFLOPS.get(device_name)
    if table and dtype_name in table:
        return table[dtype_name], "datasheet"
    if device.type == "cpu":
        # A bound no CPU core reaches (AVX-512 FMA at 5 GHz is ~0.3 TFLOP/s fp32): a measured matmul
        # rate would be noisy on a busy machine, and this gate only has to catch impossible speeds.
        return 0.5 * (os.cpu_count() or 1), "0.5 TFLOP/s per CPU core bound"
    dtype = torch_dtype(dtype_name)
    if dtype.itemsize == 1:
        # `@` takes no fp8; fp8 tensor cores run at twice the 16-bit rate wherever they exist
        return 4.0 * measured_matmul_tflops(device, torch.bfloat16), "2x twice a measured bf16 matmul"
    rate = measured_matmul_tflops(device, dtype)
    return 2.0 * rate, "2x measured matmul"
