"""Project a sweep's efficiency and device time under another timing budget, from measured rows;
with --spec, a whole spec's device time under its own (adaptive) protocol.

A projection, not a measurement (NOTES.md labels it so): each `ok` row's median call time is taken
as measured; under a budget B and a call cap N a row makes min(N, max(min_iters, B / call)) timed
calls. The overheads are parameters, set from the dense sweep's protocol probes on the H200
(results/h200/probes/): per row (warm-up, its
share of checks, row assembly), per timed call (the L2 flush), and fixed per sweep (compilation,
float32 references, first calls).

    python3 tools/sweep_projection.py --rows results/h200/all.parquet --sweep dense \
        --budgets 1 1.5 2 --caps 200 1000
    python3 tools/sweep_projection.py --rows results/h200/all.parquet --spec specs/h200.yaml [--by-length]

The spec projection replays the adaptive protocol (`repeat.ci_target`, longca.measure.timer) on each
cell's committed samples, in their order: batches as large as the samples so far until the median's
95% interval is within the target, `iters` calls or `budget_s`; past the committed samples the
interval's half-width is taken to shrink as 1/sqrt(n). Per row it adds the warm-up (`warmup_s` of
calls), the L2 flush per call, the graph replays (`repeat.graph`, as many calls again at the eager
pace, below `graph_below_ms`), the full-length agreement of cells beyond the check length
(`check.agree_with`: the cell's own forward and a comparator's, at the cell's forward time; where
the gradients are compared, `agree_gradients`, the comparator's forward and backward, at the cell's
forward and call time) and a per-row overhead; per cell its committed check and compile seconds;
per sweep a fixed start-up. A row per mask draw of the spec. Cells the spec marks unsupported cost
nothing; failed cells their committed wall (a timeout its limit); a backward cell never measured
whose forward cell was, its forward rows with each call scaled by the kernel's backward/forward
call ratio at that length (2.5 where no mask has both); other cells never measured their draws
times the median projection per draw of measured cells of the same sweep, kernel, length and pass,
else of the same sweep, length and pass (both counted apart). Beside the whole spec it projects
what is left: the cells no row of their current digest records yet (`cell_id`), so a re-measure
under way can be planned call by call; `--by-length` splits each sweep by length (its start-up on a
line of its own); `--cells-out` writes each left cell's projected seconds, which `longca run
--time-left S --estimates FILE` reads to start only cells that fit in a device call. `--ci-target`,
`--iters` and `--floor-calls` project the spec under a changed `repeat` instead (every cell is then
left: a new digest); `--floor-calls K` lets calls under a second run past `budget_s` until K calls,
a rule longca's timer does not have (docs/measurement.md, "What a tighter interval would cost");
`--resample` with them estimates how many ok rows that would bring within +-2%.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from statistics import median

import duckdb

from longca.measure.stats import LONG_CALL_MS, median_ci, min_samples


def project(
    medians_ms: list[float],
    budget_s: float,
    cap: int,
    min_iters: int = 10,
    per_row_s: float = 0.15,
    per_call_ms: float = 0.05,
    fixed_s: float = 650.0,
) -> tuple[float, float]:
    """(timed share of the projected wall, projected wall in seconds)."""
    timed = wall = 0.0
    for m in medians_ms:
        n = min(cap, max(min_iters, int(budget_s * 1000.0 / m)))
        timed += n * m / 1000.0
        wall += n * m / 1000.0 + n * per_call_ms / 1000.0 + per_row_s
    wall += fixed_s
    return timed / wall, wall


def adaptive_calls(samples_ms: list[float], target: float, min_iters: int, iters: int, budget_s: float) -> int:
    """Timed calls the adaptive protocol makes on a row whose calls take `samples_ms` (in call order),
    as longca.measure.timer's `_adaptive` decides them."""
    call = median(samples_ms)
    floor = max(min_iters, 3 if samples_ms[0] >= LONG_CALL_MS else min_samples())
    have = len(samples_ms)
    hw_all = None
    if have >= min_samples():
        ci = median_ci(samples_ms)
        hw_all = max(ci.high - call, call - ci.low) / call
    n = min(floor, iters)
    while True:
        if n <= have:
            ci = median_ci(samples_ms[:n])
            m = median(samples_ms[:n])
            done = n >= floor and ci.covered and max(ci.high - m, m - ci.low) / m <= target
        else:
            done = hw_all is not None and hw_all * math.sqrt(have / n) <= target
        spent = n * call / 1000.0
        if done or n >= iters or spent >= budget_s:
            return n
        left = int((budget_s - spent) / (call / 1000.0))
        n += max(1, min(n, iters - n, left))


def project_spec(
    spec_path: str,
    rows_path: str,
    per_row_s: float,
    per_call_ms: float,
    fixed_s: float,
    by_length: bool = False,
    what_if: dict | None = None,
    per_cell: dict[str, float] | None = None,
    rows_spec: str | None = None,
) -> dict[str, list]:
    """Per sweep (with `by_length`, per sweep and length): [cells, rows, unmeasured cells, projected
    seconds, cells left, projected seconds left] of the spec's cells under its protocol. Left: the
    cells no row of their current digest (`cell_id`) records yet. `what_if` changes the spec's
    `repeat` for the projection: `ci_target`, `iters`, and `floor_calls` (a protocol longca does not
    have: calls under a second may run past `budget_s` until that many calls). `per_cell`, when
    given, receives each left cell's projected seconds by digest (every draw, its check and compile;
    no start-up): what `longca run --estimates` reads to start only the cells that fit in a call.
    `rows_spec`: the rows of another spec stand in (cells match by id without the digest: a new
    spec projected from an earlier one's rows on the same kernels, masks and shapes)."""
    what_if = what_if or {}
    from longca.run.serving import planned_unsupported
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = load_spec(spec_path)
    cells = expand(spec)
    found = duckdb.execute(
        """SELECT regexp_replace(cell_id, '@[0-9a-f]+$', '') AS ident, status, samples_ms, median_ms,
                  cell_wall_s, check_s, compile_s, cell_digest, cell_id
           FROM read_parquet(?) WHERE spec = ? ORDER BY timestamp""",
        [rows_path, rows_spec or spec.name],
    ).fetchall()
    done = set() if what_if else {r[8] for r in found}  # a changed repeat gives every cell a new digest
    by_digest: dict[str, dict[str, list]] = defaultdict(dict)  # ident -> digest -> rows, in time order
    for r in found:
        by_digest[r[0]].setdefault(r[7], []).append(r)
    # per cell the last measured digest with ok rows (a later failure under a superseded protocol
    # says little about the new one), else the last one
    latest = {
        ident: next((rows for rows in reversed(d.values()) if any(x[1] == "ok" for x in rows)), list(d.values())[-1])
        for ident, d in by_digest.items()
    }
    fwd_ms = {}
    for ident, rows in latest.items():
        ok = [r[3] for r in rows if r[1] == "ok" and r[3]]
        if ok and "/pass=fwd/" in ident:
            fwd_ms[ident.replace("/pass=fwd/", "/pass=")] = median(ok)

    # The kernel of each problem (length, mask, shape, pass) that runs its comparator: the first the
    # spec lists there that its capabilities allow; the others compare with results kept in the
    # process (longca.run.agreement), so only that cell pays the comparator's calls.
    pays_comparator: dict[tuple, str] = {}
    for c in cells:
        problem = (c.sweep, c.seqlen, c.mask, c.mask_params, c.heads_q, c.heads_kv, c.head_dim, c.dtype, c.pass_)
        if problem not in pays_comparator and not planned_unsupported(c):
            pays_comparator[problem] = c.kernel

    def cell_cost(cell, rows) -> float:
        """Seconds of one cell under its spec's protocol, from its (or a similar cell's) rows: per
        draw the timed calls the adaptive rule makes on the committed samples, the flushes, the
        graph replays, a row's overhead, and where the full-length agreement applies its own call
        (the warm-up: the forward, with a backward the forward and the backward) and, for the cell
        that pays it, the comparator's; else the warm-up. With `repeat.draws_within`, two draws
        where the committed rows' first two agree within it, else every draw."""
        rep, check = {**cell.repeat_dict, **{k: v for k, v in what_if.items() if k != "floor_calls"}}, cell.check_dict
        ok = [r for r in rows if r[1] == "ok" and r[2]]
        if not ok:
            status = rows[-1][1]
            return float(cell.timeout_s) if status == "timeout" else float(rows[-1][4] or 0.0)
        per_draw = []
        ident = cell.id.rsplit("@", 1)[0]
        agrees = bool(check.get("agree_with")) and cell.seqlen > int(check["max_seqlen"])
        problem = (cell.sweep, cell.seqlen, cell.mask, cell.mask_params, cell.heads_q, cell.heads_kv)
        pays = pays_comparator.get((*problem, cell.head_dim, cell.dtype, cell.pass_)) == cell.kernel
        for r in ok:
            samples = list(r[2])
            call = median(samples)
            budget_s = rep["budget_s"]
            if what_if.get("floor_calls") and call < LONG_CALL_MS:
                budget_s = max(budget_s, what_if["floor_calls"] * call / 1000.0)
            n = adaptive_calls(samples, rep.get("ci_target") or 1.0, rep.get("min_iters", 1), rep["iters"], budget_s)
            t = n * (call + per_call_ms) + per_row_s * 1000.0
            if rep.get("graph") and call < rep.get("graph_below_ms", math.inf):  # every pass is captured
                t += n * (call + per_call_ms) + call
            if agrees:
                fwd = fwd_ms.get(ident.replace(f"/pass={cell.pass_}/", "/pass="), call / 2.5)
                own = fwd if cell.pass_ == "fwd" else fwd + call  # the agreement's call, the warm-up too
                t += own + (own if pays else 0.0)  # the comparator at the cell's own pace
            else:
                t += min(rep.get("warmup", 1), max(1, math.ceil(rep.get("warmup_s", 0.0) * 1000.0 / call))) * call
            per_draw.append(t / 1000.0)
        draws = cell.samples
        within = rep.get("draws_within")
        if within and cell.samples > 2 and len(ok) >= 2:
            first_two = [ok[0][3], ok[1][3]]
            if first_two[0] and first_two[1] and abs(first_two[0] - first_two[1]) / median(first_two) <= within:
                draws = 2
        first = ok[0]
        return sum(per_draw) / len(per_draw) * draws + float(first[5] or 0.0) + float(first[6] or 0.0)

    out: dict[str, list] = {}
    guess: dict[tuple, list] = defaultdict(list)  # measured costs per draw by sweep, length, pass (and kernel)
    pending = []
    sweeps_left: set[str] = set()  # sweeps with a cell left: their start-up is left too

    def key(cell) -> str:
        return f"{cell.sweep} {cell.seqlen}" if by_length else cell.sweep

    for cell in cells:
        entry = out.setdefault(key(cell), [0, 0, 0, 0.0, 0, 0.0])
        entry[0] += 1
        if planned_unsupported(cell):
            entry[1] += 1
            continue
        entry[1] += cell.samples
        left = cell.id not in done
        entry[4] += left
        if left:
            sweeps_left.add(cell.sweep)
        rows = latest.get(cell.id.rsplit("@", 1)[0])
        if rows:
            cost = cell_cost(cell, rows)
            entry[3] += cost
            entry[5] += cost if left else 0.0
            if left and per_cell is not None:
                per_cell[cell.digest] = cost
            guess[(cell.sweep, cell.seqlen, cell.pass_)].append(cost / cell.samples)
            guess[(cell.sweep, cell.kernel, cell.seqlen, cell.pass_)].append(cost / cell.samples)
        else:
            entry[2] += 1
            pending.append(cell)
    # A backward cell never measured whose forward cell was: its forward rows with each call scaled
    # by the kernel's backward/forward call ratio at that length (the median over masks measured in
    # both passes; 2.5, the FLOP ratio, where none was).
    bwd_ratio: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ident, rows in latest.items():
        ok = [r[3] for r in rows if r[1] == "ok" and r[3]]
        fwd = fwd_ms.get(ident.replace("/pass=bwd/", "/pass="))
        if ok and fwd and "/pass=bwd/" in ident:
            bwd_ratio[_kernel_length(ident)].append(median(ok) / fwd)

    def from_forward(cell) -> float | None:
        ident = cell.id.rsplit("@", 1)[0]
        rows = latest.get(ident.replace(f"/pass={cell.pass_}/", "/pass=fwd/"))
        if cell.pass_ != "bwd" or not rows or not any(r[1] == "ok" and r[2] for r in rows):
            return None
        ratio = median(bwd_ratio.get(_kernel_length(ident)) or [2.5])
        scaled = [(*r[:2], [x * ratio for x in r[2]] if r[2] else r[2], (r[3] or 0.0) * ratio, *r[4:]) for r in rows]
        return cell_cost(cell, scaled)

    for cell in pending:
        cost = from_forward(cell)
        if cost is None:
            similar = (
                guess.get((cell.sweep, cell.kernel, cell.seqlen, cell.pass_))
                or guess.get((cell.sweep, cell.seqlen, cell.pass_))
                or [c for k, v in guess.items() if len(k) == 3 and k[1:] == (cell.seqlen, cell.pass_) for c in v]
                or [c for k, v in guess.items() if len(k) == 3 for c in v]
            )
            cost = median(similar) * cell.samples
        out[key(cell)][3] += cost
        out[key(cell)][5] += cost  # never measured: left under any digest
        if per_cell is not None:
            per_cell[cell.digest] = cost
    # the start-up once per sweep (on its own line when lengths are apart), left while cells are
    for sweep in dict.fromkeys(cell.sweep for cell in cells):
        entry = out.setdefault(f"{sweep} start-up", [0, 0, 0, 0.0, 0, 0.0]) if by_length else out[sweep]
        entry[3] += fixed_s
        entry[5] += fixed_s if sweep in sweeps_left else 0.0
    return out


def _kernel_length(ident: str) -> tuple[str, str]:
    """(kernel, seqlen_q) of a cell id without its digest."""
    parts = dict(p.split("=", 1) for p in ident.split("/") if "=" in p)
    return parts.get("kernel", ""), parts.get("seqlen_q", "")


def resampled_within(
    rows_path: str, floor_calls: int, iters: int, budget_s: float = 2.0, goal: float = 0.02, draws: int = 20
) -> tuple[int, int, int]:
    """(ok rows, within +-goal now, within under the what-if) over the ok rows of the adaptive
    protocol (schema 6 on), on the drawn time (graph replay where stored). A row outside the goal
    with calls under a second is taken to make min(iters, max(budget_s, floor_calls x call) / call)
    calls, drawn `draws` times with replacement from its own samples (independent draws: drift
    between calls would make it worse); it counts when the median draw's interval is within goal.
    Rows of longer calls keep their three samples. Seeded: the same figures every run."""
    import random

    rng = random.Random(1)
    rows = duckdb.execute(
        """SELECT samples_ms,
                  greatest(m - coalesce(graph_ci_low_ms, ci_low_ms), coalesce(graph_ci_high_ms, ci_high_ms) - m) / m
           FROM (SELECT *, coalesce(graph_median_ms, median_ms) AS m FROM read_parquet(?))
           WHERE status = 'ok' AND schema_version >= 6""",
        [rows_path],
    ).fetchall()

    def half(samples: list[float]) -> float:
        ci, m = median_ci(samples), median(samples)
        return max(m - ci.low, ci.high - m) / m

    now = then = 0
    for samples, h in rows:
        if h <= goal:
            now += 1
            then += 1
            continue
        call = median(samples)
        if call >= LONG_CALL_MS:
            continue
        n = min(iters, max(len(samples), int(max(budget_s * 1000.0, floor_calls * call) / call)))
        then += median(half(rng.choices(samples, k=n)) for _ in range(draws)) <= goal
    return len(rows), now, then


def main_spec(a: argparse.Namespace) -> int:
    what_if = {
        k: v
        for k, v in {"ci_target": a.ci_target, "iters": a.iters, "floor_calls": a.floor_calls}.items()
        if v is not None
    }
    per_cell: dict[str, float] = {}
    out = project_spec(
        a.spec, a.rows, a.per_row_s, a.per_call_ms, a.fixed_s, a.by_length, what_if, per_cell, a.rows_spec
    )
    if a.cells_out:
        import pyarrow as pa
        import pyarrow.parquet as pq

        digests = sorted(per_cell)
        table = pa.table(
            {"cell_digest": digests, "projected_s": pa.array([per_cell[d] for d in digests], pa.float64())}
        )
        pq.write_table(table, a.cells_out, compression="zstd")
        print(f"{a.cells_out}: the projected seconds of {len(digests)} cells left")
    if what_if:
        print(f"what if the spec's repeat had {what_if} (every cell then has a new digest: all left)")
    print(f"{'sweep':22s} {'cells':>6s} {'rows':>6s} {'unmeasured':>10s} {'minutes':>8s} {'left':>6s} {'minutes':>8s}")
    for name, (cells, rows, unmeasured, secs, left, left_s) in out.items():
        print(f"{name:22s} {cells:6d} {rows:6d} {unmeasured:10d} {secs / 60:8.1f} {left:6d} {left_s / 60:8.1f}")
    total = [sum(v[i] for v in out.values()) for i in range(6)]
    print(
        f"{'total':22s} {total[0]:6d} {total[1]:6d} {total[2]:10d} {total[3] / 60:8.1f} "
        f"{total[4]:6d} {total[5] / 60:8.1f}"
    )
    print(f"per row {a.per_row_s} s, per call {a.per_call_ms} ms, fixed {a.fixed_s} s per sweep")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", required=True)
    ap.add_argument("--sweep")
    ap.add_argument("--spec", help="project the whole spec under its own protocol instead")
    ap.add_argument("--rows-spec", help="with --spec: project from the rows of this spec (its name) instead of its own")
    ap.add_argument("--by-length", action="store_true", help="with --spec: a line per sweep and length")
    ap.add_argument(
        "--cells-out",
        metavar="PARQUET",
        help="with --spec: write each left cell's projected seconds (cell_digest, projected_s), for `longca run "
        "--estimates`",
    )
    ap.add_argument(
        "--resample",
        action="store_true",
        help="instead: how many ok rows would be within +-2%% under --floor-calls/--iters (resampled)",
    )
    ap.add_argument("--ci-target", type=float, help="with --spec: project under this repeat.ci_target instead")
    ap.add_argument("--iters", type=int, help="with --spec: project under this repeat.iters instead")
    ap.add_argument(
        "--floor-calls", type=int, help="with --spec: calls under 1 s run past budget_s until this many (what-if)"
    )
    ap.add_argument("--budgets", type=float, nargs="+", default=[1.0, 1.5, 2.0])
    ap.add_argument("--caps", type=int, nargs="+", default=[200, 1000])
    ap.add_argument("--min-iters", type=int, default=10)
    ap.add_argument("--per-row-s", type=float, default=0.15)
    ap.add_argument("--per-call-ms", type=float, default=0.05)
    ap.add_argument("--fixed-s", type=float, default=650.0)
    a = ap.parse_args(argv)
    if a.resample:
        floor, cap = a.floor_calls or 0, a.iters or 1000
        rows, now, then = resampled_within(a.rows, floor, cap)
        print(f"{rows} ok rows of the adaptive protocol; within +-2%: {now} ({now / rows:.1%}) now,")
        print(f"{then} ({then / rows:.1%}) with calls under 1 s floored at {floor} and capped at {cap}")
        return 0
    if a.spec:
        return main_spec(a)
    if not a.sweep:
        ap.error("--sweep or --spec is required")
    medians = [
        r[0]
        for r in duckdb.execute(
            "SELECT median_ms FROM read_parquet(?) WHERE sweep = ? AND status = 'ok' AND median_ms > 0",
            [a.rows, a.sweep],
        ).fetchall()
    ]
    if not medians:
        ap.error(f"no ok rows of sweep {a.sweep!r} in {a.rows}")
    print(
        f"{len(medians)} ok rows of {a.sweep}; per row {a.per_row_s} s, per call {a.per_call_ms} ms, "
        f"fixed {a.fixed_s} s"
    )
    for cap in a.caps:
        for b in a.budgets:
            share, wall = project(medians, b, cap, a.min_iters, a.per_row_s, a.per_call_ms, a.fixed_s)
            print(f"cap {cap:5d} calls, budget {b:4.2f} s: {share:.1%} timed, {wall / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
