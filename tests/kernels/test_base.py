"""Kernel-independent refusals (what a GPU generation cannot compute at all) and the optional hooks."""

import torch

from longca.kernels.base import DTYPES, backward_refusal, dtype_refusal, grad_changes_form, prepares_per_pass
from longca.kernels.registry import get
from longca.masks.registry import build_mask


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


def test_optional_hooks_are_read_in_one_place():
    """The Kernel protocol's optional hooks: a kernel without them prepares one form for both passes
    and never refuses its backward at run time; Flex declares the per-pass form (its `prepare` takes
    `grad`), off sm90 the same form either way."""
    cpu = torch.device("cpu")
    mask = build_mask("causal", 256)
    naive, flex = get("naive"), get("flex")
    assert not prepares_per_pass(naive) and prepares_per_pass(flex)
    assert grad_changes_form(naive, mask, head_dim=64, dtype=torch.float32, device=cpu) is False
    assert grad_changes_form(flex, mask, head_dim=64, dtype=torch.float32, device=cpu) is False
    assert backward_refusal(naive, cpu) is None
