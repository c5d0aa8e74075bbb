"""Whether a cell's kernel can serve it, and the kernel prepared to: the refusals known from declared
capabilities alone (planning, no device touched), those of this machine (package, compute capability,
dtype, backward), a cell too large for the device's memory, and `prepare_for`, the kernel made ready
for a mask in the most specific form both take. The cell runner and the agreement both use it.
"""

from __future__ import annotations

from typing import Any

import torch

from longca.kernels.base import (
    DTYPES,
    backward_refusal,
    choose_form,
    dtype_refusal,
    package_available,
    prepares_per_pass,
    rank_unsupported_reason,
    static_unsupported_reason,
)
from longca.masks.forms import forms_of
from longca.masks.mask import Mask
from longca.masks.registry import resolve_params
from longca.measure.reference_cache import host_memory
from longca.spec.cells import Cell
from longca.vocab import Pass


def planned_unsupported(cell: Cell) -> str | None:
    """Reason a cell cannot run, known from declared capabilities alone (no device touched). A CP
    cell asks the kernel's per-rank capabilities (whether it can be a per-rank kernel at all is a
    validation error, longca.spec.validate)."""
    kernel = cell.adapter
    if cell.cp_mechanism is not None:
        return rank_unsupported_reason(
            kernel.caps, device=cell.device, dtype=cell.dtype, block_sparse=cell.pattern.family == "dynamic"
        )
    pattern = cell.pattern
    block = resolve_params(cell.mask, dict(cell.mask_params)).get("block") if pattern.family == "dynamic" else None
    return static_unsupported_reason(
        kernel.caps,
        mask_name=cell.mask,
        mask_forms=forms_of(cell.mask),
        dtype=cell.dtype,
        head_dim=cell.head_dim,
        heads_q=cell.heads_q,
        heads_kv=cell.heads_kv,
        pass_=cell.pass_,
        device=cell.device,
        block_size=block,
    )


def runtime_unsupported(cell: Cell, device: torch.device) -> str | None:
    kernel = cell.adapter
    caps = kernel.caps
    if not package_available(caps.package):
        return f"{caps.package} not installed"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        cc = torch.cuda.get_device_capability(device)
        if caps.min_compute_capability and cc < caps.min_compute_capability:
            return f"needs compute capability >= {caps.min_compute_capability}, device has {cc}"
        if caps.max_compute_capability and cc > caps.max_compute_capability:
            return f"needs compute capability <= {caps.max_compute_capability}, device has {cc}"
        refusal = dtype_refusal(cell.dtype, cc)
        if refusal:
            return refusal
    if cell.pass_ != Pass.FWD:
        return backward_refusal(kernel, device)
    return None


def device_memory(device: torch.device) -> int:
    """Bytes of memory the device has in all: the GPU's, or the host's for a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return host_memory()


def beyond_memory(cell: Cell, device: torch.device) -> str | None:
    """Why a cell cannot fit its device at all, before anything is allocated, or None: its q, k, v
    and output (with a backward, their gradients and the upstream gradient too) alone exceed the
    device's memory. A 1 TiB request then reads as the `oom` it is, not as an allocator's error."""
    itemsize = DTYPES[cell.dtype].itemsize
    per_token = (2 * cell.heads_q + 2 * cell.heads_kv) * cell.head_dim * itemsize
    need = cell.batch * cell.seqlen * per_token * (1 if cell.pass_ == Pass.FWD else 2)
    have = device_memory(device)
    if need <= have:
        return None
    what = "q, k, v and the output" + ("" if cell.pass_ == Pass.FWD else ", with their gradients")
    return f"out of memory: {what} alone need {need / 2**30:.1f} GiB; this device has {have / 2**30:.1f} GiB"


def prepare_for(
    cell: Cell, kernel: Any, mask: Mask, dtype: torch.dtype, device: torch.device, grad: bool | None
) -> tuple[Any, str]:
    """`kernel` ready for `mask` at the cell's shape, in the most specific form both take, and that
    form. `grad` tells a kernel whose form depends on it (`grad_changes_form`: Flex at block 64 on
    sm90, cuDNN's plan with its backward payload) whether gradients follow; None tells it nothing."""
    form = choose_form(kernel.caps, forms_of(cell.mask))
    told = {"grad": grad} if grad is not None and prepares_per_pass(kernel) else {}
    prepared = kernel.prepare(
        mask,
        batch=cell.batch,
        heads_q=cell.heads_q,
        heads_kv=cell.heads_kv,
        head_dim=cell.head_dim,
        dtype=dtype,
        device=device,
        form=form,
        **told,
    )
    return prepared, form
