"""The chunked float64 references equal the exact recurrences (outputs and gradients), and the
recurrences behave as their definitions say (documents are independent, gates decay the state)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from longca.kernels.linear import reference as ref

B, T, H, K, V = 2, 100, 2, 8, 6  # T not a multiple of the chunk: the padded tail is exercised


def _inputs(seed: int = 0, batch: int = B, tokens: int = T):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    q, k, v = r(batch, tokens, H, K), r(batch, tokens, H, K), r(batch, tokens, H, V)
    gate = F.logsigmoid(r(batch, tokens, H) + 2.0)
    gk = F.logsigmoid(r(batch, tokens, H, K) + 2.0)
    beta = torch.sigmoid(r(batch, tokens, H))
    return q, k, v, gate, gk, beta


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


GLA_CASES = {"linear_attn": lambda g, gk: {}, "simple_gla": lambda g, gk: {"g": g}, "gla": lambda g, gk: {"gk": gk}}


@pytest.mark.parametrize("family", sorted(GLA_CASES))
@pytest.mark.parametrize("chunk", [16, 64])
def test_gla_chunk_matches_recurrence(family: str, chunk: int) -> None:
    q, k, v, g, gk, _ = _inputs()
    kw = GLA_CASES[family](g, gk)
    assert _rel(ref.gla_chunk(q, k, v, chunk=chunk, **kw), ref.gla_recurrent(q, k, v, **kw)) < 1e-12


@pytest.mark.parametrize("chunk", [16, 64])
def test_delta_rule_chunk_matches_recurrence(chunk: int) -> None:
    q, k, v, g, _, beta = _inputs()
    a = ref.delta_rule_chunk(q, k, v, g=g, beta=beta, chunk=chunk)
    assert _rel(a, ref.delta_rule_recurrent(q, k, v, g=g, beta=beta)) < 1e-12


def test_gradients_of_chunk_forms_match_recurrences() -> None:
    q, k, v, g, gk, beta = _inputs(1, batch=1, tokens=70)
    do = torch.randn_like(v)
    forms = [
        (lambda q, k, v: ref.gla_chunk(q, k, v, gk=gk, chunk=16), lambda q, k, v: ref.gla_recurrent(q, k, v, gk=gk)),
        (
            lambda q, k, v: ref.delta_rule_chunk(q, k, v, g=g, beta=beta, chunk=16),
            lambda q, k, v: ref.delta_rule_recurrent(q, k, v, g=g, beta=beta),
        ),
    ]
    for chunked, recurrent in forms:
        grads = []
        for fn in (chunked, recurrent):
            xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
            fn(*xs).backward(do)
            grads.append([x.grad for x in xs])
        for a, b in zip(*grads):
            assert _rel(a, b) < 1e-10


def test_linear_attention_recurrence_is_masked_qk_product() -> None:
    """Without gates the recurrence is (Q K^T * scale, lower triangle) V: the defining formula."""
    q, k, v, *_ = _inputs(2)
    scale = 0.3
    scores = torch.einsum("bthk,bshk->bhts", q, k) * scale
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    expect = torch.einsum("bhts,bshv->bthv", scores.masked_fill(~causal, 0.0), v)
    assert _rel(ref.gla_recurrent(q, k, v, scale=scale), expect) < 1e-12


def test_simple_gla_equals_gla_with_gate_broadcast_over_keys() -> None:
    q, k, v, g, *_ = _inputs(3)
    a = ref.gla_recurrent(q, k, v, g=g)
    b = ref.gla_recurrent(q, k, v, gk=g.unsqueeze(-1).expand(B, T, H, K))
    assert _rel(a, b) < 1e-14
    assert _rel(a, ref.gla_recurrent(q, k, v)) > 1e-2  # the gate does change the result


def test_delta_rule_with_zero_decay_and_unit_beta_overwrites_memory() -> None:
    """beta = 1 with a unit key writes v exactly: reading with that key gives v back (the delta rule)."""
    q, k, v, _, _, _ = _inputs(4, batch=1, tokens=5)
    k = k / k.norm(dim=-1, keepdim=True)  # exactly unit keys
    zeros, ones = torch.zeros(1, 5, H), torch.ones(1, 5, H, dtype=torch.float64)
    out = ref.delta_rule_recurrent(k, k, v, g=zeros.double(), beta=ones, scale=1.0, qk_l2norm=False)
    assert _rel(out[:, -1], v[:, -1]) < 1e-12


@pytest.mark.parametrize("which", ["gla", "delta"])
def test_documents_are_independent(which: str) -> None:
    """With cu_seqlens each document equals the same computation run on it alone."""
    q, k, v, g, gk, beta = _inputs(5, batch=1)
    cu = torch.tensor([0, 37, 64, 65, T])
    if which == "gla":
        run = lambda q, k, v, g, gk, beta, cu=None: ref.gla_chunk(q, k, v, gk=gk, chunk=16, cu_seqlens=cu)  # noqa: E731
    else:
        run = lambda q, k, v, g, gk, beta, cu=None: ref.delta_rule_chunk(  # noqa: E731
            q, k, v, g=g, beta=beta, chunk=16, cu_seqlens=cu
        )
    packed = run(q, k, v, g, gk, beta, cu)
    for a, b in zip(cu.tolist(), cu.tolist()[1:]):
        alone = run(*(x[:, a:b] for x in (q, k, v, g, gk, beta)))
        assert _rel(packed[:, a:b], alone) < 1e-12
    # and it is not the single-sequence result
    assert _rel(packed, run(q, k, v, g, gk, beta)) > 1e-3


def test_chunk_form_refuses_gates_beyond_float64_range() -> None:
    q, k, v, *_ = _inputs(6, batch=1, tokens=64)
    gk = torch.full((1, 64, H, K), -20.0, dtype=torch.float64)
    with pytest.raises(ValueError, match="cumulative log gate"):
        ref.gla_chunk(q, k, v, gk=gk, chunk=64)


def test_bad_cu_seqlens_rejected() -> None:
    q, k, v, *_ = _inputs(7, batch=1)
    with pytest.raises(ValueError):
        ref.gla_recurrent(q, k, v, cu_seqlens=torch.tensor([0, 10, 5, T]))
