"""Published figures of other people (longca/data/peers.csv): loaded, converted, selected for overlays.

They are references measured on other machines, never results: they get their own layer and marks
in charts, and their own table. Values are converted to longca's FLOP convention (exact mask area)
only where the publication's convention is known; otherwise they are drawn as published and say so.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import polars as pl

from longca.report.queries import SPARSE_MASKS

SCHEMA = {
    "source": pl.String,
    "kernel": pl.String,
    "gpu": pl.String,
    "mask": pl.String,
    "pass": pl.String,
    "dtype": pl.String,
    "seqlen_lo": pl.Int64,
    "seqlen_hi": pl.Int64,
    "tokens_per_gpu": pl.Int64,
    "ws_lo": pl.Int64,
    "ws_hi": pl.Int64,
    "heads_q": pl.Int64,
    "heads_kv": pl.Int64,
    "head_dim": pl.Int64,
    "block_size": pl.Int64,
    "density_lo": pl.Float64,
    "density_hi": pl.Float64,
    "unit": pl.String,
    "value_lo": pl.Float64,
    "value_hi": pl.Float64,
    "approximate": pl.Boolean,
    "flop_convention": pl.String,
    "note": pl.String,
}
CONVENTIONS = ("exact_area", "causal_half", "not_stated")


def default_path() -> Path:
    return Path(str(resources.files("longca") / "data" / "peers.csv"))


def load(path: str | Path | None = None) -> pl.DataFrame:
    """The peer figures with derived columns: exact-area values, attention type, shape and label."""
    df = pl.read_csv(path or default_path(), schema=SCHEMA)
    bad = df.filter(
        ~pl.col("flop_convention").is_in(CONVENTIONS)
        | pl.col("source").is_null()
        | pl.col("value_lo").is_null()
        | (pl.col("value_lo") > pl.col("value_hi"))
    )
    if bad.height:
        raise ValueError(f"peers file has {bad.height} malformed rows, first: {bad.row(0, named=True)}")
    s = pl.col("seqlen_lo").cast(pl.Float64)
    # FA-style benchmarks count a causal mask as S^2/2; the exact area is S(S+1)/2
    factor = (
        pl.when(
            (pl.col("flop_convention") == "causal_half")
            & (pl.col("mask") == "causal")
            & (pl.col("seqlen_lo") == pl.col("seqlen_hi"))
        )
        .then((s + 1) / s)
        .otherwise(1.0)
    )
    converted = pl.col("flop_convention").is_in(["causal_half", "exact_area"]) & (pl.col("unit") == "tflops")
    hq, hkv = pl.col("heads_q"), pl.col("heads_kv")
    attn = (
        pl.when(hkv.is_null())
        .then(pl.lit(None, pl.String))
        .when(hq == hkv)
        .then(pl.lit("MHA"))
        .when(hkv == 1)
        .then(pl.lit("MQA"))
        .otherwise(pl.lit("GQA"))
    )
    lo, hi = (pl.col(c).round(3).cast(pl.String).str.replace(r"\.0$", "") for c in ("value_lo", "value_hi"))
    fig = pl.when(pl.col("value_lo") == pl.col("value_hi")).then(lo).otherwise(pl.concat_str([lo, pl.lit("-"), hi]))
    return df.with_columns(
        y_lo=pl.when(converted).then(pl.col("value_lo") * factor).otherwise(pl.col("value_lo")),
        y_hi=pl.when(converted).then(pl.col("value_hi") * factor).otherwise(pl.col("value_hi")),
        converted=converted,
        attn=attn,
        figure=pl.concat_str(
            [pl.when(pl.col("approximate")).then(pl.lit("~")).otherwise(pl.lit("")), fig, pl.lit(" "), pl.col("unit")]
        ),
        peer_shape=pl.concat_str(
            [
                pl.lit("H="),
                hq.cast(pl.String),
                pl.lit(":"),
                hkv.cast(pl.String),
                pl.lit(" D="),
                pl.col("head_dim").cast(pl.String),
            ],
            ignore_nulls=False,
        ).fill_null("-"),
    ).with_columns(
        label=pl.concat_str(
            [
                pl.col("kernel"),
                pl.lit(" "),
                pl.when(pl.col("approximate")).then(pl.lit("~")).otherwise(pl.lit("")),
                fig,
                pl.lit(" · "),
                pl.col("gpu"),
                pl.lit(" (published)"),
            ]
        ),
    )


def for_masks(peers: pl.DataFrame) -> pl.DataFrame:
    """Single-device TFLOP/s figures at known lengths, for the per-mask throughput charts."""
    return peers.filter(
        (pl.col("unit") == "tflops")
        & pl.col("mask").is_not_null()
        & pl.col("seqlen_lo").is_not_null()
        & pl.col("ws_lo").is_null()
        & pl.col("attn").is_not_null()
        & ~pl.col("mask").is_in(SPARSE_MASKS)
    ).with_columns(x_lo=pl.col("seqlen_lo").cast(pl.Float64), x_hi=pl.col("seqlen_hi").cast(pl.Float64))


def for_sparse(peers: pl.DataFrame) -> pl.DataFrame:
    return peers.filter((pl.col("unit") == "tflops") & pl.col("mask").is_in(SPARSE_MASKS))


def for_cp(peers: pl.DataFrame) -> pl.DataFrame:
    return peers.filter((pl.col("unit") == "tflops") & pl.col("ws_lo").is_not_null())
