"""How far the CP model is from what was measured: one table, three kinds of check.

- `measured`: every ok measured CP row (e.g. results/h200-cp: 2 x H200) whose cell is still in its
  spec, against the model of that cell on a cluster file of the machine (predicted / measured - 1).
- `rank_local`: each rank's local work timed on one GPU (benchmarks/cp_rank_local.py output)
  against the model's compute time of that rank (no communication in either).
- `ranking`: per pass and world size of a published CP benchmark (MagiAttention's, a data file
  with its source), the order of the mechanisms by per-GPU TFLOP/s against the model's order
  (each mechanism at its fastest modelled variant), from a model table at the same tokens per GPU.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import polars as pl

from longca.kernels.base import Unsupported
from longca.model.cluster import Cluster
from longca.model.cp import model_cell
from longca.model.rates import Rates

COLUMNS = (
    "check",
    "mechanism",
    "mask",
    "pass",
    "world_size",
    "seqlen",
    "heads",
    "kernel",
    "detail",
    "measured",
    "predicted",
    "error",
    "unit",
    "note",
)


def against_measured(rows_path: str | Path, spec_path: str | Path, cluster: Cluster, rates: Rates) -> list[dict]:
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    cells = {c.digest: c for c in expand(load_spec(spec_path)) if c.cp_mechanism}
    measured = pl.read_parquet(rows_path).filter(pl.col("status") == "ok")
    out = []
    for row in measured.iter_rows(named=True):
        cell = cells.get(row["cell_digest"])
        if cell is None:
            continue
        try:
            m = model_cell(cell, cluster, rates)
        except Unsupported:
            continue
        pred = m.timeline.seconds * 1e3
        out.append(
            _row(
                "measured",
                cell.cp_mechanism,
                cell.mask,
                cell.pass_,
                cell.world_size,
                cell.seqlen,
                f"{cell.heads_q}:{cell.heads_kv}",
                cell.kernel,
                f"{cell.cp_variant}; measured {str(row.get('timestamp'))[:10]} at {str(row.get('git_commit'))[:8]}",
                row["median_ms"],
                pred,
                "ms per iteration",
                f"modelled comm exposed {(m.timeline.seconds - m.compute_only.seconds) * 1e3:.1f} ms, "
                f"measured {row.get('comm_exposed_ms') or float('nan'):.1f} ms",
            )
        )
    return out


def against_rank_local(paths: Sequence[str | Path], cluster: Cluster, rates: Rates) -> list[dict]:
    out = []
    for path in paths:
        for e in json.loads(Path(path).read_text()):
            if e.get("status") != "ok" or not e.get("ranks"):
                continue
            hq, hkv = (int(x) for x in e["heads"].split(":"))
            pass_ = e.get("pass", "fwd")
            cell = SimpleNamespace(
                world_size=e["world"],
                mask=e["mask"],
                seqlen=e["seqlen"],
                mask_params=(),
                seed=0,
                heads_q=hq,
                heads_kv=hkv,
                head_dim=e["head_dim"],
                dtype="bfloat16",
                batch=1,
                pass_=pass_,
                kernel=e["kernel"],
                cp_mechanism=e["mechanism"],
                cp_degrees=(),
                cp_balance=e["balance"],
            )
            try:
                m = model_cell(cell, cluster, rates)
            except Unsupported:
                continue
            for rank, measured in enumerate(e["ranks"]):
                out.append(
                    _row(
                        "rank_local",
                        e["mechanism"],
                        e["mask"],
                        pass_,
                        e["world"],
                        e["seqlen"],
                        e["heads"],
                        e["kernel"],
                        f"rank {rank}, {e['balance']}; {Path(path).name}",
                        measured["ms"] if "ms" in measured else measured["direct_ms"],  # bwd: per-step calls
                        m.timeline.rank_compute[rank] * 1e3,
                        "ms of local attention",
                        "mask draw 0 of the spec's seed; the benchmark's draw may differ",
                    )
                )
    return out


def against_ranking(peers_path: str | Path, model: pl.DataFrame) -> list[dict]:
    """Per (pass, world size) of the peer's figures: each mechanism's rank there and in the model."""
    peers = pl.read_csv(peers_path).filter(pl.col("mechanism") != "magiattention")
    best = (
        model.filter(pl.col("status") == "ok")
        .group_by("cp_mechanism", "mask", "pass", "world_size", "tokens_per_gpu")
        .agg(pl.col("tflops").max())
    )
    out = []
    for (mask, pass_, world, tokens), grp in peers.group_by(
        "mask", "pass", "world_size", "tokens_per_gpu", maintain_order=True
    ):
        mine = best.filter(
            (pl.col("mask") == mask)
            & (pl.col("pass") == pass_)
            & (pl.col("world_size") == world)
            & (pl.col("tokens_per_gpu") == tokens)
        )
        ours = {r["cp_mechanism"]: r["tflops"] for r in mine.iter_rows(named=True)}
        theirs = dict(zip(grp.get_column("mechanism"), grp.get_column("tflops_per_gpu")))
        common = [m for m in theirs if m in ours]
        if len(common) < 2:
            continue
        rank_theirs = {m: i + 1 for i, m in enumerate(sorted(common, key=lambda m: -theirs[m]))}
        rank_ours = {m: i + 1 for i, m in enumerate(sorted(common, key=lambda m: -ours[m]))}
        for mech in common:
            out.append(
                _row(
                    "ranking",
                    mech,
                    mask,
                    pass_,
                    world,
                    world * tokens,
                    "",
                    "",
                    f"rank {rank_theirs[mech]} of {len(common)} published, {rank_ours[mech]} modelled",
                    float(theirs[mech]),
                    float(ours[mech]),
                    "TFLOP/s per GPU",
                    "published on H100 (their implementations and sharding); modelled on H200 rates"
                    + ("" if rank_theirs[mech] == rank_ours[mech] else "; rank differs"),
                )
            )
    return out


def _row(check, mechanism, mask, pass_, world, seqlen, heads, kernel, detail, measured, predicted, unit, note) -> dict:
    return {
        "check": check,
        "mechanism": mechanism,
        "mask": mask,
        "pass": pass_,
        "world_size": int(world),
        "seqlen": int(seqlen),
        "heads": heads,
        "kernel": kernel,
        "detail": detail,
        "measured": float(measured),
        "predicted": float(predicted),
        "error": float(predicted) / float(measured) - 1,
        "unit": unit,
        "note": note,
    }


def validation_table(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={c: None for c in COLUMNS}).select(COLUMNS) if rows else pl.DataFrame()
