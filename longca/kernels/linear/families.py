"""The linear-attention families as data: their extra inputs and references.

Linear-attention kernels need inputs softmax attention has not: log-space decay gates and (for
the delta rule) a write strength beta. A benchmark cell only provides q, k, v, so the adapter
draws these from a seeded generator when it prepares the cell (outside the timed region), and the
reference uses the very same tensors. Gates are float32, beta has the
inputs' dtype; none carries a gradient (the runner asks for
dq, dk, dv only) and are drawn so that the recurrent state matters across many chunks:

- log decay  g = logsigmoid(6 + z), z ~ N(0, 1): per-step decay exp(g) = sigmoid(6 + z), median
  0.9975, 1st percentile 0.975 (a memory of hundreds of tokens: the state crosses chunk boundaries);
- beta = sigmoid(z), z ~ N(0, 1), in (0, 1).

Gated DeltaNet L2-normalises q and k inside the kernel (fla's ``use_qk_l2norm_in_kernel=True``,
as in the published models): without it the delta rule with raw N(0, 1) keys (|k|^2 ~ K) is
unstable. The reference applies the same normalisation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from longca.kernels.linear import reference as ref

GATE_SEED = 0x11A7  # fixed: the same (family, shape) always gets the same gates
GATE_SHIFT = 6.0


@dataclass(frozen=True)
class LinearFamily:
    name: str  # linear_attn | simple_gla | gla | gated_deltanet
    gate: str | None  # None | "head" (B, T, H) | "key" (B, T, H, K)
    beta: bool  # needs a write strength beta (B, T, H)
    reference_chunk: Callable[..., torch.Tensor]
    reference_recurrent: Callable[..., torch.Tensor]
    description: str


def _gla_kw(extra: dict) -> dict:
    if "gk" in extra:
        return {"gk": extra["gk"]}
    if "g" in extra:
        return {"g": extra["g"]}
    return {}


def _gla_chunk(q, k, v, extra, cu_seqlens):
    return ref.gla_chunk(q, k, v, cu_seqlens=cu_seqlens, **_gla_kw(extra))


def _gla_recurrent(q, k, v, extra, cu_seqlens):
    return ref.gla_recurrent(q, k, v, cu_seqlens=cu_seqlens, **_gla_kw(extra))


def _delta_chunk(q, k, v, extra, cu_seqlens):
    return ref.delta_rule_chunk(q, k, v, g=extra["g"], beta=extra["beta"], qk_l2norm=True, cu_seqlens=cu_seqlens)


def _delta_recurrent(q, k, v, extra, cu_seqlens):
    return ref.delta_rule_recurrent(q, k, v, g=extra["g"], beta=extra["beta"], qk_l2norm=True, cu_seqlens=cu_seqlens)


FAMILIES: dict[str, LinearFamily] = {
    f.name: f
    for f in (
        LinearFamily(
            "linear_attn",
            None,
            False,
            _gla_chunk,
            _gla_recurrent,
            "causal linear attention without feature map or normaliser: o_t = sum_{s<=t} (q_t.k_s) v_s",
        ),
        LinearFamily(
            "simple_gla",
            "head",
            False,
            _gla_chunk,
            _gla_recurrent,
            "gated linear attention with one data-dependent decay per head and token",
        ),
        LinearFamily(
            "gla",
            "key",
            False,
            _gla_chunk,
            _gla_recurrent,
            "gated linear attention with a decay per key dimension (Yang et al. 2024)",
        ),
        LinearFamily(
            "gated_deltanet",
            "head",
            True,
            _delta_chunk,
            _delta_recurrent,
            "gated delta rule (Yang et al. 2025), q and k L2-normalised",
        ),
    )
}


def make_extra(
    family: LinearFamily,
    *,
    batch: int,
    tokens: int,
    heads: int,
    head_dim: int,
    device: torch.device | str,
    beta_dtype: torch.dtype = torch.float32,
    seed: int = GATE_SEED,
) -> dict[str, torch.Tensor]:
    """The family's extra inputs for (batch, tokens, heads), drawn on ``device`` from a seeded
    generator (so no large host tensor is made), without gradient. Gates are float32 (fla
    accumulates them in float32); beta is cast to ``beta_dtype`` (the models' beta has the
    activations' dtype), and the reference reads the cast values."""
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    extra: dict[str, torch.Tensor] = {}
    if family.gate == "head":
        extra["g"] = F.logsigmoid(normal(batch, tokens, heads) + GATE_SHIFT)
    elif family.gate == "key":
        extra["gk"] = F.logsigmoid(normal(batch, tokens, heads, head_dim) + GATE_SHIFT)
    if family.beta:
        extra["beta"] = torch.sigmoid(normal(batch, tokens, heads)).to(beta_dtype)
    return extra
