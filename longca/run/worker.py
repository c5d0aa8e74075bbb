"""A worker process: runs cells one after another and reports progress on a pipe.

Started by longca.run.chunk, which owns the clock: it kills a worker whose cell exceeds its time
limit and restarts a fresh one for the remaining cells; a crash (segfault, abort) loses only the
cell that was running, which the supervisor records as an `error` row.

Protocol on the status pipe, one line each: `START <i>` before cell i, `DRAW <i> <k>` after its
draw k is measured, `DONE <i>` after its file is written, `SKIP <i>` for a cell left for a later run
(with its finished draws kept) because its next draw does not fit in the time the run has left
(longca.run.time_left). Exit code 3 asks for a restart: the CUDA context is unusable after a CUDA
error, and memory a failed CUDA-graph capture keeps is lost to every later cell of the process
(longca.measure.graphs).
"""

from __future__ import annotations

import json
import os
import sys
import time

from longca.run.lifeline import RunStopped, die_with_parent

EXIT_RESTART = 3


class _StatusPipe:
    """The status pipe to the supervisor; a closed one means the run is gone (RunStopped), which
    the cell runner passes on instead of recording it as the cell's error."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, line: str) -> None:
        try:
            self.fh.write(line)
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise RunStopped("the supervisor's status pipe is closed") from exc


def main(argv: list[str]) -> int:
    job_file, status_fd = argv[0], int(argv[1])
    die_with_parent(int(argv[2]) if len(argv) > 2 else None)  # never outlive the supervisor
    with open(job_file) as fh:
        job = json.load(fh)
    status = _StatusPipe(os.fdopen(status_fd, "w", buffering=1))

    from longca.kernels.registry import load_all
    from longca.measure.graphs import held_by_failed_captures
    from longca.run.cell import CellCaches, run_cell
    from longca.run.rows import cell_line, place, summarize
    from longca.run.time_left import LeftForLater, TimeLeft
    from longca.spec.cells import Cell
    from longca.store.draws import all_kept, clear_draws
    from longca.store.write import write_rows

    # FlashAttention-4 compiles each configuration on first use; its on-disk cache lets every
    # later chunk process load the kernel instead of compiling it again (seconds per configuration).
    os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    # Triton autotuners (flash-linear-attention's kernels) keep their choices on disk the same way:
    # the first fla cell on the H200 spent 81-105 s autotuning.
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    load_all()  # includes LONGCA_PLUGINS
    kernel_s = 0.0
    supervisor = os.getppid()
    caches = CellCaches()  # the chunk's cells share checks, references and masks
    time_left = TimeLeft.from_json(job["time_left"]) if job.get("time_left") else None
    t0 = time.perf_counter()
    before, total = job.get("progress") or (0, 0)  # the cells' place in their chunk, for the terminal
    for i, (cell_json, path) in enumerate(zip(job["cells"], job["outputs"])):
        if i < job.get("start", 0):
            continue
        cell = Cell.from_json(cell_json)
        # a draw that does not fit in the time left is not started (longca.run.time_left): first
        # here, before the cell's check (unless every draw is kept already), then before each draw
        drawn = [time.time()]  # when the cell's check, then each of its draws, ended: what a draw takes
        may_start = (
            (lambda k, cell=cell, drawn=drawn: time_left.refusal(cell, last_draw_s=_last(drawn))) if time_left else None
        )
        try:
            if may_start and not all_kept(cell, path) and (why := may_start(0)):
                raise LeftForLater(why)
            status.write(f"START {i}\n")
            rows = run_cell(  # a stopped run's finished draws are kept; each finished draw resets the clock
                cell,
                caches,
                keep_draws=path,
                on_draw=lambda k, i=i, drawn=drawn: _drew(status, i, k, drawn),
                may_start=may_start,
                on_checked=lambda drawn=drawn: drawn.__setitem__(-1, time.time()),
            )
        except LeftForLater as later:
            print(
                cell_line(cell, str(later), place(before, i, total)), file=sys.stderr, flush=True
            )  # "left for a later run: ..."
            status.write(f"SKIP {i}\n")
            if _held_memory(held_by_failed_captures()):
                return EXIT_RESTART
            continue
        if os.getppid() != supervisor:  # the run is gone: its cell in flight leaves no file
            return 1
        write_rows(path, rows)
        clear_draws(path)
        kernel_s += sum(r.get("_kernel_s", 0.0) for r in rows)
        print(cell_line(cell, summarize(rows), place(before, i, total)), file=sys.stderr, flush=True)
        status.write(f"DONE {i} {kernel_s:.6f} {time.perf_counter() - t0:.6f}\n")
        if any(r.get("_fatal") for r in rows) or _held_memory(held_by_failed_captures()):
            return EXIT_RESTART
    return 0


def _held_memory(nbytes: int) -> bool:
    """Whether failed captures hold memory that later cells would miss (then say so: the worker
    restarts)."""
    if nbytes:
        print(
            f"[longca] failed CUDA-graph captures hold {nbytes / 2**30:.1f} GiB: restarting the worker",
            file=sys.stderr,
            flush=True,
        )
    return bool(nbytes)


def _drew(status, i: int, k: int, ends: list[float]) -> None:
    """Draw k of cell i is measured: note when, and tell the supervisor (its time limit restarts)."""
    ends.append(time.time())
    status.write(f"DRAW {i} {k}\n")


def _last(ends: list[float]) -> float | None:
    """The seconds between the last two entries (the last draw's: a first draw's from the end of
    the cell's check), or None before a draw has ended."""
    return ends[-1] - ends[-2] if len(ends) > 1 else None


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except RunStopped:
        os._exit(1)  # nothing to flush to a supervisor that is gone
