"""Full-length agreement: a cell longer than its check length is also compared, at its own length and
on its own inputs, with a second kernel's output.

The correctness check runs at `check.max_seqlen` (a float32 reference of a 512K problem needs a
terabyte); what it cannot see is a kernel that is right at 8K and wrong at 512K (an index overflow,
a tile count, a mask form built wrong at that size). With `check.agree_with` (an ordered list of
kernels), every timed draw of such a cell is compared with the first listed kernel that serves the
cell (not itself; it computes the same function, `Capabilities.computes`; its declared capabilities
and this machine allow it)
on the same inputs and mask: ||out - out_other|| / ||out_other|| for every cell, and the same for
dQ, dK and dV on cells with a backward pass (the same upstream gradient on both sides), since what
such a cell times is the gradients: an index that overflows only in a long backward (a dQ of 2^32
elements at 512K tokens x 64 heads x 128) is seen by no forward. A difference above the dtype's
tolerance (the output's, or the gradients' `grad_factor` times looser) makes the row `incorrect`. A
comparator that refuses or fails at run time is passed over for the next; the reason is kept when
none serves. The single-device runner compares before timing, on the cell's own call at full
length (a backward cell's forward and backward, on the forward its retained timed backward calls
then reuse), and that call is the cell's warm-up (longca.run.cell).

Within one process, a comparator's full-length results on a draw are computed once and kept on the
host (`results_key`, a `ReferenceCache`) for every later cell of the same problem and draw: the
inputs and mask depend on the problem, the seed and the draw, never on the timed kernel, so the
8 kernels of a (mask, length, shape) share one comparator run per draw instead of 8. A timed
kernel that is itself a listed comparator leaves its own results there too, once they agreed with
their comparator: at 512K the first kernel's results serve every other kernel's agreement.
Cells are expanded problem by problem (longca.spec.cells.expand) so the kernels of one problem run
one after the other.

A dtype no comparator takes (fp8) is compared in bfloat16 on the same values: e4m3 numbers are
exact in bfloat16, so the comparator computes the same function on the same inputs.

A context-parallel cell gathers every rank's inputs and output (and, with a backward, upstream
gradient and gradients) to rank 0, which compares the mechanism's with a single-device kernel's on
the whole sequence (the cell's own kernel included: on one device it checks the mechanism); every
rank gets the verdict (longca.run.ranks).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch

from longca.kernels import registry
from longca.kernels.base import DTYPES, Unsupported
from longca.kernels.layout import from_bshd, to_bshd
from longca.masks.mask import Mask
from longca.measure.reference import error_ratio, error_sums
from longca.measure.reference_cache import ReferenceCache
from longca.run.check import check_length, tolerance
from longca.run.serving import planned_unsupported, prepare_for, runtime_unsupported
from longca.spec.cells import Cell
from longca.vocab import Pass

GRADIENTS = ("dq", "dk", "dv")  # compared beside "out" on cells with a backward


def agreement_applies(cell: Cell) -> bool:
    """Whether the cell's rows carry a full-length comparison: the spec asks for one (`check.agree_with`;
    longca.spec.cells keeps it only in the check of cells it applies to) and the check ran shorter."""
    check = cell.check_dict
    return bool(check.get("enabled", True) and check.get("agree_with")) and check_length(cell) < cell.seqlen


def compares_gradients(cell: Cell) -> bool:
    """Whether the cell's agreement covers dQ, dK and dV: it times a backward."""
    return cell.pass_ != Pass.FWD


def _comparator_cell(cell: Cell, name: str) -> Cell:
    """The cell as the comparator runs it: forward only, or forward and backward where the gradients
    are compared (so its declared backward decides whether it serves), in the cell's dtype or
    bfloat16 for a one-byte dtype the comparator does not take (see the module's note)."""
    dtype = cell.dtype
    caps = registry.get(name).caps
    if dtype not in caps.dtypes and DTYPES[dtype].itemsize == 1:
        dtype = "bfloat16"
    pass_ = Pass.BWD if compares_gradients(cell) else Pass.FWD
    return dataclasses.replace(cell, kernel=name, pass_=pass_.value, dtype=dtype)


def single_device(cell: Cell) -> Cell:
    """A CP cell as one device runs it: its comparators serve the whole sequence on rank 0."""
    return dataclasses.replace(cell, world_size=1, cp_mechanism=None, cp_degrees=(), cp_balance=None, cp_backend=None)


def candidates(cell: Cell, device: torch.device, exclude_self: bool = True) -> tuple[list[Cell], list[str]]:
    """The comparator cells that may serve `cell`, in the spec's order, and why the others cannot.
    `exclude_self=False` for a CP cell: its own kernel on one device checks the mechanism."""
    computes = cell.adapter.caps.computes
    usable, why = [], []
    for name in cell.check_dict.get("agree_with", []):
        if name == cell.kernel and exclude_self:
            continue
        if registry.get(name).caps.computes != computes:  # longca.spec.cells keeps none such; a hand-made cell may
            why.append(f"{name}: computes {registry.get(name).caps.computes}, not {computes}")
            continue
        other = _comparator_cell(cell, name)
        reason = planned_unsupported(other) or runtime_unsupported(other, device)
        if reason:
            why.append(f"{name}: {reason}")
        else:
            usable.append(other)
    return usable, why


def results_key(cell: Cell, kernel: str, dtype: str, draw: int, device: torch.device) -> tuple:
    """What a kernel's full-length results on a draw depend on besides the kernel and its dtype: the
    problem (mask and parameters, length, shape), the seed and the draw (the inputs are drawn from
    `seed + 1000 + draw`, the same for every kernel: longca.run.cell) and the device type."""
    return (
        kernel,
        dtype,
        cell.mask,
        cell.mask_params,
        cell.seqlen,
        cell.heads_q,
        cell.heads_kv,
        cell.head_dim,
        cell.batch,
        cell.seed,
        draw,
        device.type,
    )


def compare(
    cell: Cell,
    mask: Mask,
    inputs_bshd: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    own_results: Callable[[], dict[str, torch.Tensor]],
    device: torch.device,
    exclude_self: bool = True,
    dout_bshd: torch.Tensor | None = None,
    held: ReferenceCache | None = None,
    draw: int | None = None,
) -> dict[str, Any]:
    """The agreement columns of one draw, and `incorrect` (the reason) where it disagrees.

    `inputs_bshd`: the draw's q, k, v viewed as (B, S, H, D); `own_results()`: the timed kernel's
    results on them as (B, S, H, D) tensors: "out", and "dq", "dk", "dv" where the cell has a
    backward (`compares_gradients`), computed with `dout_bshd` (B, S, Hq, D) as the upstream gradient.
    `held` and `draw`: the process's kept full-length results (see the module's note), read for the
    comparator and given the timed kernel's own when they agree; None (a CP cell) keeps nothing.
    """
    grads = compares_gradients(cell)
    if grads and dout_bshd is None:
        raise ValueError(f"{cell.id}: comparing gradients needs the upstream gradient (dout_bshd)")
    usable, why = candidates(cell, device, exclude_self)
    if not usable:
        return {"agree_reason": "no second kernel serves this cell: " + ("; ".join(why) or "none listed")}
    mine = own_results()
    keeping = held is not None and draw is not None
    for other in usable:
        key = results_key(cell, other.kernel, other.dtype, draw, device) if keeping else None
        kept = held.host(key, grads) if keeping else None
        try:
            if kept is not None:
                diffs = {name: error_ratio(*error_sums(mine[name], kept[name])) for name in mine}
            else:
                theirs: dict[str, list[torch.Tensor]] | None = {} if keeping else None
                diffs = _differences(cell, other, mask, inputs_bshd, mine, device, dout_bshd if grads else None, theirs)
                if theirs:
                    held.put(key, {name: torch.cat(parts, dim=2) for name, parts in theirs.items()})
        except (Unsupported, torch.OutOfMemoryError, RuntimeError, ValueError, TypeError) as exc:
            if "CUDA error" in str(exc) or "illegal memory access" in str(exc):
                raise  # the context is unusable: the cell's handler restarts the process
            # a comparator's failure is not the timed kernel's: pass it over, keep why
            why.append(f"{other.kernel}: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        row: dict[str, Any] = {"agree_kernel": other.kernel, "agree_rel_diff": diffs["out"]}
        row.update({f"agree_rel_diff_{name}": diffs[name] for name in GRADIENTS if name in diffs})
        out_tol, grad_tol = tolerance(cell)
        bad = [
            f"{name}={diff:.3g}"
            for name, diff in diffs.items()
            if not diff <= (out_tol if name == "out" else grad_tol)  # NaN never passes
        ]
        if bad:
            limits = f"{out_tol:g} out" + (f", {grad_tol:g} gradients" if grads else "")
            row["incorrect"] = (
                f"disagrees with {other.kernel} at the full length S={cell.seqlen}: relative difference "
                f"above the {cell.dtype} tolerance ({limits}): " + ", ".join(bad)
            )
        elif keeping and cell.kernel in cell.check_dict.get("agree_with", ()):
            held.put(results_key(cell, cell.kernel, cell.dtype, draw, device), mine)
        return row
    return {"agree_reason": "no second kernel served this cell: " + "; ".join(why)}


def head_groups(cell: Cell, mask: Mask) -> list[int]:
    """Into how many groups a comparator may split the heads, in the order tried: all in one call,
    then where that runs out of memory the KV heads in 2, 4, ... groups, each with its query heads
    (GQA maps query head h to KV head h // (Hq / Hkv), so contiguous groups keep the mapping). Heads
    are independent, so the comparison is the same; a comparator's float32 partial results at 512K
    (fla's recurrent backward: about 100 GB at 64 heads x 128) shrink with the group. Masks that
    differ per KV head (block-sparse layouts) run whole."""
    if mask.per_head:
        return [1]
    return [g for g in (1, 2, 4, 8, 16, 32, 64, 128) if cell.heads_kv % g == 0]


def _differences(
    cell: Cell,
    other: Cell,
    mask: Mask,
    inputs_bshd: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    mine: dict[str, torch.Tensor],
    device: torch.device,
    dout_bshd: torch.Tensor | None,
    theirs_out: dict[str, list[torch.Tensor]] | None = None,
) -> dict[str, float]:
    """The comparator `other`'s relative differences to `mine` ("out", and the gradients with
    `dout_bshd`), run over the fewest head groups that fit in memory (`head_groups`). With
    `theirs_out`, the comparator's results are also left there as host copies, one per head group
    in order (concatenated along the heads, they are its whole results)."""
    kernel = other.adapter
    dtype = DTYPES[other.dtype]
    tries = head_groups(other, mask)
    for groups in tries:
        try:
            sums: dict[str, tuple[float, float]] = {}
            part = dataclasses.replace(other, heads_q=other.heads_q // groups, heads_kv=other.heads_kv // groups)
            prepared, _ = prepare_for(part, kernel, mask, dtype, device, grad=dout_bshd is not None)
            for j in range(groups):
                hq = slice(j * part.heads_q, (j + 1) * part.heads_q)
                hk = slice(j * part.heads_kv, (j + 1) * part.heads_kv)
                heads = {"out": hq, "dq": hq, "dk": hk, "dv": hk}
                q, k, v = (_heads(x, h, groups) for x, h in zip(inputs_bshd, (hq, hk, hk)))
                dout = None if dout_bshd is None else _heads(dout_bshd, hq, groups)
                theirs = _results(prepared, cell.batch, (q, k, v), dtype, dout)
                for name in ("out", *GRADIENTS):
                    if name in theirs:
                        if theirs_out is not None:
                            theirs_out.setdefault(name, []).append(theirs[name].detach().to("cpu", copy=True))
                        num, denom = error_sums(mine[name][:, :, heads[name]], theirs.pop(name))
                        before = sums.get(name, (0.0, 0.0))
                        sums[name] = (before[0] + num, before[1] + denom)
                del theirs
            if groups > 1:
                _log(f"{cell.id}: {other.kernel} compared over {groups} head groups (fewer ran out of memory)")
            return {name: error_ratio(*s) for name, s in sums.items()}
        except torch.OutOfMemoryError:
            if theirs_out is not None:
                theirs_out.clear()  # the next try's groups start afresh
            if groups == tries[-1]:
                raise
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    raise AssertionError("unreachable: head_groups is never empty")


def _heads(x: torch.Tensor, heads: slice, groups: int) -> torch.Tensor:
    """Heads `heads` of a (B, S, H, D) tensor: the tensor itself when whole, else a dense copy
    (kernels take the layouts they are timed on)."""
    return x if groups == 1 else x[:, :, heads].contiguous()


def _log(msg: str) -> None:
    print(f"[longca] {msg}", file=sys.stderr, flush=True)


def _results(
    prepared: Any,
    batch: int,
    inputs_bshd: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    dtype: torch.dtype,
    dout_bshd: torch.Tensor | None,
) -> dict[str, torch.Tensor]:
    """A prepared comparator's output on the inputs, and its gradients with `dout_bshd` when given, as
    (B, S, H, D) tensors."""
    grads = dout_bshd is not None
    args = [from_bshd(x.detach().to(dtype), prepared.layout).requires_grad_(grads) for x in inputs_bshd]
    with torch.set_grad_enabled(grads):
        out = prepared.call(*args)
    results = {"out": to_bshd(out.detach(), prepared.layout, batch)}
    if grads:
        out.backward(from_bshd(dout_bshd.to(dtype), prepared.layout))
        del out
        for name, x in zip(GRADIENTS, args):
            results[name] = to_bshd(x.grad, prepared.layout, batch)
    return results
