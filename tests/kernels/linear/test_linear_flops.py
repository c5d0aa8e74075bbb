"""The FLOP models count what the chunked algorithm multiplies: checked against torch's FLOP
counter run over the chunked float64 references (which perform the same matrix products)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from longca.kernels.linear import MODELS, linear_flops
from longca.kernels.linear import reference as ref

B, T, H, K, V, C = 1, 256, 2, 32, 16, 64  # T a multiple of C: the reference pads nothing


def _counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("model", ["linear_attn_chunk_v1", "linear_simple_gla_chunk_v1", "linear_gla_chunk_v1"])
def test_gla_family_forward_equals_counted_matmuls(model: str) -> None:
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    gk = torch.full((B, T, H, K), -0.01)
    counted = _counted(lambda: ref.gla_chunk(q, k, v, gk=gk, chunk=C))
    assert counted == linear_flops(model, tokens=B * T, heads_q=H, head_dim=K, head_dim_v=V, chunk=C)


def test_gated_deltanet_forward_equals_counted_matmuls_plus_triangular_solves() -> None:
    """The reference gets W and U from two triangular solves, which the counter does not see; the
    model counts them as T (beta K), T (beta V) products plus the (2/3) C^3 of forming T."""
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, V)
    g, beta = torch.full((B, T, H), -0.01), torch.rand(B, T, H)
    counted = _counted(lambda: ref.delta_rule_chunk(q, k, v, g=g, beta=beta, chunk=C))
    chunks = B * H * T // C
    solves = chunks * (2 * C * C * K + 2 * C * C * V + 2 * C**3 / 3)
    model = linear_flops("linear_gated_deltanet_chunk_v1", tokens=B * T, heads_q=H, head_dim=K, head_dim_v=V, chunk=C)
    assert counted + solves == pytest.approx(model, rel=1e-12)


@pytest.mark.parametrize("model", sorted(m for m in MODELS if m != "linear_delta_recurrent_v1"))
def test_passes_add_up_and_scale_with_tokens_and_heads(model: str) -> None:
    f = lambda p, t=4096, h=8: linear_flops(model, tokens=t, heads_q=h, head_dim=128, pass_=p)  # noqa: E731
    assert f("fwd_bwd") == pytest.approx(f("fwd") + f("bwd"))
    assert 2 * f("fwd") < f("bwd") < 3 * f("fwd")  # two gradient products per forward one, plus recomputation
    assert f("fwd", t=8192) == pytest.approx(2 * f("fwd"))  # linear in length: no S^2 term
    assert f("fwd", h=16) == pytest.approx(2 * f("fwd"))


def test_recurrent_models_count_the_products_with_the_state_per_token() -> None:
    """One step per token: the GLA family updates the K x V state and reads it (4KV), the delta rule
    also reads it with k (6KV); the GLA family's backward (fla's fused_recurrent_bwd) rebuilds the
    state for dq and runs dS, dk, dv in reverse (10KV). No chunk term: the chunk size does not enter."""
    f = lambda m, p="fwd", c=64: linear_flops(m, tokens=100, heads_q=2, head_dim=32, head_dim_v=16, pass_=p, chunk=c)  # noqa: E731
    assert f("linear_recurrent_v1") == 100 * 2 * 4 * 32 * 16 == f("linear_recurrent_v1", c=16)
    assert f("linear_recurrent_v1", "bwd") == 100 * 2 * 10 * 32 * 16
    assert f("linear_delta_recurrent_v1") == 100 * 2 * 6 * 32 * 16
    # fla has no backward for the recurrent delta rule, and the model defines none
    with pytest.raises(ValueError, match="linear_delta_recurrent_v1.*no pass 'bwd'"):
        f("linear_delta_recurrent_v1", "bwd")


def test_unknown_model_and_pass_rejected() -> None:
    with pytest.raises(KeyError):
        linear_flops("softmax_exact_area", tokens=1, heads_q=1, head_dim=64)
    with pytest.raises(ValueError):
        linear_flops("linear_attn_chunk_v1", tokens=1, heads_q=1, head_dim=64, pass_="both")
