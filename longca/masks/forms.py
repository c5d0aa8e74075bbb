"""Kernel-specific forms derived from a mask's slices (never stored beside them)."""

from __future__ import annotations

from dataclasses import dataclass

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
    return PATTERNS[mask_name].forms


def window_form(mask: Mask) -> WindowForm:
    w = int(mask.params["window"])
    if mask.name == "sliding_window":
        return WindowForm(w, w)
    if mask.name == "causal_sliding_window":
        return WindowForm(w, 0)
    if mask.name == "causal":
        return WindowForm(-1, 0)
    raise ValueError(f"mask {mask.name!r} has no window form")


def varlen_form(mask: Mask) -> VarlenForm:
    if mask.documents is None:
        docs = (mask.seqlen_q,)
    else:
        docs = mask.documents
    if mask.name in ("full", "full_document"):
        causal = False
    elif mask.name in ("causal", "causal_document"):
        causal = True
    else:
        raise ValueError(f"mask {mask.name!r} has no varlen form")
    cu = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
    return VarlenForm(cu, causal, int(max(docs)))
