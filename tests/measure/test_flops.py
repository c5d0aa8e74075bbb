from longca.masks.registry import build_mask
from longca.measure.flops import attention_flops


def test_forward_flops_count_query_heads_only():
    # 4 * area * Hq * D; the KV head count never enters.
    assert attention_flops(1000, 8, 128, "fwd") == 4 * 1000 * 8 * 128


def test_backward_and_step_factors():
    f = attention_flops(10, 2, 64, "fwd")
    assert attention_flops(10, 2, 64, "bwd") == 2.5 * f
    assert attention_flops(10, 2, 64, "fwd_bwd") == 3.5 * f


def test_distinct_value_head_dim():
    assert attention_flops(10, 1, 64, "fwd", head_dim_v=128) == 2 * 10 * (64 + 128)


def test_exact_causal_area_not_half_square():
    m = build_mask("causal", 1001)
    assert m.area == 1001 * 1002 // 2
    assert attention_flops(m.area, 1, 8, "fwd") == 4 * 1001 * 1002 // 2 * 8


def test_an_unknown_pass_names_the_allowed_ones():
    import pytest

    from longca.measure.flops import attention_flops
    from longca.vocab import PASS_FLOP_FACTOR

    with pytest.raises(ValueError) as err:
        attention_flops(10.0, 1, 8, "sideways")
    assert str(err.value) == f"unknown pass 'sideways'; allowed: {sorted(PASS_FLOP_FACTOR)}"
