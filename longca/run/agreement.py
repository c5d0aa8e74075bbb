"""Full-length agreement: a cell longer than its check length is also compared, at its own length and
on its own inputs, with a second kernel's output.

The correctness check runs at `check.max_seqlen` (a float32 reference of a 512K problem needs a
terabyte); what it cannot see is a kernel that is right at 8K and wrong at 512K (an index overflow,
a tile count, a mask form built wrong at that size). With `check.agree_with` (an ordered list of
kernels), every timed draw of such a cell first runs its own forward and the first listed kernel
that serves the cell (not itself; the same function family; its declared capabilities and this
machine allow it) on the same inputs and mask, and stores ||out - out_other|| / ||out_other||. A
difference above the dtype's output tolerance makes the row `incorrect`. A comparator that refuses
or fails at run time is passed over for the next; the reason is kept when none serves.

A dtype no comparator takes (fp8) is compared in bfloat16 on the same values: e4m3 numbers are
exact in bfloat16, so the comparator computes the same function on the same inputs.

A context-parallel cell gathers every rank's inputs and output to rank 0, which compares the
mechanism's output with a single-device kernel's on the whole sequence (the cell's own kernel
included: on one device it checks the mechanism); every rank gets the verdict
(longca.run.ranks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from longca.kernels import registry
from longca.kernels.base import DTYPES, Unsupported
from longca.masks.mask import Mask
from longca.measure.reference import relative_error
from longca.run.check import check_length, tolerance
from longca.spec.cells import Cell
from longca.vocab import Pass

AGREEMENT_COLUMNS = ("agree_kernel", "agree_rel_diff", "agree_reason")


def agreement_applies(cell: Cell) -> bool:
    """Whether the cell's rows carry a full-length comparison: the spec asks for one (`check.agree_with`;
    longca.spec.cells keeps it only in the check of cells it applies to) and the check ran shorter."""
    check = cell.check_dict
    return bool(check.get("enabled", True) and check.get("agree_with")) and check_length(cell) < cell.seqlen


def _comparator_cell(cell: Cell, name: str) -> Cell:
    """The cell as the comparator runs it: forward only, in the cell's dtype or bfloat16 for a
    one-byte dtype the comparator does not take (see the module's note)."""
    dtype = cell.dtype
    caps = registry.get(name).caps
    if dtype not in caps.dtypes and DTYPES[dtype].itemsize == 1:
        dtype = "bfloat16"
    return dataclasses.replace(cell, kernel=name, pass_=Pass.FWD.value, dtype=dtype)


def single_device(cell: Cell) -> Cell:
    """A CP cell as one device runs it: its comparators serve the whole sequence on rank 0."""
    return dataclasses.replace(cell, world_size=1, cp_mechanism=None, cp_degrees=(), cp_balance=None, cp_backend=None)


def candidates(cell: Cell, device: torch.device, exclude_self: bool = True) -> tuple[list[Cell], list[str]]:
    """The comparator cells that may serve `cell`, in the spec's order, and why the others cannot.
    `exclude_self=False` for a CP cell: its own kernel on one device checks the mechanism."""
    from longca.run.cell import planned_unsupported, runtime_unsupported

    family = registry.get(cell.kernel).caps.family
    usable, why = [], []
    for name in cell.check_dict.get("agree_with", []):
        if name == cell.kernel and exclude_self:
            continue
        if registry.get(name).caps.family != family:
            why.append(f"{name}: computes {registry.get(name).caps.family} attention, not {family}")
            continue
        other = _comparator_cell(cell, name)
        reason = planned_unsupported(other) or runtime_unsupported(other, device)
        if reason:
            why.append(f"{name}: {reason}")
        else:
            usable.append(other)
    return usable, why


def compare(
    cell: Cell,
    mask: Mask,
    inputs_bshd: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    own_output: Callable[[], torch.Tensor],
    device: torch.device,
    exclude_self: bool = True,
) -> dict[str, Any]:
    """The agreement columns of one draw, and `incorrect` (the reason) where it disagrees.

    `inputs_bshd`: the draw's q, k, v viewed as (B, S, H, D); `own_output()`: the timed kernel's
    output on them as (B, S, Hq, D).
    """
    from longca.run.cell import _from_bshd, _to_bshd, prepare_for

    usable, why = candidates(cell, device, exclude_self)
    if not usable:
        return {"agree_reason": "no second kernel serves this cell: " + ("; ".join(why) or "none listed")}
    with torch.no_grad():
        mine = own_output()
        for other in usable:
            kernel = registry.get(other.kernel)
            dtype = DTYPES[other.dtype]
            try:
                prepared, _ = prepare_for(other, kernel, mask, dtype, device, grad=False)
                args = [_from_bshd(x.to(dtype), prepared.layout) for x in inputs_bshd]
                theirs = _to_bshd(prepared.call(*args), prepared.layout, cell.batch)
                del args
            except (Unsupported, torch.OutOfMemoryError, RuntimeError, ValueError, TypeError) as exc:
                if "CUDA error" in str(exc) or "illegal memory access" in str(exc):
                    raise  # the context is unusable: the cell's handler restarts the process
                # a comparator's failure is not the timed kernel's: pass it over, keep why
                why.append(
                    f"{other.kernel}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                )
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            diff = relative_error(mine, theirs)
            del theirs
            if device.type == "cuda":
                torch.cuda.empty_cache()
            row: dict[str, Any] = {"agree_kernel": other.kernel, "agree_rel_diff": diff}
            limit = tolerance(cell)[0]
            if not diff <= limit:  # NaN never passes
                row["incorrect"] = (
                    f"disagrees with {other.kernel} at the full length S={cell.seqlen}: "
                    f"||out - out_{other.kernel}|| / ||out_{other.kernel}|| = {diff:.3g} above the "
                    f"{cell.dtype} output tolerance {limit:g}"
                )
            return row
    return {"agree_reason": "no second kernel served this cell: " + "; ".join(why)}
