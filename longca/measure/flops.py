"""FLOPs from the exact attended area (docs/measurement.md): never from S^2 or S^2/2 conventions."""

from __future__ import annotations

from longca.vocab import PASS_FLOP_FACTOR


def attention_flops(area: float, heads_q: int, head_dim: int, pass_: str, head_dim_v: int | None = None) -> float:
    """Softmax attention FLOPs of one call.

    area: attended (q, k) pairs of ONE head summed over the batch (mean over heads for per-head
    masks). Forward = 2 * area * Hq * (D + Dv) (QK^T and PV); backward = 2.5 x forward
    (2 for the gradients, 0.5 for recomputation); fwd_bwd = 3.5 x. KV heads never count: GQA does
    not reduce attention FLOPs.
    """
    dv = head_dim if head_dim_v is None else head_dim_v
    if pass_ not in PASS_FLOP_FACTOR:
        raise ValueError(f"unknown pass {pass_!r}; allowed: {sorted(PASS_FLOP_FACTOR)}")
    return 2.0 * area * heads_q * (head_dim + dv) * PASS_FLOP_FACTOR[pass_]
