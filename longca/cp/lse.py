"""Combining partial attention results by log-sum-exp.

Each partial result is (out_i, lse_i) over a disjoint set of keys; the combined softmax output is
out = sum_i exp(lse_i - L) out_i with L = log(sum_i exp(lse_i)). Rows with no key anywhere keep
lse = -inf and out = 0 (no NaN). Shapes: out (B, H, S, D), lse (B, H, S).
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple, Sequence

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


# ------------------------------------------------------------------------------ deferred combination
class Part(NamedTuple):
    """A partial result of query rows [q0, q1) over a disjoint set of keys: out (B, H, q1 - q0, Dv)
    in the kernel's own dtype (bf16 stays bf16), lse (B, H, q1 - q0) in float32 / float64."""

    out: torch.Tensor
    lse: torch.Tensor
    q0: int
    q1: int


# A ring step's parts wait until the end (read once, in their own dtype, by one pass per row
# segment); past this many they are folded into one float32 part so memory stays bounded.
MAX_PENDING_PARTS = 4


def parts_of(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sub: Any) -> list[Part]:
    """A local kernel's result as parts: `fwd_parts` where the kernel has it, else its `fwd`
    (full rows, already combined) as one part."""
    if hasattr(kernel, "fwd_parts"):
        return kernel.fwd_parts(q, k, v, sub)
    out, lse = kernel.fwd(q, k, v, sub)
    return [Part(out, lse, 0, q.shape[2])]


def _segment_into(out: torch.Tensor, lse: torch.Tensor, outs: list[torch.Tensor], lses: list[torch.Tensor]) -> None:
    """out/lse (views of one row segment) <- the combination of the parts covering it: computed in
    lse's dtype, written once in out's."""
    acc = lse.dtype
    total_lse = lses[0].to(acc)
    for l_i in lses[1:]:
        total_lse = torch.logaddexp(total_lse, l_i.to(acc))
    finite = torch.isfinite(total_lse)
    safe = torch.where(finite, total_lse, 0.0)
    total = None
    for o_i, l_i in zip(outs, lses):
        w = torch.where(finite, torch.exp(l_i.to(acc) - safe), 0.0).unsqueeze(-1)
        t = torch.where(w > 0, o_i.to(acc) * w, 0.0)  # a part without keys on a row adds 0, even NaN
        total = t if total is None else total + t
    out.copy_(total)
    lse.copy_(total_lse)


_fused_segment = None  # torch.compile(_segment_into) once per process, on CUDA only; False after it failed


def _segment(out, lse, outs, lses) -> None:
    global _fused_segment
    if out.is_cuda and _fused_segment is not False:
        try:
            if _fused_segment is None:
                from longca.kernels.adapters.flex import raise_recompile_limits

                raise_recompile_limits()
                _fused_segment = torch.compile(_segment_into, dynamic=True)
            _fused_segment(out, lse, outs, lses)
            return
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  a compiler failure must not cost the cell
            warnings.warn(f"compiled LSE combination failed ({type(exc).__name__}: {str(exc)[:200]}); combining eagerly")
            _fused_segment = False
    _segment_into(out, lse, outs, lses)


def combine_parts(parts: Sequence[Part], shape: tuple[int, int, int, int], out_dtype: torch.dtype,
                  acc_dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, S, Dv) in out_dtype, lse (B, H, S) in acc_dtype) from parts over row ranges.

    Rows are cut where any part starts or ends; each segment is one pass that reads every part
    covering it once and writes the output once (compiled on CUDA; a row whose parts all have
    lse = -inf gets out = 0 whatever a kernel left there). Rows
    no part covers get out = 0 and lse = -inf. One part covering all rows in the wanted dtypes is
    returned as it is. Against merging each step into a float32 accumulator, a zigzag ring step
    over half the rows at 2 ranks moves about a seventh of the bytes (notes/cp.md).
    """
    b, h, rows, dv = shape
    if len(parts) == 1 and (parts[0].q0, parts[0].q1) == (0, rows):
        return parts[0].out.to(out_dtype), parts[0].lse.to(acc_dtype)
    out = torch.empty(b, h, rows, dv, dtype=out_dtype, device=device)
    lse = torch.empty(b, h, rows, dtype=acc_dtype, device=device)
    cuts = sorted({0, rows, *(p.q0 for p in parts), *(p.q1 for p in parts)})
    for a, z in zip(cuts, cuts[1:]):
        cover = [p for p in parts if p.q0 <= a and z <= p.q1]
        if not cover:
            out[:, :, a:z].zero_()
            lse[:, :, a:z].fill_(float("-inf"))
            continue
        _segment(out[:, :, a:z], lse[:, :, a:z], [p.out[:, :, a - p.q0:z - p.q0] for p in cover],
                 [p.lse[:, :, a - p.q0:z - p.q0] for p in cover])
    return out, lse


def fold(parts: list[Part], shape: tuple[int, int, int, int], acc_dtype: torch.dtype,
         device: torch.device) -> list[Part]:
    """Parts folded into one full-row part in acc_dtype once more than MAX_PENDING_PARTS wait."""
    if len(parts) <= MAX_PENDING_PARTS:
        return parts
    out, lse = combine_parts(parts, shape, acc_dtype, acc_dtype, device)
    return [Part(out, lse, 0, shape[2])]
