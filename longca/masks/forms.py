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
- intervals:    int32 (nfunc, S) endpoints per query: its visible keys are [0,F0) U [F1,F2) U ...
                (nfunc odd; cuDNN's interval-mask attention), from the slices' per-row key intervals
- document_intervals: (VarlenForm, endpoints): the documents as packed sequences and each query's
                intervals relative to its own document's first token (cuDNN's THD path), for
                masks whose every pair lies inside one document
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
    """The keys around each query as flash-attn's window_size: the pattern's own (MaskPattern.window)."""
    pattern = PATTERNS.get(mask.name)
    if pattern is None or pattern.window is None:
        raise ValueError(
            f"mask {mask.name!r} has no window form; masks with one: "
            f"{sorted(n for n, p in PATTERNS.items() if p.window is not None)}"
        )
    left, right = pattern.window(mask.params)
    return WindowForm(int(left), int(right))


def varlen_form(mask: Mask) -> VarlenForm:
    docs = mask.documents if mask.documents is not None else (mask.seqlen_q,)
    pattern = PATTERNS.get(mask.name)
    if pattern is None or "varlen" not in pattern.forms:
        raise ValueError(
            f"mask {mask.name!r} has no varlen form; masks with one: "
            f"{sorted(n for n, p in PATTERNS.items() if 'varlen' in p.forms)}"
        )
    causal = pattern.causal_documents
    cu = np.concatenate([[0], np.cumsum(docs)]).astype(np.int64)
    return VarlenForm(cu, causal, int(max(docs)))


def interval_endpoints(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per-query key intervals (K layers of lo, hi; disjoint within a row, empty where lo >= hi) as
    cuDNN's endpoint rows: int32 (nfunc, rows), nfunc = 1 + 2 m for the most intervals m a row
    needs beyond one starting at key 0. Adjacent intervals merge; unused pairs are empty, [x, x) at
    the row's last endpoint, so every row's endpoints are non-decreasing."""
    lo, hi = np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)
    big = np.iinfo(np.int64).max
    empty = hi <= lo
    lo, hi = np.where(empty, big, lo), np.where(empty, big, hi)
    order = np.argsort(lo, axis=0, kind="stable")
    lo, hi = np.take_along_axis(lo, order, 0), np.take_along_axis(hi, order, 0)
    valid = lo < big
    # a new interval starts where a row's next interval does not continue the previous one
    starts = valid & np.concatenate([np.ones((1, lo.shape[1]), bool), lo[1:] != hi[:-1]], axis=0)
    group = np.cumsum(starts, axis=0) - 1  # merged interval index of each layer, per row
    n_groups = starts.sum(axis=0)
    k, rows = lo.shape
    m_lo = np.full((k, rows), big)
    m_hi = np.full((k, rows), -1)
    cols = np.broadcast_to(np.arange(rows), (k, rows))
    m_lo[group[starts], cols[starts]] = lo[starts]
    np.maximum.at(m_hi, (group[valid], cols[valid]), hi[valid])  # the end of each merged interval
    first_at_zero = (n_groups > 0) & (m_lo[0] == 0)
    f0 = np.where(first_at_zero, m_hi[0], 0)
    extra = n_groups - first_at_zero  # intervals written as pairs after F0
    pairs = int(extra.max()) if rows else 0
    out = np.empty((1 + 2 * pairs, rows), dtype=np.int64)
    out[0] = f0
    last = f0.copy()
    for p in range(pairs):
        g = p + first_at_zero.astype(np.int64)  # merged interval written as pair p
        used = p < extra
        g_safe = np.minimum(g, k - 1)
        a = np.where(used, m_lo[g_safe, np.arange(rows)], last)
        b = np.where(used, m_hi[g_safe, np.arange(rows)], last)
        out[1 + 2 * p], out[2 + 2 * p] = a, b
        last = b
    return out.astype(np.int32)


def interval_form(mask: Mask) -> np.ndarray:
    """The mask as cuDNN's interval endpoints over the whole sequence (BSHD): int32 (nfunc, Sq)."""
    from longca.masks.flex import row_intervals

    if mask.slices is None or mask.blocks is not None or mask.head_slices is not None:
        raise ValueError(f"mask {mask.name!r} has no interval form (per-head and block-sparse masks have none)")
    return interval_endpoints(*row_intervals(mask.slices, mask.seqlen_q))


def document_interval_form(mask: Mask) -> tuple[VarlenForm, np.ndarray]:
    """A document-local mask as cuDNN's variable-length form: the documents' offsets and each
    query's endpoints relative to its own document's first token (THD: one sample per document).
    Refused (ValueError) where a pair crosses documents: packed sequences cannot see each other."""
    from longca.masks.flex import row_intervals

    if mask.documents is None or mask.slices is None:
        raise ValueError(f"mask {mask.name!r} has no documents, so no document_intervals form")
    cu = np.concatenate([[0], np.cumsum(mask.documents)]).astype(np.int64)
    start = np.repeat(cu[:-1], np.diff(cu))
    end = np.repeat(cu[1:], np.diff(cu))
    lo, hi = row_intervals(mask.slices, mask.seqlen_q)
    used = hi > lo
    if ((lo < start) & used).any() or ((hi > end) & used).any():
        raise ValueError(f"mask {mask.name!r} attends across documents: no document_intervals form")
    causal = PATTERNS[mask.name].causal_documents  # what the offsets alone cannot say; the endpoints carry it
    docs = VarlenForm(cu, causal, int(np.diff(cu).max()))
    return docs, interval_endpoints(np.where(used, lo - start, 0), np.where(used, hi - start, 0))


def convert(
    mask: Mask, form: str, *, device: Any = "cpu", block_size: int | tuple[int, int] = 128, heads_q: int | None = None
) -> Any:
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
    if form == "intervals":
        return interval_form(mask)
    if form == "document_intervals":
        return document_interval_form(mask)
    if form == "blockmask":
        from longca.masks.flex import to_block_mask

        return to_block_mask(mask, block_size, device=device, heads_q=heads_q)
    if form == "block_sparse":
        return mask.blocks
    raise ValueError(f"unknown form {form!r}")
