"""Pure PyTorch references for the linear-attention families, in float64.

Two forms per family, both differentiable through autograd:

- ``*_recurrent``: the exact step-by-step recurrence, one token at a time. This is the ground
  truth; it is slow (a Python loop over tokens), so it serves tests and small checks.
- ``*_chunk``: the chunked (block-parallel) form of the same recurrence, which fla's kernels also
  use. It is equal to the recurrent form in exact arithmetic; the tests check that it matches the
  recurrent form to ~1e-12 in float64, after which it is the reference the runner uses at check
  lengths (it is O(T * C) work per head instead of T Python steps).

Layout is fla's "bshd": (batch, tokens, heads, dim). With ``cu_seqlens`` the batch is 1 and the
tokens are packed documents; the state is reset at each document start (causal within documents,
nothing across them), which is the ``causal_document`` mask.

Families (per head; state S is K x V; ``scale`` multiplies q; all gates are log-space):

- linear attention:  S_t = S_{t-1} + k_t v_t^T;                        o_t = S_t^T q_t
- simple GLA:        S_t = exp(g_t) S_{t-1} + k_t v_t^T,  g_t scalar per head
- GLA:               S_t = diag(exp(gk_t)) S_{t-1} + k_t v_t^T,  gk_t in R^K
- gated DeltaNet:    S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,  b_t = beta in (0, 1)

(Linear attention is GLA with gk = 0; simple GLA is GLA with gk broadcast over K.)
Inputs of any dtype are promoted to float64; the result is float64.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

F64 = torch.float64
# fla's l2norm: x / sqrt(sum(x^2) + eps); gated DeltaNet normalises q and k this way in the kernel.
L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """Row-wise L2 normalisation over the last dim, exactly as fla's l2norm_fwd."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _segments(total: int, cu_seqlens: torch.Tensor | None) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    cu = [int(c) for c in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] != total or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to {total}, got {cu[:4]}...{cu[-2:]}")
    return [(a, b) for a, b in zip(cu, cu[1:]) if b > a]


def per_document(
    fn: Callable[..., torch.Tensor], tensors: dict[str, torch.Tensor | None], cu_seqlens: torch.Tensor | None, **kw
) -> torch.Tensor:
    """Run ``fn`` on each document (a slice of the token dim, dim 1) and concatenate the outputs."""
    q = tensors["q"]
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(f"with cu_seqlens the batch must be 1 (packed documents), got {q.shape[0]}")
    outs = []
    for a, b in _segments(q.shape[1], cu_seqlens):
        part = {n: (None if t is None else t[:, a:b]) for n, t in tensors.items()}
        outs.append(fn(**part, **kw))
    return torch.cat(outs, dim=1)


# ---------------------------------------------------------------------------------------------
# GLA family (linear attention, simple GLA, GLA): recurrent and chunked
# ---------------------------------------------------------------------------------------------


def _gk_full(q: torch.Tensor, g: torch.Tensor | None, gk: torch.Tensor | None) -> torch.Tensor | None:
    if g is not None and gk is not None:
        raise ValueError("give either g (per head) or gk (per key dim), not both")
    if g is not None:
        return g.to(F64).unsqueeze(-1).expand(*q.shape[:3], q.shape[-1])
    return None if gk is None else gk.to(F64)


def _gla_recurrent_one(q, k, v, gk, scale):
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        if gk is not None:
            S = S * gk[:, t].exp().unsqueeze(-1)
        S = S + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(outs, dim=1)


def gla_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact recurrence for linear attention (no gate), simple GLA (g: (B, T, H)) or GLA
    (gk: (B, T, H, K)). q, k: (B, T, H, K); v: (B, T, H, V). Returns (B, T, H, V) float64."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = (x.to(F64) for x in (q, k, v))
    return per_document(_gla_recurrent_one, dict(q=q, k=k, v=v, gk=_gk_full(q, g, gk)), cu_seqlens, scale=scale)


def _pad_to(x: torch.Tensor | None, n: int) -> torch.Tensor | None:
    if x is None or x.shape[1] == n:
        return x
    pad = x.new_zeros(x.shape[0], n - x.shape[1], *x.shape[2:])
    return torch.cat([x, pad], dim=1)


def _chunks(x: torch.Tensor, C: int) -> torch.Tensor:
    """(B, N*C, H, ...) -> (B, H, N, C, ...)"""
    B, T, H = x.shape[:3]
    return x.reshape(B, T // C, C, H, *x.shape[3:]).movedim(3, 1)


def _unchunk(x: torch.Tensor) -> torch.Tensor:
    """(B, H, N, C, V) -> (B, N*C, H, V)"""
    B, H, N, C, V = x.shape
    return x.movedim(1, 3).reshape(B, N * C, H, V)


# float64 overflows at exp(709): the factorised intra-chunk form needs |cumulative log gate| below it.
MAX_CHUNK_LOG_DECAY = 600.0


def _gla_chunk_one(q, k, v, gk, scale, chunk):
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk
    Tp = -(-T // C) * C  # zero padding at the end changes no earlier output
    q, k, v, gk = (_pad_to(x, Tp) for x in (q * scale, k, v, gk))
    q, k, v = _chunks(q, C), _chunks(k, C), _chunks(v, C)  # (B, H, N, C, .)
    N = Tp // C
    if gk is None:
        b = q.new_zeros(B, H, N, C, K)
    else:
        b = _chunks(gk, C).cumsum(3)  # cumulative log decay inside each chunk, per key dim
        if b.numel() and float(b.min()) < -MAX_CHUNK_LOG_DECAY:
            raise ValueError("cumulative log gate inside a chunk below -600: use gla_recurrent or a smaller chunk")
    qg = q * b.exp()  # q_t * exp(b_t)
    kg = k * (-b).exp()  # k_s * exp(-b_s): (q_t exp(b_t)) . (k_s exp(-b_s)) = sum q k exp(b_t - b_s)
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    A = (qg @ kg.transpose(-1, -2)).masked_fill(~causal, 0.0)
    o = A @ v  # intra-chunk part
    b_last = b[:, :, :, -1:, :]  # (B, H, N, 1, K)
    k_to_end = k * (b_last - b).exp()  # decay from step s to the chunk end
    S = q.new_zeros(B, H, K, V)
    inter = []
    for n in range(N):  # sequential over chunks: state at each chunk start
        inter.append(qg[:, :, n] @ S)
        S = b_last[:, :, n, 0].exp().unsqueeze(-1) * S + k_to_end[:, :, n].transpose(-1, -2) @ v[:, :, n]
    o = o + torch.stack(inter, dim=2)
    return _unchunk(o)[:, :T]


def gla_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    scale: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    chunk: int = 64,
) -> torch.Tensor:
    """Chunked form of gla_recurrent (same arguments): intra-chunk C x C products plus an
    inter-chunk K x V state carried across chunks."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    q, k, v = (x.to(F64) for x in (q, k, v))
    return per_document(
        _gla_chunk_one, dict(q=q, k=k, v=v, gk=_gk_full(q, g, gk)), cu_seqlens, scale=scale, chunk=chunk
    )


# ---------------------------------------------------------------------------------------------
# Gated delta rule (gated DeltaNet): recurrent and chunked (WY / UT-transform form)
# ---------------------------------------------------------------------------------------------


def _delta_recurrent_one(q, k, v, g, beta, scale):
    B, T, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1])
    outs = []
    for t in range(T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        u = beta[:, t].unsqueeze(-1) * (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, S))
        S = S + kt.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(outs, dim=1)


def _delta_inputs(q, k, v, g, beta, qk_l2norm):
    q, k, v, g, beta = (x.to(F64) for x in (q, k, v, g, beta))
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def delta_rule_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    qk_l2norm: bool = True,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact gated delta rule. g, beta: (B, T, H) (log decay, and beta in (0, 1)). With
    ``qk_l2norm`` q and k are L2-normalised first, as fla's ``use_qk_l2norm_in_kernel=True``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return per_document(_delta_recurrent_one, _delta_inputs(q, k, v, g, beta, qk_l2norm), cu_seqlens, scale=scale)


def _delta_chunk_one(q, k, v, g, beta, scale, chunk):
    B, T, H, K = q.shape
    V = v.shape[-1]
    C = chunk
    Tp = -(-T // C) * C
    q, k, v, g, beta = (_pad_to(x, Tp) for x in (q * scale, k, v, g, beta))
    q, k, v = _chunks(q, C), _chunks(k, C), _chunks(v, C)  # (B, H, N, C, .)
    g, beta = _chunks(g, C), _chunks(beta, C)  # (B, H, N, C)
    N = Tp // C
    b = g.cumsum(-1)  # log of gamma_t = prod of decays from the chunk start to t
    diff = b.unsqueeze(-1) - b.unsqueeze(-2)  # b_t - b_s
    lower_incl = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    lower_strict = lower_incl.tril(-1)
    decay = diff.masked_fill(~lower_incl, float("-inf")).exp()  # gamma_t / gamma_s for s <= t, else 0
    # u_s = beta_s (v_s - gamma_s S0^T k_s - sum_{r<s} gamma_s/gamma_r (k_s . k_r) u_r)
    # => (I + M) U = beta V - (beta gamma K) S0 with M_sr = beta_s gamma_s/gamma_r k_s.k_r (r < s)
    M = (beta.unsqueeze(-1) * decay * (k @ k.transpose(-1, -2))).masked_fill(~lower_strict, 0.0)
    eye = torch.eye(C, dtype=q.dtype, device=q.device)
    lhs = eye + M
    U0 = torch.linalg.solve_triangular(lhs, beta.unsqueeze(-1) * v, upper=False, unitriangular=True)
    W = torch.linalg.solve_triangular(lhs, (beta * b.exp()).unsqueeze(-1) * k, upper=False, unitriangular=True)
    A = (q @ k.transpose(-1, -2)) * decay  # (q_t . k_s) gamma_t / gamma_s, s <= t
    qg = q * b.exp().unsqueeze(-1)
    k_to_end = k * (b[..., -1:] - b).exp().unsqueeze(-1)
    S = q.new_zeros(B, H, K, V)
    outs = []
    for n in range(N):
        U = U0[:, :, n] - W[:, :, n] @ S
        outs.append(qg[:, :, n] @ S + A[:, :, n] @ U)
        S = b[:, :, n, -1].exp()[..., None, None] * S + k_to_end[:, :, n].transpose(-1, -2) @ U
    return _unchunk(torch.stack(outs, dim=2))[:, :T]


def delta_rule_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    qk_l2norm: bool = True,
    cu_seqlens: torch.Tensor | None = None,
    chunk: int = 64,
) -> torch.Tensor:
    """Chunked (WY representation) form of delta_rule_recurrent (same arguments)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return per_document(
        _delta_chunk_one, _delta_inputs(q, k, v, g, beta, qk_l2norm), cu_seqlens, scale=scale, chunk=chunk
    )
