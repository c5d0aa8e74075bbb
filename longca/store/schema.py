"""The versioned Arrow schema of a result row: the contract users' SQL relies on.

Columns are only ever added (with a schema_version bump); none is renamed or removed.
Nested or variable data (per-iteration samples, per-rank figures, mask parameters) is stored as
lists or JSON strings so one schema serves kernel, sparse, linear and context-parallel rows.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from longca.vocab import Status

SCHEMA_VERSION = (
    8  # 2: phase times check_s, timer_wall_s, warmup_s; 3: cooldown_s; 4: ci_*; 5: clock_window_*, graph_*;
)
# 6: agree_* (full-length agreement); 7: agree_rel_diff_dq/dk/dv (its gradients); 8: host_cpu

STATUSES = tuple(s.value for s in Status)

_FIELDS: list[tuple[str, pa.DataType, str]] = [
    # identity
    ("schema_version", pa.int32(), "version of this schema"),
    ("spec", pa.string(), "spec name"),
    ("sweep", pa.string(), "sweep (matrix) name inside the spec"),
    ("cell_id", pa.string(), "stable, readable id of the cell"),
    ("cell_digest", pa.string(), "hash of every field that defines the cell"),
    ("run_id", pa.string(), "id of the process run that measured the row"),
    ("env_id", pa.string(), "hash of the environment facts (machine, versions)"),
    ("kernel", pa.string(), "kernel adapter name"),
    ("kernel_family", pa.string(), "softmax | linear"),
    ("pass", pa.string(), "fwd | bwd | fwd_bwd"),
    # shape
    ("batch", pa.int32(), ""),
    ("seqlen_q", pa.int64(), "query tokens (per batch element, global for CP)"),
    ("seqlen_k", pa.int64(), ""),
    ("heads_q", pa.int32(), ""),
    ("heads_kv", pa.int32(), ""),
    ("head_dim", pa.int32(), ""),
    ("head_dim_v", pa.int32(), ""),
    ("dtype", pa.string(), ""),
    ("layout", pa.string(), "bshd | bhsd | thd"),
    # mask
    ("mask", pa.string(), "mask pattern name"),
    ("mask_family", pa.string(), "regular | heterogeneous | dynamic"),
    ("mask_variant", pa.string(), "label of the spec's mask parameters (path key)"),
    ("mask_params", pa.string(), "JSON of the resolved mask parameters"),
    ("mask_form", pa.string(), "form handed to the kernel (causal, varlen, blockmask, dense, ...)"),
    ("distribution", pa.string(), "document length distribution, if any"),
    ("seed", pa.int64(), ""),
    ("mask_sample", pa.int32(), "sample index of a sampled mask"),
    ("mask_samples", pa.int32(), "samples taken for this cell"),
    ("num_documents", pa.int32(), ""),
    ("mask_area", pa.int64(), "exact attended (q, k) pairs per head, summed over the batch"),
    ("density", pa.float64(), "mask_area / (batch * Sq * Sk)"),
    ("block_size", pa.int32(), "block-sparse block size"),
    ("score_source", pa.string(), "block-sparse scores: random | importance"),
    ("variable_blocks", pa.bool_(), ""),
    # context parallelism
    ("world_size", pa.int32(), "processes (GPUs) of the cell; 1 for a single device"),
    ("cp_mechanism", pa.string(), "null for a single device"),
    ("cp_degrees", pa.string(), 'JSON, e.g. {"ulysses": 2, "ring": 2}'),
    ("cp_variant", pa.string(), "label of degrees and balancing (path key)"),
    ("cp_balance", pa.string(), "sharding: contiguous | zigzag | document"),
    ("rank_ms", pa.list_(pa.float64()), "median time per rank"),
    ("rank_area", pa.list_(pa.int64()), "attended area computed by each rank"),
    ("rank_bytes_sent", pa.list_(pa.int64()), "bytes sent per rank per iteration"),
    ("rank_peak_mem_bytes", pa.list_(pa.int64()), ""),
    (
        "comm_exposed_ms",
        pa.float64(),
        "communication time not hidden behind compute: median iteration minus median with communication "
        "replaced by no-ops (noise can make it slightly negative; not clipped)",
    ),
    # timing
    (
        "timer",
        pa.string(),
        "cuda_events | cpu_monotonic | do_bench; '+retained_graph' appended when every "
        "backward sample ran on one forward's graph (repeat.backward: retained_graph)",
    ),
    ("warmup_iters", pa.int32(), "warm-up iterations run (fewer than the spec's count when repeat.warmup_s cut them)"),
    ("timed_iters", pa.int32(), ""),
    ("l2_flush", pa.bool_(), ""),
    ("samples_ms", pa.list_(pa.float64()), "per-iteration times"),
    ("median_ms", pa.float64(), ""),
    ("p20_ms", pa.float64(), ""),
    ("p80_ms", pa.float64(), ""),
    (
        "ci_low_ms",
        pa.float64(),
        "low end of the distribution-free 95% interval of the median, from the order statistics of "
        "samples_ms (docs/measurement.md; since v4)",
    ),
    ("ci_high_ms", pa.float64(), "high end of that interval (since v4)"),
    (
        "ci_target",
        pa.float64(),
        "the relative half-width the adaptive protocol sampled for (repeat.ci_target); null without it (since v4)",
    ),
    (
        "ci_met",
        pa.bool_(),
        "whether the interval reached ci_target (at least 6 samples and within +-ci_target of the "
        "median) before iters or budget_s ran out; null without a target (since v4)",
    ),
    (
        "graph_median_ms",
        pa.float64(),
        "median of the call captured in a CUDA graph and replayed (repeat.graph; since v5)",
    ),
    ("graph_ci_low_ms", pa.float64(), "low end of the 95% interval of that median (since v5)"),
    ("graph_ci_high_ms", pa.float64(), "high end of that interval (since v5)"),
    ("graph_reason", pa.string(), "why a cell that asked for graph replay has none (since v5)"),
    ("mask_build_s", pa.float64(), "mask construction, outside kernel time"),
    ("compile_s", pa.float64(), "first warm-up call beyond a steady one (compilation, autotune), outside kernel time"),
    (
        "cell_wall_s",
        pa.float64(),
        "wall time of the whole cell (of a cell finished across runs: the finishing run's, plus the walls "
        "of the draws earlier runs kept)",
    ),
    (
        "check_s",
        pa.float64(),
        "wall seconds the cell spent in its correctness check (0 when the check came from "
        "the process's cache); the cell's, repeated on each of its rows (since v2)",
    ),
    (
        "timer_wall_s",
        pa.float64(),
        "wall seconds of this row's timer call: warm-up, untimed calls before each "
        "timed one (fresh forwards), L2 flushes, timed calls (since v2)",
    ),
    (
        "warmup_s",
        pa.float64(),
        "wall seconds of this row's warm-up iterations, compile_s included; capped by "
        "the spec's repeat.warmup_s if set (since v2)",
    ),
    (
        "cooldown_s",
        pa.float64(),
        "wall seconds idle before this row's measurement (the spec's repeat.cooldown_s, "
        "for the GPU clock to recover); 0 without one (since v3)",
    ),
    ("flops", pa.float64(), "FLOPs of one timed iteration (exact mask area)"),
    ("flop_model", pa.string(), "softmax_exact_area | linear_<family>"),
    ("tflops", pa.float64(), "flops / median time; per-GPU for CP"),
    ("tokens_per_s", pa.float64(), "batch * seqlen_q / median time"),
    ("peak_mem_bytes", pa.int64(), "peak allocated device memory"),
    # numerics
    ("rel_err_out", pa.float64(), "||out - ref|| / ||ref||"),
    ("rel_err_dq", pa.float64(), ""),
    ("rel_err_dk", pa.float64(), ""),
    ("rel_err_dv", pa.float64(), ""),
    ("check_seqlen", pa.int64(), "length at which the correctness check ran"),
    (
        "agree_kernel",
        pa.string(),
        "the second kernel this draw's output was compared with at the full length (check.agree_with, "
        "cells longer than check_seqlen; since v6)",
    ),
    ("agree_rel_diff", pa.float64(), "||out - out_agree_kernel|| / ||out_agree_kernel|| at the full length (since v6)"),
    (
        "agree_rel_diff_dq",
        pa.float64(),
        "||dq - dq_agree_kernel|| / ||dq_agree_kernel|| at the full length, cells with a backward (since v7)",
    ),
    (
        "agree_rel_diff_dk",
        pa.float64(),
        "||dk - dk_agree_kernel|| / ||dk_agree_kernel|| at the full length, cells with a backward (since v7)",
    ),
    (
        "agree_rel_diff_dv",
        pa.float64(),
        "||dv - dv_agree_kernel|| / ||dv_agree_kernel|| at the full length, cells with a backward (since v7)",
    ),
    (
        "agree_reason",
        pa.string(),
        "why a cell that asked for agreement has none: no listed kernel served it (since v6)",
    ),
    (
        "backend",
        pa.string(),
        "what actually ran (SDPA: flash / efficient / cudnn / math; "
        "Triton block-sparse: its tiles; fla: version, function, chunk)",
    ),
    # status
    ("status", pa.string(), "ok | unsupported | oom | error | timeout | incorrect"),
    ("reason", pa.string(), "why, for every status but ok"),
    # environment (a chosen list of facts, never the whole environment)
    ("device", pa.string(), "cpu | cuda"),
    ("device_name", pa.string(), ""),
    ("device_count", pa.int32(), ""),
    ("compute_capability", pa.string(), ""),
    ("driver", pa.string(), ""),
    ("cuda", pa.string(), ""),
    ("torch", pa.string(), ""),
    ("cudnn", pa.string(), ""),
    ("triton", pa.string(), ""),
    ("packages", pa.string(), "JSON of relevant package versions"),
    ("host", pa.string(), "host name"),
    (
        "host_cpu",
        pa.string(),
        "the host's CPU model: short calls are mostly its work per call, so their eager times move with it (since v8)",
    ),
    ("git_commit", pa.string(), ""),
    ("longca_version", pa.string(), ""),
    ("clock_start_mhz", pa.int32(), "SM clock at cell start"),
    ("clock_end_mhz", pa.int32(), ""),
    ("throttle_reasons", pa.string(), ""),
    ("clock_window_mhz", pa.int32(), "median SM clock sampled during the timed window (lowest rank for CP)"),
    ("clock_window_min_mhz", pa.int32(), "lowest SM clock sampled during the timed window"),
    ("throttle_window", pa.string(), "every throttle reason seen during the timed window (hex of NVML's mask)"),
    ("timestamp", pa.timestamp("us", tz="UTC"), "when the row was measured"),
]

SCHEMA = pa.schema([pa.field(n, t, nullable=True, metadata={"doc": d} if d else None) for n, t, d in _FIELDS])
COLUMNS = [n for n, _, _ in _FIELDS]
REQUIRED = (
    "kernel",
    "mask",
    "pass",
    "seqlen_q",
    "seqlen_k",
    "batch",
    "heads_q",
    "heads_kv",
    "head_dim",
    "dtype",
    "world_size",
    "cp_mechanism",
    "status",
    "reason",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "tflops",
    "mask_area",
    "peak_mem_bytes",
    "device_name",
    "schema_version",
)


def to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (dicts) -> a table with exactly SCHEMA; unknown keys are a bug and raise."""
    for row in rows:
        extra = set(row) - set(COLUMNS)
        if extra:
            raise KeyError(f"row has columns outside the schema: {sorted(extra)}")
        if row.get("status") not in STATUSES:
            raise ValueError(f"status {row.get('status')!r} not in {STATUSES}")
    cols = {}
    for f in SCHEMA:
        vals = []
        for row in rows:
            v = row.get(f.name)
            if f.name == "schema_version" and v is None:
                v = SCHEMA_VERSION
            if isinstance(v, (dict, tuple)) and pa.types.is_string(f.type):
                v = json.dumps(v, sort_keys=True)
            vals.append(v)
        cols[f.name] = pa.array(vals, type=f.type)
    return pa.table(cols, schema=SCHEMA)


def conform(table: pa.Table) -> pa.Table:
    """Reorder, cast and null-fill `table` to SCHEMA (rows of an older schema version read as current
    ones); a column the schema does not know is dropped."""
    cols = []
    for f in SCHEMA:
        if f.name in table.column_names:
            cols.append(table.column(f.name).cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, type=f.type))
    return pa.table(cols, schema=SCHEMA)


def schema_markdown() -> str:
    """The README's schema table, generated from the one definition above."""
    lines = ["| column | type | meaning |", "| --- | --- | --- |"]
    for n, t, d in _FIELDS:
        cell = d.replace("|", "\\|")  # a bare | would end the Markdown table cell
        lines.append(f"| `{n}` | {t} | {cell} |")
    return "\n".join(lines)
