"""FLOP models of the chunked and recurrent linear-attention algorithms (recorded in rows as ``flop_model``).

These are *models* of the work of the chunked algorithm that fla runs, not of softmax attention:
a linear-attention row's ``flops``/``tflops`` must never be compared with a softmax row's as if
they counted the same thing (tokens per second is the cross-family measure). Every model name
starts with ``linear_`` so a query can tell them apart from ``softmax_exact_area``.

Notation, per head and per sequence (document) of L tokens: K = head dim of q and k,
V = head dim of v, C = chunk size (fla: 64). A matrix product (m x n) @ (n x p) counts 2mnp.
Only matrix products are counted; elementwise work (gates, exponentials, masks, l2norm) is
lower order and left out. The last partial chunk is counted as its real length (no padding), so
every term is linear in L and the total depends only on the number of tokens:
flops = tokens x heads_q x per-token cost (documents or batch elements do not change it).
GQA does not reduce work: k and v are repeated to heads_q, as for softmax.

GLA family (linear attention, simple GLA, GLA; model names ``linear_attn_chunk_v1``,
``linear_simple_gla_chunk_v1``, ``linear_gla_chunk_v1``; one formula, the gates only differ in
elementwise work). Per chunk of C tokens:
  scores       A = Q K^T (masked to causal)      2 C^2 K
  intra output A V                               2 C^2 V
  inter output Q S (S: the K x V state)           2 C K V
  state        S += K^T V                        2 C K V
  forward  = 4 L K V + 2 L C (K + V)
  backward = 2 x forward (two gradient products per forward product)
             + recomputation in the backward pass: the states (2 L K V) and the scores (2 L C K)
           = 10 L K V + 4 L C (K + V) + 2 L C K

Gated DeltaNet (``linear_gated_deltanet_chunk_v1``; WY/UT form as in fla). Per chunk:
  K K^T (beta, decay)                  2 C^2 K
  triangular inverse of (I + M), C x C   (2/3) C^3  (C^3/3 multiply-adds)
  W = T (beta K), U = T (beta V)         2 C^2 K + 2 C^2 V
  new values U - W S                   2 C K V
  state  S += K^T U                      2 C K V
  output Q S + (Q K^T masked) U          2 C K V + 2 C^2 K + 2 C^2 V
  forward  = 6 L K V + 6 L C K + 4 L C V + (2/3) L C^2
  backward = 2 x forward + recomputation of W, U (2 L C K + 2 L C V) and of the states and
             new values (4 L K V)
           = 16 L K V + 14 L C K + 10 L C V + (4/3) L C^2

Recurrent forms (fla's ``fused_recurrent_*``: one step per token, the K x V state in registers,
no chunks; C does not enter). Per token, products with the state:
  GLA family (``linear_recurrent_v1``): state update k v^T 2KV, output S^T q 2KV: forward 4 K V;
    backward (fla's fused_recurrent_bwd: the state again with dq = S do, then in reverse
    dS += q do^T, dk = dS v, dv = dS^T k) 10 K V.
  Gated DeltaNet (``linear_delta_recurrent_v1``): S^T k 2KV, the rank-1 update 2KV, the output
    2KV: forward 6 K V. fla has no backward for it; the model defines none (asking for one is an
    error).

fwd_bwd = forward + backward. The models are versioned (``_v1``): a change of formula gets a new
name, so stored rows stay interpretable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

CHUNK = 64  # fla's chunk size for all four families (its default, which the adapters use)


@dataclass(frozen=True)
class FlopModel:
    name: str
    # per-token FLOPs for one head: (K, V, C) -> (forward, backward); backward None where the
    # algorithm has none
    per_token: Callable[[int, int, int], tuple[float, float | None]]
    description: str


def _gla(K: int, V: int, C: int) -> tuple[float, float]:
    fwd = 4.0 * K * V + 2.0 * C * (K + V)
    bwd = 2.0 * fwd + 2.0 * K * V + 2.0 * C * K
    return fwd, bwd


def _gated_deltanet(K: int, V: int, C: int) -> tuple[float, float]:
    fwd = 6.0 * K * V + 6.0 * C * K + 4.0 * C * V + (2.0 / 3.0) * C * C
    bwd = 2.0 * fwd + 2.0 * C * K + 2.0 * C * V + 4.0 * K * V
    return fwd, bwd


def _gla_recurrent(K: int, V: int, C: int) -> tuple[float, float]:
    return 4.0 * K * V, 10.0 * K * V


def _delta_recurrent(K: int, V: int, C: int) -> tuple[float, None]:
    return 6.0 * K * V, None


MODELS: dict[str, FlopModel] = {
    m.name: m
    for m in (
        FlopModel("linear_attn_chunk_v1", _gla, "chunked causal linear attention: 4LKV + 2LC(K+V) forward"),
        FlopModel("linear_simple_gla_chunk_v1", _gla, "chunked simple GLA (head-wise gate): as linear_attn_chunk_v1"),
        FlopModel("linear_gla_chunk_v1", _gla, "chunked GLA (key-wise gate): as linear_attn_chunk_v1"),
        FlopModel(
            "linear_gated_deltanet_chunk_v1",
            _gated_deltanet,
            "chunked gated delta rule (WY form): 6LKV + 6LCK + 4LCV + (2/3)LC^2 forward",
        ),
        FlopModel("linear_recurrent_v1", _gla_recurrent, "recurrent GLA family, one step per token: 4LKV forward"),
        FlopModel("linear_delta_recurrent_v1", _delta_recurrent, "recurrent gated delta rule: 6LKV forward only"),
    )
}


def linear_flops(
    model: str,
    *,
    tokens: int,
    heads_q: int,
    head_dim: int,
    head_dim_v: int | None = None,
    pass_: str = "fwd",
    chunk: int = CHUNK,
) -> float:
    """FLOPs of one timed iteration under ``model``. ``tokens`` is the total over the batch
    (batch x seqlen, or the packed length of a varlen batch)."""
    if model not in MODELS:
        raise KeyError(f"unknown linear FLOP model {model!r}; allowed: {sorted(MODELS)}")
    V = head_dim if head_dim_v is None else head_dim_v
    fwd, bwd = MODELS[model].per_token(head_dim, V, chunk)
    per_pass = {"fwd": fwd} if bwd is None else {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd + bwd}
    if pass_ not in per_pass:
        raise ValueError(f"model {model!r}: no pass {pass_!r}; allowed: {sorted(per_pass)}")
    return float(tokens) * heads_q * per_pass[pass_]
