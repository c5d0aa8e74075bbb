"""The kernel adapter protocol: capabilities as data, one thin callable per kernel.

Tensors are handed to kernels in the adapter's declared `layout`:
- "bshd": (batch, seqlen, heads, head_dim)   (flash-attn style)
- "bhsd": (batch, heads, seqlen, head_dim)   (SDPA / FlexAttention style)
- "thd":  (total_tokens, heads, head_dim)    (varlen: batch folded into packed documents)
The runner builds inputs directly in that layout, outside the timed region.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from longca.masks.blocks import BlockLayout
from longca.masks.mask import Mask
from longca.vocab import DTYPE_MIN_COMPUTE_CAPABILITY, Dtype, Pass, torch_dtype

# Mask forms: how a kernel can be told which pairs to attend. A mask offers a subset
# (longca.masks.forms.forms_of); a kernel accepts a subset; the planner intersects them.
MASK_FORMS = (
    "full",  # no mask at all
    "causal",  # the kernel's built-in causal flag (top-left aligned, Sq == Sk)
    "window",  # (left, right) sliding window sizes, optionally causal
    "varlen",  # packed documents via cu_seqlens, each document full or causal
    "dense",  # an explicit boolean (S, S) tensor: memory O(S^2), small S only
    "blockmask",  # FlexAttention BlockMask + mask_mod built from the slices
    "slices",  # the slice array itself (kernels that take (q_range, k_range, kind) lists)
    "intervals",  # per query, its visible keys as a union of intervals [0,F0) U [F1,F2) U ... (cuDNN)
    "document_intervals",  # packed documents (cu_seqlens), each query's intervals local to its document
    "block_sparse",  # block-level kept-block lists (per KV head)
)

DTYPES: dict[str, torch.dtype] = {d.value: torch_dtype(d) for d in Dtype}


@dataclass(frozen=True)
class RankCapabilities:
    """What a kernel can do as a context-parallel per-rank kernel: its `rank_kernel()` object
    (longca.kernels.rank) returns the LSE with its output, and its backward takes the combined
    output and LSE, so each ring step's gradient is its exact share. Checked at validation and
    planning, before any process starts."""

    devices: frozenset[str]
    dtypes: frozenset[str]
    slice_kinds: frozenset[int] | None = None  # slice kinds of the sub-masks it takes (None: all; empty: none)
    block_sparse: bool = False  # takes a step's block lists (block-sparse masks)
    note: str = ""


@dataclass(frozen=True)
class Capabilities:
    """What a kernel can run, declared as data. The planner marks every other cell unsupported."""

    mask_forms: frozenset[str]
    dtypes: frozenset[str]
    devices: frozenset[str] = frozenset({"cuda"})
    head_dims: frozenset[int] | None = None  # None: any
    gqa: bool = True
    backward: bool = True
    # dtypes the backward takes (None: all of `dtypes`); fp8 kernels are mostly forward-only
    backward_dtypes: frozenset[str] | None = None
    # head dims the backward takes (None: all of `head_dims`), and whether it takes GQA (cuDNN's
    # block-sparse backward is MHA-only at head dim 128 on sm90, where its forward takes GQA)
    backward_head_dims: frozenset[int] | None = None
    backward_gqa: bool = True
    min_compute_capability: tuple[int, int] | None = None
    max_compute_capability: tuple[int, int] | None = None
    package: str | None = None  # import name that must be importable
    family: str = "softmax"  # softmax | linear (FLOP model differs)
    # The function computed: "softmax" attention, or a linear-attention family's name
    # (longca.kernels.linear.FAMILIES). Kernels that compute the same function check each other at
    # full length (check.agree_with); kernels of one family may compute different functions.
    computes: str = "softmax"
    masks: frozenset[str] | None = None  # restrict to named masks (None: by form)
    # Block-sparse kernels with fixed tiles: the uniform block sizes taken (None: any layout,
    # variable blocks included)
    block_sizes: frozenset[int] | None = None
    # Backward may run again on one forward's graph (retain_graph=True), which a sweep can ask for
    # with `repeat.backward: retained_graph`. False for a kernel whose backward frees what its forward
    # saved (compiled graphs with donated buffers do). benchmarks/flex_retained_graph.py checks it.
    retained_backward: bool = True
    # Context parallelism: None when the kernel cannot serve as a per-rank kernel
    cp: RankCapabilities | None = None

    def __post_init__(self) -> None:
        unknown = set(self.mask_forms) - set(MASK_FORMS)
        if unknown:
            raise ValueError(f"unknown mask forms {sorted(unknown)}; allowed: {MASK_FORMS}")

    def backward_reason(self, *, dtype: str, head_dim: int, gqa: bool) -> str | None:
        """Why the declared backward cannot run at this dtype / head dim / head grouping, or None."""
        if not self.backward:
            return "no backward pass"
        if self.backward_dtypes is not None and dtype not in self.backward_dtypes:
            return f"no backward in {dtype} (backward dtypes: {sorted(self.backward_dtypes)})"
        if self.backward_head_dims is not None and head_dim not in self.backward_head_dims:
            return f"no backward at head dim {head_dim} (backward head dims: {sorted(self.backward_head_dims)})"
        if gqa and not self.backward_gqa:
            return "no backward under GQA (heads_q != heads_kv): MHA only"
        return None


@dataclass
class Prepared:
    """What a kernel needs for one (mask, shape): built once, outside the timed region.

    `build_s` records mask construction (and compilation where the adapter does it eagerly).
    `info` lands in the row (for example which SDPA backend ran)."""

    call: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
    layout: str
    build_s: float = 0.0
    compile_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    # Optional custom input factory: varlen kernels pack documents; returns (q, k, v).
    extra: dict[str, Any] = field(default_factory=dict)


class Kernel(Protocol):
    name: str
    caps: Capabilities
    layout: str
    description: str

    def prepare(
        self,
        mask: Mask,
        *,
        batch: int,
        heads_q: int,
        heads_kv: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        form: str,
    ) -> Prepared:
        """Convert the mask to `form` and return the callable (q, k, v) -> out in `layout`."""
        ...

    # Optional: `backward_refusal(device) -> str | None`, why this installation cannot run the
    # backward on `device` (a library refusing a known-bad compiler version), found at run time.
    # Optional: `grad_changes_form(mask, *, head_dim, dtype, device) -> bool`, whether the kernel
    # builds another form for forward-only calls than for calls with gradients; such a kernel's
    # `prepare` takes `grad: bool` and is prepared (and checked) per pass kind (Flex at block 64).


def dtype_refusal(dtype: str, compute_capability: tuple[int, int]) -> str | None:
    """Why a GPU of `compute_capability` cannot compute in `dtype` at all, or None."""
    need = DTYPE_MIN_COMPUTE_CAPABILITY.get(dtype)
    if need and tuple(compute_capability) < need:
        return f"{dtype} needs compute capability >= {need}, device has {tuple(compute_capability)}"
    return None


def backward_refusal(kernel: Any, device: torch.device) -> str | None:
    """The kernel's run-time reason to refuse its backward on `device`, or None."""
    hook = getattr(kernel, "backward_refusal", None)
    return hook(device) if hook is not None else None


def prepares_per_pass(kernel: Any) -> bool:
    """Whether `kernel`'s `prepare` takes `grad` (it has `grad_changes_form`, see the Kernel protocol)."""
    return getattr(kernel, "grad_changes_form", None) is not None


def grad_changes_form(kernel: Any, mask: Mask, *, head_dim: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `kernel` prepares `mask` differently for forward-only calls (see the Kernel protocol)."""
    if not prepares_per_pass(kernel):
        return False
    return bool(kernel.grad_changes_form(mask, head_dim=head_dim, dtype=dtype, device=device))


def block_layout(kernel: Any, mask: Mask, form: str, heads_q: int, heads_kv: int) -> BlockLayout:
    """A block-sparse kernel's input: the mask's per-KV-head BlockLayout, checked against the cell's
    heads and the kernel's declared `gqa` and `block_sizes` (prepare-time echo of what the planner
    enforces)."""
    layout = mask.blocks
    if form != "block_sparse" or layout is None:
        raise Unsupported(f"{kernel.name} takes a block-sparse layout, not form {form!r}")
    if layout.heads != heads_kv or heads_q % heads_kv:
        raise Unsupported(f"mask has {layout.heads} KV heads; cell has {heads_q}:{heads_kv}")
    if not kernel.caps.gqa and heads_q != heads_kv:
        raise Unsupported("GQA (heads_q != heads_kv) not supported")
    sizes = kernel.caps.block_sizes
    if sizes is not None and layout.uniform_block not in sizes:
        raise Unsupported(
            f"uniform blocks of {sorted(sizes)} only; this layout has {layout.uniform_block or 'variable'} blocks"
        )
    return layout


def sync(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op off CUDA): what prepare() times must be finished."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def package_available(name: str | None) -> bool:
    if name is None:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


class Unsupported(Exception):
    """Raised by an adapter for a combination it cannot run; the row becomes `unsupported`."""


def static_unsupported_reason(
    caps: Capabilities,
    *,
    mask_name: str,
    mask_forms: frozenset[str],
    dtype: str,
    head_dim: int,
    heads_q: int,
    heads_kv: int,
    pass_: str,
    device: str,
    block_size: int | None = None,
) -> str | None:
    """Why a kernel cannot run a cell, from declared capabilities alone (planning time), or None.
    `block_size`: a block-sparse mask's uniform block (None for variable blocks and other masks)."""
    if device not in caps.devices:
        return f"kernel runs on {sorted(caps.devices)}, not {device}"
    if caps.masks is not None and mask_name not in caps.masks:
        return f"mask {mask_name} not supported (supports {sorted(caps.masks)})"
    if not (caps.mask_forms & mask_forms):
        return f"mask {mask_name} offers forms {sorted(mask_forms)}; kernel takes {sorted(caps.mask_forms)}"
    if dtype not in caps.dtypes:
        return f"dtype {dtype} not supported (supports {sorted(caps.dtypes)})"
    if caps.head_dims is not None and head_dim not in caps.head_dims:
        return f"head dim {head_dim} not supported (supports {sorted(caps.head_dims)})"
    if heads_q != heads_kv and not caps.gqa:
        return "GQA (heads_q != heads_kv) not supported"
    if pass_ != Pass.FWD and (why := caps.backward_reason(dtype=dtype, head_dim=head_dim, gqa=heads_q != heads_kv)):
        return why
    if caps.block_sizes is not None and "block_sparse" in mask_forms and block_size not in caps.block_sizes:
        shown = f"block size {block_size}" if block_size else "variable blocks"
        return f"{shown} not supported (uniform blocks of {sorted(caps.block_sizes)} only)"
    return None


def rank_unsupported_reason(caps: Capabilities, *, device: str, dtype: str, block_sparse: bool) -> str | None:
    """Why a kernel cannot serve one CP cell as its per-rank kernel, from declared capabilities, or None
    (whether it can serve CP at all is a validation error: longca.spec.validate)."""
    rc = caps.cp
    if rc is None:
        return "not a context-parallel per-rank kernel"
    if device not in rc.devices:
        return f"as a CP per-rank kernel it runs on {sorted(rc.devices)}, not {device}"
    if dtype not in rc.dtypes:
        return f"as a CP per-rank kernel it takes dtypes {sorted(rc.dtypes)}, not {dtype}"
    if block_sparse and not rc.block_sparse:
        return "as a CP per-rank kernel it takes slice masks only, not block-sparse ones"
    if not block_sparse and rc.slice_kinds is not None and not rc.slice_kinds:
        return "as a CP per-rank kernel it takes block-sparse masks only"
    return None


# most specific first: a kernel's native flag beats a generic mask
FORM_PREFERENCE = (
    "full",
    "causal",
    "window",
    "varlen",
    "document_intervals",
    "block_sparse",
    "slices",
    "intervals",
    "blockmask",
    "dense",
)


def choose_form(caps: Capabilities, mask_forms: frozenset[str]) -> str:
    """The most specific form both sides share (a kernel's native flag beats a generic mask)."""
    for form in FORM_PREFERENCE:
        if form in caps.mask_forms and form in mask_forms:
            return form
    raise Unsupported(f"no common mask form: mask offers {sorted(mask_forms)}, kernel takes {sorted(caps.mask_forms)}")
