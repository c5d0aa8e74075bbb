"""One minimal result row for the store's tests (a single-device forward cell of the naive kernel)."""


def store_row(cell: str, **columns) -> dict:
    """A row of cell `cell` (its id and digest); `columns` override or add any column."""
    row = {
        "spec": "s",
        "sweep": "w",
        "cell_id": cell,
        "cell_digest": cell,
        "kernel": "naive",
        "mask": "full",
        "mask_variant": "default",
        "pass": "fwd",
        "seqlen_q": 8,
        "seqlen_k": 8,
        "batch": 1,
        "heads_q": 1,
        "heads_kv": 1,
        "head_dim": 8,
        "dtype": "float32",
        "world_size": 1,
        "status": "ok",
        "median_ms": 1.0,
        "samples_ms": [1.0, 1.0],
        "cell_wall_s": 1.0,
    }
    row.update(columns)
    return row
