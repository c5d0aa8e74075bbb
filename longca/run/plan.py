"""Group the cells that still need a result into jobs (chunks) for Snakemake.

A job runs a chunk of cells in one process (start-up, CUDA initialisation and compilation are
paid once per chunk), but each cell keeps its own output file. Only missing or damaged cells are
planned: a finished cell is an existing, sound file, so deleting one cell's file reruns that cell
alone, and a new axis value runs only its new cells.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq

from longca.run.serving import planned_unsupported
from longca.spec.cells import Cell, expand
from longca.spec.model import Spec
from longca.store.read import damage


@dataclass
class Job:
    name: str
    kind: str  # planned | device | cp
    cells: list[Cell]
    outputs: list[str]
    # touched once every cell of the job is written: what the aggregate and `all` depend on, one
    # short path per job instead of every cell's (Snakemake's lines stay readable at any size)
    marker: str = ""
    gpus: int = 0
    tasks: int = 1
    runtime_min: int = 10
    mem_mb: int = 4000
    threads: int = 1
    extra: dict = field(default_factory=dict)


def _kind(cell: Cell) -> str:
    if planned_unsupported(cell):
        return "planned"
    return "cp" if cell.cp_mechanism is not None else "device"


def _estimate_minutes(cells: list[Cell]) -> int:
    """A SLURM time limit for a chunk: each cell's timeout, capped so chunks stay schedulable."""
    total_s = sum(min(c.timeout_s, 60 + c.samples * float(dict(c.repeat).get("budget_s", 10)) * 2) for c in cells)
    return max(5, int(total_s / 60) + 5)


def recorded_status(path: str | Path) -> str:
    """The status of a sound cell file (its first row's)."""
    return str(pq.read_table(path, columns=["status"]).column("status")[0])


def missing_cells(
    cells: list[Cell], results_dir: str | Path, warn=None, retry: frozenset[str] = frozenset()
) -> list[Cell]:
    """Cells whose output file is absent or damaged (damaged ones are named through `report`),
    and, on request, those whose recorded status is in `retry` (e.g. `error` after a fix)."""
    out = []
    for cell in cells:
        path = Path(cell.output(results_dir))
        if not path.exists():
            out.append(cell)
            continue
        why = damage(path)
        if not why:
            if retry and recorded_status(path) in retry:
                out.append(cell)  # the new row replaces the file atomically when the cell finishes
            continue
        # Moved aside (kept for inspection, ignored by readers): Snakemake reruns a job only
        # when its output is missing, and a damaged file must never be read as a result.
        aside = path.with_name(path.name + ".damaged")
        os.replace(path, aside)
        (warn or (lambda m: print(m, file=sys.stderr)))(
            f"longca: damaged result, cell will rerun: {why} (moved to {aside.name})"
        )
        out.append(cell)
    return out


def plan_jobs(
    spec: Spec,
    results_dir: str | Path = "results",
    *,
    only_missing: bool = True,
    chunk_size: int | None = None,
    warn=None,
    retry: frozenset[str] = frozenset(),
) -> tuple[list[Cell], list[Job]]:
    """Chunks of cells and, per chunk, the outputs still to produce.

    Chunk membership comes from the whole spec (cells in plan order, per sweep and kind), never
    from what is missing: under a cluster executor every job re-reads the Snakefile when it
    starts, while other chunks are half written, and must find its rule under the same name.
    """
    cells = expand(spec)
    todo = {c.digest for c in (missing_cells(cells, results_dir, warn, retry) if only_missing else cells)}
    sweeps = {sw.name: sw for sw in spec.sweeps}
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        kind = _kind(cell)
        key = (cell.sweep, kind, cell.world_size if kind == "cp" else 1)
        groups.setdefault(key, []).append(cell)
    jobs: list[Job] = []
    for (sweep, kind, world), members in groups.items():
        size = chunk_size or sweeps[sweep].chunk_size
        if kind == "planned":
            size = max(size, 1000)  # no device work: one cheap job
        for i in range(0, len(members), size):
            chunk = members[i : i + size]
            digest = hashlib.sha256("\n".join(c.digest for c in chunk).encode()).hexdigest()[:10]
            pending = [c for c in chunk if c.digest in todo]
            if not pending:
                continue
            outputs = [c.output(results_dir) for c in pending]
            name = re.sub(r"[^A-Za-z0-9_]", "_", f"cells_{sweep}_{kind}_{digest}")
            on_gpu = spec.device == "cuda" and kind != "planned"
            jobs.append(
                Job(
                    name=name,
                    kind=kind,
                    cells=pending,
                    outputs=outputs,
                    # short: the aggregate lists every job's marker as its input, on one line
                    marker=str(Path(results_dir) / spec.name / "jobs" / digest),
                    gpus=(world if kind == "cp" else 1) if on_gpu else 0,
                    tasks=world if kind == "cp" else 1,
                    threads=world if kind == "cp" else 1,
                    runtime_min=_estimate_minutes(pending) if kind != "planned" else 5,
                    mem_mb=16000 if on_gpu else 4000,
                )
            )
    return cells, jobs
