"""Combining partial attention results by log-sum-exp.

Each partial result is (out_i, lse_i) over a disjoint set of keys; the combined softmax output is
out = sum_i exp(lse_i - L) out_i with L = log(sum_i exp(lse_i)). Rows with no key anywhere keep
lse = -inf and out = 0 (no NaN). Shapes: out (B, H, S, D), lse (B, H, S). Partial results are
`Part`s over row ranges, combined once (`combine_parts`): one pass per row segment, compiled on CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import NamedTuple

import torch

from longca.kernels.dynamo_limits import raise_recompile_limits


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


def _segment(out, lse, outs, lses, fused: bool | None = None) -> None:
    global _fused_segment
    if (fused if fused is not None else out.is_cuda) and _fused_segment is not False:
        try:
            if _fused_segment is None:
                raise_recompile_limits()
                _fused_segment = torch.compile(_segment_into, dynamic=True)
            _fused_segment(out, lse, outs, lses)
            return
        except torch.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001  a compiler failure must not cost the cell
            warnings.warn(
                f"compiled LSE combination failed ({type(exc).__name__}: {str(exc)[:200]}); combining eagerly",
                stacklevel=2,
            )
            _fused_segment = False
    _segment_into(out, lse, outs, lses)


def combine_parts(
    parts: Sequence[Part],
    shape: tuple[int, int, int, int],
    out_dtype: torch.dtype,
    acc_dtype: torch.dtype,
    device: torch.device,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, S, Dv) in out_dtype, lse (B, H, S) in acc_dtype) from parts over row ranges.

    Rows are cut where any part starts or ends. Each segment is one pass (compiled when `fused`,
    by default on CUDA) that reads every part covering it once and writes the output once; a row
    whose parts all have lse = -inf gets out = 0 whatever a kernel left there. Rows no part covers
    get out = 0 and lse = -inf. A single part over all rows is returned as it is (cast only if its
    dtypes differ). Against merging each step into a float32 accumulator, a zigzag ring forward at
    2 ranks moves about a sixth of the bytes (docs/cp.md).
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
        _segment(
            out[:, :, a:z],
            lse[:, :, a:z],
            [p.out[:, :, a - p.q0 : z - p.q0] for p in cover],
            [p.lse[:, :, a - p.q0 : z - p.q0] for p in cover],
            fused,
        )
    return out, lse


def fold(
    parts: list[Part], shape: tuple[int, int, int, int], acc_dtype: torch.dtype, device: torch.device
) -> list[Part]:
    """Parts folded into one full-row part in acc_dtype once more than MAX_PENDING_PARTS wait."""
    if len(parts) <= MAX_PENDING_PARTS:
        return parts
    out, lse = combine_parts(parts, shape, acc_dtype, acc_dtype, device)
    return [Part(out, lse, 0, shape[2])]


def combine(parts: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine full-row (out_i, lse_i) results into (out, lse) in float32 (float64 if given)."""
    if not parts:
        raise ValueError("combine needs at least one partial result")
    o0 = parts[0][0]
    acc = torch.promote_types(o0.dtype, torch.float32)
    b, h, rows, dv = o0.shape
    return combine_parts([Part(o, l_, 0, rows) for o, l_ in parts], (b, h, rows, dv), acc, acc, o0.device)
