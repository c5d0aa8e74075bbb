"""The modelled CP page: drawn from model tables only, with its assumptions and validation."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from longca.report import build_report
from longca.report.cp_model import best_variants, load_models

MODEL = [
    dict(
        source="model",
        cluster="c1",
        assumptions="c1: 2 nodes of 8 x G; ...",
        sweep="s",
        mask="causal",
        **{"pass": "fwd"},
        world_size=w,
        cp_mechanism=m,
        cp_variant=v,
        tokens_per_gpu=768 * 1024 // w,
        seqlen_q=768 * 1024,
        status="ok",
        reason=None,
        tflops=t,
        median_ms=1.0,
        spec="x",
    )
    for w, m, v, t in [
        (8, "ring_p2p", "ring8-zigzag", 500.0),
        (16, "ring_p2p", "ring16-zigzag", 450.0),
        (8, "usp", "ulysses4-ring2-zigzag", 480.0),
        (8, "usp", "ulysses8-ring1-zigzag", 520.0),
        (16, "usp", "ulysses8-ring2-zigzag", 470.0),
    ]
] + [
    dict(
        source="model",
        cluster="c1",
        assumptions="c1: 2 nodes of 8 x G; ...",
        sweep="s",
        mask="causal",
        **{"pass": "fwd"},
        world_size=96,
        cp_mechanism="ulysses",
        cp_variant="ulysses96-contiguous",
        tokens_per_gpu=8192,
        seqlen_q=768 * 1024,
        status="unsupported",
        reason="heads_q=64 is not divisible by the Ulysses degree 96",
        tflops=None,
        median_ms=None,
        spec="x",
    )
]


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "model.parquet"
    pl.DataFrame(rows).write_parquet(path)
    return path


def test_each_mechanism_is_drawn_at_its_fastest_variant(tmp_path):
    lines = best_variants(load_models([_write(tmp_path, MODEL)]))
    usp8 = lines.filter((pl.col("cp_mechanism") == "usp") & (pl.col("world_size") == 8))
    assert usp8.height == 1 and usp8.item(0, "cp_variant") == "ulysses8-ring1-zigzag"
    assert set(lines.get_column("panel")) == {"causal · S = 768K (48K-96K tokens/GPU) · c1"}


def test_a_measured_table_is_not_a_model_table(rows_path):
    with pytest.raises(ValueError, match="not a model table"):
        load_models([rows_path])


def test_the_page_draws_the_model_and_states_its_assumptions(tmp_path, rows_path):
    validation = tmp_path / "validation.csv"
    pl.DataFrame(
        [
            dict(
                check="measured",
                mechanism="ring_p2p",
                mask="causal",
                **{"pass": "fwd"},
                world_size=2,
                seqlen=65536,
                heads="64:8",
                kernel="k",
                detail="d",
                measured=10.0,
                predicted=9.0,
                error=-0.1,
                unit="ms",
                note="n",
            )
        ]
    ).write_csv(validation)
    out = tmp_path / "site"
    build_report(
        [rows_path],
        out,
        png=False,
        static_exports=False,
        model_tables=[_write(tmp_path, MODEL)],
        model_validation=validation,
    )
    html = (out / "cp-model.html").read_text()
    assert "CP at scale (modelled)" in html and "c1: 2 nodes of 8 x G" in html
    assert "heads_q=64 is not divisible by the Ulysses degree 96" in html  # refused cells are listed
    assert "cp-model-validation" in (out / "assets" / "data.js").read_text()
    assert 'href="cp-model.html"' in (out / "index.html").read_text()


def test_without_a_model_the_page_is_not_offered(site):
    assert 'href="cp-model.html"' not in (site / "index.html").read_text()
