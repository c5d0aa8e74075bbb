"""The correctness verdict every cell gets, single-device or context-parallel: the spec's `check`
block (tolerance per dtype, gradients `grad_factor` times looser, the reduced length
`max_seqlen`) applied to relative errors against a high-precision reference."""

from __future__ import annotations

from typing import Any

from longca.spec.cells import Cell
from longca.vocab import Pass

ERROR_NAMES = ("out", "dq", "dk", "dv")


def tolerance(cell: Cell) -> tuple[float, float]:
    """(output, gradient) tolerances of the cell's dtype from its `check` settings."""
    tol = cell.check_dict["tolerance"]
    out_tol = float(tol[cell.dtype])
    return out_tol, out_tol * float(tol["grad_factor"])  # the spec's defaults always hold one


def check_length(cell: Cell, granule: int = 1) -> int:
    """The length the check runs at: the cell's own when within `check.max_seqlen`, else the largest
    multiple of `granule` (what a CP sharding needs) up to it, never below one granule."""
    target = int(cell.check_dict["max_seqlen"])
    if cell.seqlen <= target:
        return cell.seqlen
    return max(granule, target // granule * granule)


def check_columns(check: dict[str, Any]) -> dict[str, Any]:
    """The row columns of a check result: the relative errors and the length it ran at."""
    return {k: v for k, v in check.items() if k.startswith("rel_err") or k == "check_seqlen"}


def check_verdict(cell: Cell, check: dict[str, Any]) -> str | None:
    """Why the cell's numbers are wrong, or None: the output always, gradients for passes with a backward."""
    out_tol, grad_tol = tolerance(cell)
    names = ("out",) if cell.pass_ == Pass.FWD else ERROR_NAMES
    if cell.pass_ != Pass.FWD and check.get("rel_err_dq") is None:
        return "gradients were not checked"
    bad = [
        f"{n}={check[f'rel_err_{n}']:.3g}"
        for n in names
        if not check[f"rel_err_{n}"] <= (out_tol if n == "out" else grad_tol)
    ]  # NaN never passes
    if not bad:
        return None
    return (
        f"relative error above tolerance ({out_tol:g} out, {grad_tol:g} grads) at S={check['check_seqlen']}: "
        + ", ".join(bad)
    )
