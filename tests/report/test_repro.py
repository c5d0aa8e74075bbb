"""The commands that re-measure a row's cell, or a table line's cells, select exactly those cells."""

from __future__ import annotations

import shlex

import polars as pl

from longca.report.repro import repro_command, selection_columns, with_selection_repro
from longca.run.rows import cell_columns
from longca.spec.cells import expand
from longca.spec.load import load_spec
from longca.spec.select import selector

SPEC = """
name: r
device: cpu
kernels: [naive]
masks: [causal, {name: sliding_window, window: 64}, {name: sliding_window, window: 128}]
seqlens: [256]
heads: ["4:4"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps:
  - name: one
  - name: cp
    cp: {mechanisms: [usp, ring_p2p], world_sizes: [4], backend: gloo}
"""


def _chosen(cells, command: str) -> list:
    args = shlex.split(command)
    sweeps = [args[i + 1] for i, a in enumerate(args) if a == "--sweep"]
    only = [args[i + 1] for i, a in enumerate(args) if a == "--only"]
    return [c for c in cells if selector(only, sweeps)(c)]


def test_every_cell_is_selected_alone_by_its_row_command():
    cells = expand(load_spec(text=SPEC))
    usp = [c for c in cells if c.cp_mechanism == "usp"]
    # USP at 4 GPUs tries every Ulysses degree: several cells differ only in their CP variant
    assert len({c.cp_variant for c in usp}) > 1
    for cell in cells:
        assert _chosen(cells, repro_command(cell_columns(cell))) == [cell]


def test_a_line_command_selects_its_cells_over_the_omitted_axes():
    cells = expand(load_spec(text=SPEC))
    rows = pl.DataFrame([cell_columns(c) for c in cells if c.world_size == 1])
    lines = with_selection_repro(
        rows.group_by("mask", "mask_variant").agg(
            *[
                pl.col(k).first()
                for k in ("kernel", "seqlen_q", "heads_q", "heads_kv", "head_dim", "dtype", "pass", "batch")
            ],
            *selection_columns(),
        ),
        omit=("kernel",),
    )
    assert "_specs" not in lines.columns and "_sweeps" not in lines.columns
    for line in lines.iter_rows(named=True):
        chosen = _chosen(cells, line["repro"])
        assert chosen and {(c.mask, c.mask_variant, c.sweep) for c in chosen} == {
            (line["mask"], line["mask_variant"], "one")
        }


def test_a_line_from_two_specs_has_no_command():
    rows = pl.DataFrame([{"mask": "full", "spec": "a", "sweep": "x"}, {"mask": "full", "spec": "b", "sweep": "x"}])
    lines = with_selection_repro(rows.group_by("mask").agg(*selection_columns()), omit=())
    assert lines.get_column("repro").to_list() == [None]
