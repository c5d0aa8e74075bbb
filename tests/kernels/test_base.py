"""Kernel-independent refusals: what a GPU generation cannot compute at all."""

from longca.kernels.base import DTYPES, dtype_refusal


def test_fp8_needs_sm89_or_newer():
    assert (
        dtype_refusal("float8_e4m3fn", (8, 0)) == "float8_e4m3fn needs compute capability >= (8, 9), device has (8, 0)"
    )
    assert dtype_refusal("float8_e4m3fn", (8, 9)) is None
    assert dtype_refusal("float8_e4m3fn", (9, 0)) is None


def test_16_bit_and_wider_dtypes_run_everywhere():
    for name in DTYPES:
        if name != "float8_e4m3fn":
            assert dtype_refusal(name, (7, 0)) is None
