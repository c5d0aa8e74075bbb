"""The correctness verdict (longca.run.check): tolerances per dtype, the reduced check length, and
which errors make a cell incorrect, at the exact boundaries."""

from __future__ import annotations

import math

import pytest

from longca.run import check
from longca.spec.cells import expand
from longca.spec.load import load_spec


def _cell(seqlen: int = 64, pass_: str = "fwd", dtype: str = "bfloat16", check_block: str = ""):
    spec = load_spec(
        text=f"""
name: t
device: cpu
{check_block}
masks: [full]
seqlens: [{seqlen}]
heads: ["2:1"]
head_dims: [16]
dtypes: [{dtype}]
passes: [{pass_}]
sweeps: [{{name: s, kernels: [sdpa_math]}}]
"""
    )
    (cell,) = expand(spec)
    return cell


def test_tolerance_is_the_dtypes_with_gradients_grad_factor_times_looser():
    assert check.tolerance(_cell(dtype="bfloat16")) == (3e-2, pytest.approx(9e-2))
    assert check.tolerance(_cell(dtype="float32")) == (5e-3, pytest.approx(1.5e-2))
    own = _cell(dtype="float16", check_block="check: {tolerance: {float16: 0.02, grad_factor: 5}}")
    assert check.tolerance(own) == (0.02, pytest.approx(0.1))


@pytest.mark.parametrize(
    "seqlen, granule, expected",
    [
        (64, 1, 64),  # within the check length: the cell's own
        (8192, 1, 8192),  # exactly the check length
        (16384, 1, 8192),
        (16384, 3000, 6000),  # the largest multiple of the granule within 8192
        (16384, 8192, 8192),
        (16384, 10000, 10000),  # never below one granule
    ],
)
def test_check_length(seqlen, granule, expected):
    assert check.check_length(_cell(seqlen=seqlen), granule) == expected


def test_check_columns_keep_the_errors_and_the_length_only():
    result = {"rel_err_out": 0.1, "rel_err_dq": 0.2, "check_seqlen": 64, "ref_dtype": "float64", "out": object()}
    assert check.check_columns(result) == {"rel_err_out": 0.1, "rel_err_dq": 0.2, "check_seqlen": 64}


def _errors(out=0.0, dq=0.0, dk=0.0, dv=0.0, seqlen=64):
    return {"rel_err_out": out, "rel_err_dq": dq, "rel_err_dk": dk, "rel_err_dv": dv, "check_seqlen": seqlen}


def test_forward_verdict_judges_the_output_only_at_its_tolerance():
    fwd = _cell(pass_="fwd")  # bfloat16: 0.03 out
    assert check.check_verdict(fwd, _errors(out=0.03, dq=1.0)) is None  # at the tolerance passes
    bad = check.check_verdict(fwd, _errors(out=0.0301))
    assert bad == "relative error above tolerance (0.03 out, 0.09 grads) at S=64: out=0.0301"
    assert check.check_verdict(fwd, {"rel_err_out": 0.0, "check_seqlen": 64}) is None  # no gradients needed


def test_backward_verdict_judges_every_gradient_at_the_looser_tolerance():
    bwd = _cell(pass_="bwd")
    assert check.check_verdict(bwd, _errors(out=0.03, dq=0.09, dk=0.09, dv=0.09)) is None
    assert check.check_verdict(bwd, _errors(dk=0.0901)).endswith("at S=64: dk=0.0901")
    assert check.check_verdict(bwd, _errors(out=0.05, dv=0.2)).endswith(": out=0.05, dv=0.2")
    assert check.check_verdict(bwd, _errors(dq=0.05)) is None  # a gradient within 3x the output's
    assert check.check_verdict(bwd, {"rel_err_out": 0.0, "check_seqlen": 64}) == "gradients were not checked"


def test_nan_never_passes():
    assert "out=nan" in check.check_verdict(_cell(), _errors(out=math.nan))
    assert "dq=nan" in check.check_verdict(_cell(pass_="bwd"), _errors(dq=math.nan))


def test_a_spec_without_grad_factor_gets_the_default_three():
    cell = _cell(dtype="float16", check_block="check: {tolerance: {float16: 0.02}}")
    assert check.tolerance(cell) == (0.02, pytest.approx(0.06))


def test_the_default_granule_is_one_token():
    odd = _cell(seqlen=8193, check_block="check: {max_seqlen: 8191}")
    assert check.check_length(odd) == 8191
    assert check.check_length(_cell(seqlen=8192), 3000) == 8192  # a cell at the check length keeps it
