"""Mask -> flash-attention arguments, shared by the fa2, fa3, fa4 and varlen adapters.

Pure Python and numpy (no flash package needed), so the mapping is tested on any machine.
Conventions are flash-attn's: window_size = (left, right), -1 meaning unbounded; query i attends
keys [i - left, i + right] (Sq == Sk); cu_seqlens int32 offsets over the packed (batch * S) tokens.
This module registers no kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from longca.kernels.base import Unsupported, sync
from longca.masks.forms import varlen_form, window_form
from longca.masks.mask import Mask


@dataclass(frozen=True)
class FlashMaskArgs:
    """How one mask is given to a flash kernel in one form."""

    form: str
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    cu_seqlens: np.ndarray | None = None  # (n_docs * batch + 1,) int32, over batch * S tokens
    max_seqlen: int | None = None

    @property
    def layout(self) -> str:
        """The layout the flash function itself takes in this form (adapters wrap thd as bshd)."""
        return "thd" if self.form == "varlen" else "bshd"

    def window_or_none(self) -> tuple[int | None, int | None]:
        """FA4's convention: None instead of -1 for an unbounded side."""
        return tuple(None if w < 0 else w for w in self.window)  # type: ignore[return-value]


def batched_cu_seqlens(cu_seqlens: np.ndarray, seqlen: int, batch: int) -> np.ndarray:
    """Offsets of one sequence's documents, repeated for `batch` sequences packed back to back."""
    cu = np.asarray(cu_seqlens, dtype=np.int64)
    if cu[0] != 0 or cu[-1] != seqlen or (np.diff(cu) <= 0).any():
        raise ValueError(f"cu_seqlens must rise strictly from 0 to seqlen={seqlen}; got {cu.tolist()[:8]}...")
    starts = (cu[:-1][None, :] + seqlen * np.arange(batch)[:, None]).reshape(-1)
    return np.append(starts, seqlen * batch).astype(np.int32)


def flash_mask_args(mask: Mask, form: str, batch: int = 1) -> FlashMaskArgs:
    """The causal flag, window and cu_seqlens that make a flash kernel attend exactly `mask`."""
    if mask.seqlen_q != mask.seqlen_k:
        raise Unsupported("flash adapters assume seqlen_q == seqlen_k")
    if form == "full":
        _expect(mask, form, ("full",))
        return FlashMaskArgs(form)
    if form == "causal":
        _expect(mask, form, ("causal",))
        return FlashMaskArgs(form, causal=True, window=(-1, 0))
    if form == "window":
        w = window_form(mask)
        if (w.left, w.right) == (-1, -1):  # full
            return FlashMaskArgs(form)
        if (w.left, w.right) == (-1, 0):  # causal: the kernel's own flag
            return FlashMaskArgs(form, causal=True, window=(-1, 0))
        return FlashMaskArgs(form, causal=False, window=(int(w.left), int(w.right)))
    if form == "varlen":
        vf = varlen_form(mask)
        cu = batched_cu_seqlens(vf.cu_seqlens, mask.seqlen_q, batch)
        return FlashMaskArgs(
            form,
            causal=bool(vf.causal),
            window=(-1, 0) if vf.causal else (-1, -1),
            cu_seqlens=cu,
            max_seqlen=int(vf.max_seqlen),
        )
    raise Unsupported(f"form {form!r} has no flash-attention arguments")


def _expect(mask: Mask, form: str, names: tuple[str, ...]) -> None:
    if mask.name not in names:
        raise Unsupported(f"form {form!r} cannot express mask {mask.name!r}")


def interval_table(mask: Mask, pad_rows: int = 512) -> tuple[np.ndarray, int]:
    """Per-query key intervals as one flat int32 array for a kernel-side mask function.

    Returns (bounds, layers): query q attends key k iff bounds[(q * layers + j) * 2] <= k <
    bounds[(q * layers + j) * 2 + 1] for some layer j < layers. `pad_rows` extra rows (attending
    nothing) let a kernel read rows of its last, partial query tile without going out of bounds."""
    from longca.masks.flex import row_intervals

    if mask.per_head:
        raise Unsupported("per-KV-head masks have no single interval table")
    lo, hi = row_intervals(mask.slices, mask.seqlen_q, 1)
    layers, rows = lo.shape
    table = np.zeros((rows + pad_rows, layers, 2), dtype=np.int32)
    table[:rows, :, 0] = lo.T
    table[:rows, :, 1] = hi.T
    return table.reshape(-1), layers


def dense_from_intervals(bounds: np.ndarray, layers: int, seqlen_q: int, seqlen_k: int) -> np.ndarray:
    """The boolean (Sq, Sk) matrix an interval table allows (small S only, for tests)."""
    t = bounds.reshape(-1, layers, 2)[:seqlen_q]
    k = np.arange(seqlen_k)
    return ((k[None, None, :] >= t[:, :, 0:1]) & (k[None, None, :] < t[:, :, 1:2])).any(axis=1)


def first_output(result):
    """Some flash interfaces return (out, lse): keep out."""
    return result[0] if isinstance(result, (tuple, list)) else result


def packed(varlen_call, batch: int, seqlen: int):
    """Wrap a (B*S, H, D) varlen call so that it takes and returns (B, S, H, D) tensors.

    The reshapes are views of contiguous bshd tensors (no copy), so the kernel's one layout
    stays bshd whatever form the planner chose."""

    def call(q, k, v):
        out = varlen_call(*(t.reshape(batch * seqlen, *t.shape[2:]) for t in (q, k, v)))
        return out.view(batch, seqlen, *out.shape[1:])

    return call


class FlashAdapter:
    """Shared prepare() of the flash-attn style adapters (fa2, fa3, fa4).

    Subclasses set name, caps, description and implement `functions()` (lazy import of the
    package's (dense function, varlen function)) and `dense_call` / `varlen_call`."""

    layout = "bshd"
    name: str
    caps: object
    description: str

    def functions(self):
        raise NotImplementedError

    def dense_call(self, funcs, args: FlashMaskArgs, mask: Mask, device):
        func = funcs[0]
        causal, window = args.causal, args.window

        def call(q, k, v):
            return first_output(func(q, k, v, causal=causal, window_size=window))

        return call

    def varlen_call(self, funcs, args: FlashMaskArgs, device):
        import torch

        func = funcs[1]
        cu = torch.as_tensor(args.cu_seqlens, dtype=torch.int32, device=device)
        m, causal, window = args.max_seqlen, args.causal, args.window

        def call(q, k, v):
            return first_output(func(q, k, v, cu, cu, m, m, causal=causal, window_size=window))

        return call

    def extra_call(self, funcs, mask: Mask, form: str, *, heads_q: int, head_dim: int, device):
        """Forms beyond full/causal/window/varlen: (call, info)."""
        raise Unsupported(f"{self.name} takes no {form!r} form")

    def load(self):
        package = self.caps.package  # type: ignore[attr-defined]
        try:
            return self.functions()
        except ImportError as exc:
            raise Unsupported(f"{package} not installed ({exc})") from None

    def prepare(self, mask: Mask, *, batch: int, heads_q: int, heads_kv: int, head_dim: int, dtype, device, form: str):
        import time

        import torch

        from longca.kernels.base import Prepared

        device = torch.device(device)
        if form not in self.caps.mask_forms:  # type: ignore[attr-defined]
            raise Unsupported(f"{self.name} takes forms {sorted(self.caps.mask_forms)}, not {form!r}")  # type: ignore
        funcs = self.load()
        t0 = time.perf_counter()
        info: dict = {"form": form}
        if form in ("full", "causal", "window", "varlen"):
            args = flash_mask_args(mask, form, batch)
            if form == "varlen":  # documents packed: the kernel sees (B*S, H, D) views
                call = packed(self.varlen_call(funcs, args, device), batch, mask.seqlen_q)
            else:
                call = self.dense_call(funcs, args, mask, device)
            info.update(causal=args.causal, window=list(args.window))
            if args.cu_seqlens is not None:
                info.update(num_segments=len(args.cu_seqlens) - 1, max_seqlen=args.max_seqlen)
        else:
            call, extra = self.extra_call(funcs, mask, form, heads_q=heads_q, head_dim=head_dim, device=device)
            info.update(extra)
        sync(device)
        build_s = time.perf_counter() - t0
        # JIT compilation happens on the first call: the cell's first warm-up iteration measures it.
        return Prepared(call=call, layout=self.layout, build_s=build_s, info=info)
