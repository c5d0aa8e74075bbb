"""Start a mask draw only where it fits in the time its run has left (`longca run --time-left S
--estimates FILE`).

A device call (tools/gpu-host.sh) is stopped at its time limit, and the draw running then is lost
(finished draws are kept beside the cell file, longca.store.draws): at 512K a draw takes 1-8
minutes, so a 10-minute call stopped inside one spends minutes of GPU time on nothing. With a
projection of each cell's seconds (tools/sweep_projection.py --cells-out, from the committed rows),
a draw of a single-device cell whose share of the projection (the cell's seconds over its draws,
times MARGIN) exceeds the time left is not started: the cell is left for a later run with the draws it finished
kept, and no file and no row are written; a line in the log says so. The run goes on with the next
cells, which may fit; a call with nothing left that fits ends early, and its device time goes to the
next call. After a cell's first draw in a run, what that draw took counts too, where it is longer (a
first draw timed from the end of the cell's check, which autotuning can make minutes long). A cell
without a projection runs its first draw (nothing says it does not fit), and so does a draw
projected longer than the whole run (`total_s`: no call would ever fit it, so it runs as it would
without estimates, stopped at the limit). CP cells run as a group of processes
(longca.run.ranks) and are not held back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longca.spec.cells import Cell

# A draw starts only if this many times its share of the projection fits: the 512K cells measured on
# 2026-12-05 took 0.97-1.25 times their projection (cells over a minute, projected from the rows
# before them), so a draw that barely fits by its projection would often be stopped.
MARGIN = 1.25


class LeftForLater(Exception):
    """A draw of the cell does not fit in the time left: the cell stops there, its finished draws
    kept, and ends with no row (longca.run.cell.run_cell raises it; the worker reports it)."""


@dataclass(frozen=True)
class TimeLeft:
    """When the run must be done (`stop_at`, seconds since the epoch: the worker is another
    process), how long it had in all (`total_s`), and each cell's projected seconds by digest."""

    stop_at: float
    total_s: float
    estimates: dict[str, float] = field(default_factory=dict)

    @classmethod
    def starting_now(cls, seconds: float, estimates: dict[str, float]) -> TimeLeft:
        return cls(time.time() + seconds, seconds, estimates)

    def to_json(self) -> dict[str, Any]:
        return {"stop_at": self.stop_at, "total_s": self.total_s, "estimates": self.estimates}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimeLeft:
        estimates = {str(k): float(v) for k, v in data["estimates"].items()}
        return cls(float(data["stop_at"]), float(data["total_s"]), estimates)

    def refusal(self, cell: Cell, now: float | None = None, last_draw_s: float | None = None) -> str | None:
        """Why the next draw of `cell` is not started now, or None: MARGIN times the longer of its
        share of the cell's projection and `last_draw_s` (what its previous draw took in this run:
        a projection from other cells' rows can be far off) is longer than the time left, and not
        longer than the whole run."""
        projected = self.estimates.get(cell.digest)
        share = None if projected is None else projected / cell.samples
        known = [x for x in (share, last_draw_s) if x is not None]
        if not known:
            return None
        need = MARGIN * max(known)
        left = self.stop_at - (time.time() if now is None else now)
        if need <= left or need > self.total_s:
            return None
        what = f"{need:.0f} s a draw ({cell.samples} draws)" if cell.samples > 1 else f"{need:.0f} s"
        if last_draw_s is not None and (share is None or last_draw_s > share):
            what += f", as its last draw took {last_draw_s:.0f} s"
        return f"left for a later run: needs {what}, {max(left, 0.0):.0f} s left"


def load_estimates(path: str | Path) -> dict[str, float]:
    """The projected seconds per cell digest in a Parquet table (cell_digest, projected_s), as
    tools/sweep_projection.py --cells-out writes it."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=["cell_digest", "projected_s"])
    except FileNotFoundError:
        raise ValueError(f"--estimates {str(path)!r}: no such file") from None
    except (KeyError, ValueError, OSError) as exc:  # not Parquet, or a column missing
        raise ValueError(
            f"--estimates {str(path)!r}: allowed: a Parquet table with columns cell_digest and projected_s "
            f"(tools/sweep_projection.py --cells-out) ({str(exc).splitlines()[0]})"
        ) from None
    pairs = zip(table.column("cell_digest").to_pylist(), table.column("projected_s").to_pylist())
    return {d: float(s) for d, s in pairs if d and s is not None}
