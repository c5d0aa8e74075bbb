"""Kernel-specific forms derived from a mask's slices (never stored beside them).

A pattern declares the forms it can be given in (MaskPattern.forms); a kernel declares the forms
it accepts (Capabilities.mask_forms); the planner intersects them and marks an empty
intersection `unsupported`. `convert(mask, form)` produces any declared form; each is tested
against the dense mask (tests/masks/test_forms.py).

- dense:        bool (S, S), or (heads, S, S) for per-head masks; small S only
- slices:       the (N, 5) slice array (shared masks only)
- full/causal:  no data: the kernel's own flag (causal is top-left aligned, Sq == Sk)
- window:       WindowForm(left, right), -1 meaning unbounded (flash-attn's window_size)
- varlen:       VarlenForm(cu_seqlens, causal, max_seqlen) over packed documents
- blockmask:    a FlexAttention BlockMask (longca.masks.flex.to_block_mask)
- block_sparse: the BlockLayout (kept blocks per KV head)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from longca.masks.mask import Mask
from longca.masks.registry import PATTERNS


@dataclass(frozen=True)
class WindowForm:
    left: int  # keys q - left .. q + right are attended; -1 means unbounded
    right: int


@dataclass(frozen=True)
class VarlenForm:
    cu_seqlens: np.ndarray  # (n_docs + 1,) int64 offsets
    causal: bool
    max_seqlen: int


def forms_of(mask_name: str) -> frozenset[str]:
    if mask_name not in PATTERNS:
        raise ValueError(f"unknown mask {mask_name!r}; allowed: {sorted(PATTERNS)}")
    return PATTERNS[mask_name].forms


def window_form(mask: Mask) -> WindowForm:
    if mask.name == "sliding_window":
        return WindowForm(int(mask.params["window"]), int(mask.params["window"]))
    if mask.name == "causal_sliding_window":
        return WindowForm(int(mask.params["window"]), 0)
    if mask.name == "causal":
        return WindowForm(-1, 0)
    if mask.name == "full":
        return WindowForm(-1, -1)
    raise ValueError(f"mask {mask.name!r} has no window form; masks with one: "
                     f"{sorted(n for n, p in PATTERNS.items() if 'window' in p.forms)}")


def varlen_form(mask: Mask) -> VarlenForm:
    docs = mask.documents if mask.documents is not None else (mask.seqlen_q,)
    if mask.name in ("full", "full_document"):
        causal = False
    elif mask.name in ("causal", "causal_document"):
        causal = True
    else:
        raise ValueError(f"mask {mask.name!r} has no varlen form; masks with one: "
                         f"{sorted(n for n, p in PATTERNS.items() if 'varlen' in p.forms)}")
    cu = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
    return VarlenForm(cu, causal, int(max(docs)))


def convert(mask: Mask, form: str, *, device: Any = "cpu", block_size: int | tuple[int, int] = 128,
            heads_q: int | None = None) -> Any:
    """The mask in `form` (one of its pattern's declared forms)."""
    allowed = PATTERNS[mask.name].forms if mask.name in PATTERNS else frozenset()
    if form not in allowed:
        raise ValueError(f"mask {mask.name!r} cannot be given as form {form!r}; allowed: {sorted(allowed)}")
    if form == "dense":
        return mask.dense()
    if form == "slices":
        return mask.slices
    if form in ("full", "causal"):
        return None
    if form == "window":
        return window_form(mask)
    if form == "varlen":
        return varlen_form(mask)
    if form == "blockmask":
        from longca.masks.flex import to_block_mask

        return to_block_mask(mask, block_size, device=device, heads_q=heads_q)
    if form == "block_sparse":
        return mask.blocks
    raise ValueError(f"unknown form {form!r}")
