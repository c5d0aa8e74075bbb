"""Combining partial attention results by log-sum-exp.

Each partial result is (out_i, lse_i) over a disjoint set of keys; the combined softmax output is
out = sum_i exp(lse_i - L) out_i with L = log(sum_i exp(lse_i)). Rows with no key anywhere keep
lse = -inf and out = 0 (no NaN). Shapes: out (B, H, S, D), lse (B, H, S).
"""

from __future__ import annotations

import warnings

import torch


def _merge_into(out: torch.Tensor, lse: torch.Tensor, out_i: torch.Tensor, lse_i: torch.Tensor) -> None:
    lse_i = lse_i.to(lse.dtype)
    new = torch.logaddexp(lse, lse_i)
    finite = torch.isfinite(new)
    safe = torch.where(finite, new, 0.0)
    w_old = torch.where(finite, torch.exp(lse - safe), 0.0).unsqueeze(-1)
    w_new = torch.where(finite, torch.exp(lse_i - safe), 0.0).unsqueeze(-1)
    out.copy_(out * w_old + out_i.to(out.dtype) * w_new)
    lse.copy_(new)


_fused = None  # torch.compile(_merge_into) once per process, on CUDA only; False after it failed


def _fused_merge():
    global _fused
    if _fused is None:
        from longca.kernels.adapters.flex import raise_recompile_limits

        raise_recompile_limits()  # every CP shape and slice view is a new guard set
        _fused = torch.compile(_merge_into, dynamic=True)
    return _fused


def merge_(out: torch.Tensor, lse: torch.Tensor, out_i: torch.Tensor, lse_i: torch.Tensor,
           fused: bool | None = None) -> None:
    """In place: (out, lse) <- combination of (out, lse) and (out_i, lse_i). out/lse are float32+.

    On CUDA (or with fused=True) the merge is one compiled kernel: read out and out_i, write out.
    Eager it is about a dozen elementwise passes over (B, H, S, D) float32 tensors; at 32K tokens
    and 64 heads per GPU that is ~9 GiB of memory traffic per merge, a few percent of a ring step.
    """
    global _fused
    if (fused if fused is not None else out.is_cuda) and _fused is not False:
        try:
            _fused_merge()(out, lse, out_i, lse_i)
            return
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  a compiler failure must not cost the cell
            warnings.warn(f"compiled LSE merge failed ({type(exc).__name__}: {str(exc)[:200]}); merging eagerly")
            _fused = False
    _merge_into(out, lse, out_i, lse_i)


def combine(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine a list of (out_i, lse_i) into (out, lse) in float32 (or float64 if given)."""
    if not parts:
        raise ValueError("combine needs at least one partial result")
    acc_dtype = torch.promote_types(parts[0][0].dtype, torch.float32)
    out = torch.zeros_like(parts[0][0], dtype=acc_dtype)
    lse = torch.full_like(parts[0][1], float("-inf"), dtype=acc_dtype)
    for o, l in parts:
        merge_(out, lse, o, l)
    return out, lse
