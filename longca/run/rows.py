"""The one row builder: identity, shape, mask, CP and environment columns of a cell, the timing
columns of a measurement, the status of a failure. Single-device workers, CP ranks and the chunk
supervisor (timeouts, crashes) all build rows here, so every row of a spec has the same columns
with the same meaning.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import torch

from longca.cp.mechanisms import resolve_degrees
from longca.kernels.base import Unsupported
from longca.masks.mask import Mask
from longca.measure.env import environment
from longca.measure.flops import attention_flops
from longca.measure.peak import peak_tflops
from longca.measure.timer import Timing
from longca.spec.cells import Cell
from longca.vocab import Layout, Status

RUN_ID = uuid.uuid4().hex[:12]  # one per process: rows of one run share it


def _cp_degrees(cell: Cell) -> str | None:
    """The resolved degrees of a CP cell as JSON ({"ulysses", "ring", "windows"}), or None."""
    if cell.cp_mechanism is None:
        return None
    try:
        u, r, w = resolve_degrees(cell.cp_mechanism, cell.world_size, dict(cell.cp_degrees))
    except ValueError:
        return json.dumps(dict(cell.cp_degrees), sort_keys=True)
    return json.dumps({"ulysses": u, "ring": r, "windows": w}, sort_keys=True)


def cell_columns(cell: Cell) -> dict[str, Any]:
    """The columns a cell's rows share, measured or modelled: identity, shape, mask and CP layout."""
    pattern = cell.pattern
    return {
        "spec": cell.spec,
        "sweep": cell.sweep,
        "cell_id": cell.id,
        "cell_digest": cell.digest,
        "kernel": cell.kernel,
        "pass": cell.pass_,
        "batch": cell.batch,
        "seqlen_q": cell.seqlen,
        "seqlen_k": cell.seqlen,
        "heads_q": cell.heads_q,
        "heads_kv": cell.heads_kv,
        "head_dim": cell.head_dim,
        "head_dim_v": cell.head_dim,
        "dtype": cell.dtype,
        "mask": cell.mask,
        "mask_family": pattern.family if pattern else None,
        "mask_variant": cell.mask_variant,
        "mask_params": json.dumps(dict(cell.mask_params), sort_keys=True),
        "seed": cell.seed,
        "mask_samples": cell.samples,
        "world_size": cell.world_size,
        "cp_mechanism": cell.cp_mechanism,
        "cp_variant": cell.cp_variant,
        "cp_degrees": _cp_degrees(cell),
        "cp_balance": cell.cp_balance,
    }


def base_row(cell: Cell) -> dict[str, Any]:
    """Identity, shape, mask, CP and environment columns of a cell (no measurement)."""
    pattern = cell.pattern
    row = {**cell_columns(cell), "run_id": RUN_ID, "timestamp": datetime.now(UTC)}
    try:
        kernel = cell.adapter
        row["kernel_family"] = kernel.caps.family
        # CP per-rank kernels take (B, H, S, D) shards
        row["layout"] = Layout.BHSD.value if cell.cp_mechanism else kernel.layout
    except KeyError:
        pass
    device = cell.device if cell.device != "cuda" or torch.cuda.is_available() else "cpu"
    row.update(environment(device))
    if cell.cp_mechanism:
        row["device_count"] = cell.world_size  # the cell's processes, not the host's devices
        is_sparse = pattern is not None and pattern.family == "dynamic"
        row["mask_form"] = "block_sparse" if is_sparse else "slices"
    return row


def status_row(cell: Cell, status: str, reason: str | None, **extra: Any) -> dict[str, Any]:
    """The row of a cell that ends without a measurement (or with a failed one)."""
    row = base_row(cell)
    row.update(status=Status(status).value, reason=reason, **extra)
    return row


def mask_columns(mask: Mask, sample: int) -> dict[str, Any]:
    """The columns of one drawn mask: which draw, its resolved parameters, documents and density."""
    row = {
        "mask_sample": sample,
        "density": mask.density,
        "num_documents": len(mask.documents) if mask.documents else None,
        "distribution": mask.params.get("distribution"),
        "mask_params": json.dumps(mask.params, sort_keys=True, default=str),
    }
    if mask.blocks is not None:  # block-sparse masks
        row.update(
            block_size=mask.params.get("block"),
            score_source=mask.params.get("score"),
            variable_blocks="block" not in mask.params,  # blocks of one size have a `block` size
        )
    return row


def timing_columns(timing: Timing, flops: float, tokens: int, world: int = 1) -> dict[str, Any]:
    """The timing and throughput columns of one measurement. `flops`: the whole iteration's (all
    ranks); per-GPU TFLOP/s divides by `world`."""
    med = timing.median_ms
    ci = timing.ci
    return {
        "timer": timing.timer,
        "warmup_iters": timing.warmup_iters,
        "timed_iters": timing.timed_iters,
        "l2_flush": timing.l2_flush,
        "samples_ms": timing.samples_ms,
        "median_ms": med,
        "p20_ms": timing.p20_ms,
        "p80_ms": timing.p80_ms,
        "ci_low_ms": ci.low,
        "ci_high_ms": ci.high,
        "ci_target": timing.ci_target,
        "ci_met": timing.ci_met,
        "warmup_s": timing.warmup_wall_s,
        "timer_wall_s": timing.wall_s,
        "flops": flops,
        "flop_model": "softmax_exact_area",
        "tflops": flops / (med * 1e-3 * world) / 1e12,
        "tokens_per_s": tokens / (med * 1e-3),
    }


def softmax_flops(area_per_head: float, cell: Cell) -> float:
    """FLOPs of one iteration of a softmax cell from its exact attended area per head (batch summed)."""
    return attention_flops(area_per_head, cell.heads_q, cell.head_dim, cell.pass_)


def gate_peak(row: dict[str, Any], device: torch.device) -> None:
    """A throughput above the device's dense peak is a bug: the row becomes an `error` saying so."""
    peak, source = peak_tflops(device, environment(device.type)["device_name"], row["dtype"])
    if row.get("tflops") is not None and row["tflops"] > peak:
        row["status"] = Status.ERROR.value
        row["reason"] = (
            f"throughput {row['tflops']:.1f} TFLOP/s above the device peak {peak:.1f} ({source}): "
            "a measurement or FLOP-count bug, not a result"
        )


def classify(exc: BaseException) -> tuple[str, str]:
    """(status, reason) of an exception raised while running a cell."""
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:500]  # never empty: it starts with the type
    if isinstance(exc, Unsupported):
        return Status.UNSUPPORTED.value, str(exc)[:500]
    lowered = text.lower()
    # CUDA's OutOfMemoryError, an adapter's own message, and the CPU allocator's refusal
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in lowered or "can't allocate memory" in lowered:
        return Status.OOM.value, first
    if "No available kernel" in text:
        return Status.UNSUPPORTED.value, first
    return Status.ERROR.value, first


LINE_MAX = 150  # a terminal line per cell, never longer (the whole reason is in the row)


def summarize(rows: list[dict[str, Any]]) -> str:
    """A cell's outcome in a few words: status, median time and TFLOP/s (median over its rows), or
    the status and the first line of its reason (an OOM message runs to a paragraph)."""
    import numpy as np

    r = rows[0]
    if r["status"] == Status.OK:
        med = float(np.median([x["median_ms"] for x in rows]))
        tf = float(np.median([x["tflops"] for x in rows]))
        return f"ok {med:.3f} ms {tf:.1f} TFLOP/s"
    first = next((line.strip() for line in str(r["reason"]).splitlines() if line.strip()), "")
    return f"{r['status']}: {first}"


def _length(n: int) -> str:
    for size, unit in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def cell_line(cell: Cell, outcome: str, progress: tuple[int, int] | None = None) -> str:
    """The terminal's one line for a cell (`outcome`: `summarize` of its rows, or what happened to
    it): its place in its job, what it is (kernel, mask, length, heads, head dim, dtype, pass; the
    CP mechanism and world size) and the outcome, at most LINE_MAX characters with the prefix."""
    mask = cell.mask if cell.mask_variant == "default" else f"{cell.mask}({cell.mask_variant})"
    what = (
        f"{cell.kernel} {mask} {_length(cell.seqlen)} {cell.heads_q}:{cell.heads_kv} d{cell.head_dim} "
        f"{cell.dtype} {cell.pass_}"
    )
    if cell.cp_mechanism is not None:
        what += f" {cell.cp_mechanism} x{cell.world_size}"
    where = f"{progress[0]}/{progress[1]} " if progress else ""
    return clip_line(f"[longca] {where}{what}: {' '.join(outcome.split())}")


def clip_line(line: str) -> str:
    """A terminal line cut to LINE_MAX characters, marked where it was cut."""
    return line if len(line) <= LINE_MAX else line[: LINE_MAX - 3] + "..."


def place(before: int, index: int, total: int) -> tuple[int, int] | None:
    """A cell's place in its job for its terminal line: the `index`-th (from 0) of a group that
    follows `before` cells of a job of `total` (None where the total is not known)."""
    return (before + index + 1, total) if total else None
