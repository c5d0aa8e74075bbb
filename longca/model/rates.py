"""What a local attention call runs at: measured single-GPU TFLOP/s of a kernel on a mask, by
length, interpolated.

The CP model (longca.model.cp) times each traced step of a rank by its FLOPs over this rate: the
rate of the same kernel, pass, heads, head dim and dtype on one GPU of the cluster's model, for the
step's mask kind, at the step's query length (log-linear between measured lengths, held at the
ends). A full or causal mask's steps use the full rate, or the causal one for a step that holds a
diagonal; every other mask's steps use that mask's own rate at the step's length (the documents of
a shorter sequence are drawn from the same distribution). Launch and combination costs are in
the measured rates only as far as they are in a single call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from longca.kernels.base import Unsupported

KEY = ("kernel", "mask", "pass", "heads_q", "heads_kv", "head_dim", "dtype")


@dataclass
class Rates:
    """Median TFLOP/s per measured length for each (kernel, mask, pass, heads, head dim, dtype)."""

    gpu: str
    curves: dict[tuple, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def tflops(
        self, kernel: str, mask: str, pass_: str, heads_q: int, heads_kv: int, head_dim: int, dtype: str, seqlen: int
    ) -> float:
        key = (kernel, mask, pass_, heads_q, heads_kv, head_dim, dtype)
        if key not in self.curves:
            raise Unsupported(
                f"no measured single-GPU rate on {self.gpu} for {kernel} on {mask} {pass_} "
                f"(heads {heads_q}:{heads_kv}, head dim {head_dim}, {dtype})"
            )
        lengths, rates = self.curves[key]
        return float(np.interp(np.log2(max(seqlen, 1)), np.log2(lengths), rates))

    def lengths(self, kernel: str, mask: str, pass_: str) -> list[int]:
        return sorted({int(x) for k, (ls, _) in self.curves.items() if k[:3] == (kernel, mask, pass_) for x in ls})


def load_rates(paths: Sequence[str | Path], gpu: str) -> Rates:
    """Rates from aggregates of measured rows: ok single-GPU rows of devices whose name contains
    `gpu`, the median over rows (draws, sweeps) of each cell's length."""
    frames = []
    for p in paths:
        df = pl.read_parquet(p, columns=[*KEY, "seqlen_q", "status", "world_size", "device_name", "tflops"])
        frames.append(df)
    if not frames:
        raise ValueError("the CP model needs measured rows: give at least one aggregate (--rates)")
    rows = pl.concat(frames, how="diagonal_relaxed").filter(
        (pl.col("status") == "ok")
        & (pl.col("world_size") == 1)
        & pl.col("device_name").str.contains(gpu, literal=True)
        & pl.col("tflops").is_not_null()
    )
    if rows.is_empty():
        raise ValueError(f"no ok single-GPU rows of a {gpu!r} device in {', '.join(map(str, paths))}")
    med = rows.group_by(*KEY, "seqlen_q").agg(pl.col("tflops").median()).sort(*KEY, "seqlen_q")
    out = Rates(gpu)
    for key, part in med.group_by(list(KEY), maintain_order=True):
        out.curves[tuple(key)] = (
            part.get_column("seqlen_q").to_numpy().astype(np.float64),
            part.get_column("tflops").to_numpy().astype(np.float64),
        )
    return out
