from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from longca.report import peers


def test_shipped_file_is_complete() -> None:
    p = peers.load()
    assert p.height > 0
    for col in ("source", "gpu", "unit", "value_lo", "flop_convention"):
        assert p.get_column(col).null_count() == 0, col
    assert (p.get_column("value_lo") <= p.get_column("value_hi")).all()
    # every figure is labelled as published, so a chart can never pass it off as measured
    assert p.get_column("label").str.ends_with("(published)").all()


def test_causal_half_is_converted_to_exact_area() -> None:
    p = peers.load()
    fa3 = p.filter((pl.col("kernel") == "FA3") & (pl.col("head_dim") == 128) & (pl.col("dtype") == "fp16"))
    full = fa3.filter(pl.col("mask") == "full").row(0, named=True)
    causal = fa3.filter(pl.col("mask") == "causal").row(0, named=True)
    assert full["y_lo"] == full["value_lo"]
    # published with S^2/2 FLOPs; the exact causal area is S(S+1)/2
    assert causal["y_lo"] == pytest.approx(causal["value_lo"] * (16384 + 1) / 16384)


def test_unknown_convention_is_drawn_as_published() -> None:
    p = peers.load().filter(pl.col("flop_convention") == "not_stated")
    assert (p.get_column("y_lo") == p.get_column("value_lo")).all()


def test_overlay_selections_are_disjoint_by_family() -> None:
    p = peers.load()
    masks, sparse, cp = peers.for_masks(p), peers.for_sparse(p), peers.for_cp(p)
    assert masks.height and sparse.height and cp.height
    assert masks.filter(pl.col("mask").is_in(["block_sparse", "variable_block_sparse"])).is_empty()
    assert masks.get_column("ws_lo").null_count() == masks.height
    assert (pl.concat([masks, sparse, cp], how="diagonal_relaxed").get_column("unit") == "tflops").all()


def test_malformed_file_is_rejected(tmp_path: Path) -> None:
    text = peers.default_path().read_text().splitlines()
    bad = tmp_path / "peers.csv"
    bad.write_text("\n".join([text[0], text[1].replace("causal_half", "whatever")]) + "\n")
    with pytest.raises(ValueError, match="malformed"):
        peers.load(bad)
