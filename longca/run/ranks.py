"""The runner of a context-parallel cell: the program each of its N processes runs.

    torchrun --nproc-per-node N -m longca.run.ranks JOB.json DONE_DIR
    srun -n N python -m longca.run.ranks JOB.json DONE_DIR

A CP cell is a cell whose runner starts N processes (longca.run.chunk launches them); the rest is
the single-device runner's: the job file is the worker's ({"cells": [Cell.to_json()], "outputs":
[...]}), rows come from longca.run.rows, the verdict from longca.run.check (the spec's `check`:
tolerance and reduced length), samples from longca.measure.timer (RankTimer: the same protocol
with a barrier before each timed call), one row per mask draw (`mask_samples`). Rank 0 writes each
cell's rows to its output file (atomically), then DONE_DIR/<digest>.done, which the supervisor
watches.

Per cell: the mask is cut for the cell's sharding; the mechanism is checked against a
single-process reference at the check length (output and, for passes with a backward, q/k/v
gradients); then, for every mask draw, timed at the full length (iteration time = max over ranks)
and replayed with communication replaced by local no-ops: exposed communication = median
iteration time minus median communication-free time (noise can make it slightly negative; it is
not clipped). All ranks agree on every failure (an all-reduced status) so one cell's failure never
desynchronises the next; a failure inside a collective on one rank only can still stall the group
until the collective timeout (the largest timeout_s of the cells) makes it fail, and the
supervisor gives each cell its own limit.
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import math
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from longca.cp.comm import Comm
from longca.cp.mechanisms import build_plan, cp_attention, refuse_blocks, resolve_degrees
from longca.cp.reference import reference_attention
from longca.cp.sharding import granule, make_sharding
from longca.cp.ulysses import kv_replication
from longca.kernels.base import Unsupported
from longca.kernels.registry import load_all, rank_kernel
from longca.masks.registry import build_mask, resolve_params
from longca.measure.clocks import ClockSampler, no_sampler
from longca.measure.cooldown import cool_down
from longca.measure.env import gpu_clock_state
from longca.measure.reference import error_ratio, error_sums
from longca.measure.timer import RETAINED_GRAPH, RankTimer, time_under, timer_for
from longca.run.agreement import GRADIENTS, agreement_applies, compare, compares_gradients, single_device
from longca.run.check import check_columns, check_length, check_verdict
from longca.run.lifeline import SUPERVISOR_ENV, die_with_parent
from longca.run.rows import (
    base_row,
    cell_line,
    classify,
    gate_peak,
    mask_columns,
    place,
    softmax_flops,
    status_row,
    summarize,
    timing_columns,
)
from longca.spec.cells import Cell
from longca.store.write import write_rows
from longca.vocab import Pass, Status, torch_dtype

STATUS_CODE = {Status.OK: 0, Status.UNSUPPORTED: 1, Status.INCORRECT: 2, Status.OOM: 3, Status.ERROR: 4}
DEFAULT_TIMEOUT_S = 600.0  # collective timeout when cells carry no timeout_s
# A CP check length is a multiple of this many tokens per rank (every balance's granule divides it).
CHECK_GRANULE_PER_RANK = 4 * 16


class CellFailure(Exception):
    """Ends a CP cell with a status on every rank (after the ranks agreed on it); `columns`: what the
    row keeps of the failed phase (a disagreeing draw's agreement columns)."""

    def __init__(self, status: str, reason: str, columns: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.columns = columns or {}


# ------------------------------------------------------------------------------ process group
def init_distributed(backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int, int]:
    """Join the group started by torchrun (RANK/WORLD_SIZE) or srun (SLURM_PROCID/SLURM_NTASKS).

    timeout_s bounds every collective: one left waiting for a rank that failed or went elsewhere
    raises instead of hanging the group for good."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")  # single-node jobs; multi-node sets it
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
    if "RANK" not in os.environ:
        raise SystemExit("longca.run.ranks must be launched by torchrun or srun (no RANK / SLURM_PROCID)")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), local


def _agree_max(value: float, device: torch.device) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _rank_clocks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The lowest SM clock over ranks at start, end and in the timed window, and the throttle
    reasons any rank saw."""

    def low(key: str) -> int | None:
        values = [r[key] for r in per_rank if r.get(key) is not None]
        return min(values) if values else None

    either = 0
    masks = [int(r["throttle"], 16) for r in per_rank if r.get("throttle")]
    for m in masks:
        either |= m
    seen = 0
    windows = [int(r["throttle_window"], 16) for r in per_rank if r.get("throttle_window")]
    for m in windows:
        seen |= m
    return {
        "clock_start_mhz": low("clock0"),
        "clock_end_mhz": low("clock1"),
        "throttle_reasons": hex(either) if masks else None,
        "clock_window_mhz": low("clock_window_mhz"),
        "clock_window_min_mhz": low("clock_window_min_mhz"),
        "throttle_window": hex(seen) if windows else None,
    }


# ------------------------------------------------------------------------------------ helpers
def cp_check_length(cell: Cell) -> int:
    """The check length of a CP cell: `check.max_seqlen` rounded down to what every sharding divides."""
    return check_length(cell, CHECK_GRANULE_PER_RANK * cell.world_size)


def runtime_refusal(cell: Cell, kernel: Any) -> None:
    """Raise Unsupported for what this process group cannot run (validation refuses the same
    before any process starts; this repeats it for cells built by hand)."""
    u, _, _ = resolve_degrees(cell.cp_mechanism, cell.world_size, dict(cell.cp_degrees))
    kv_replication(cell.heads_q, cell.heads_kv, u)
    if cell.pattern.family == "dynamic":
        params = resolve_params(cell.mask, dict(cell.mask_params))
        if params.get("score") != "random":
            raise Unsupported(
                f"mask_params.score={params.get('score')!r}: CP cells draw each rank's inputs "
                f"separately, so importance scores of the global inputs do not exist; use score='random'"
            )
        refuse_blocks(kernel)
        if cell.cp_balance == "document":
            raise Unsupported(
                "balance='document' balances slice masks by row area; a block-sparse mask keeps the "
                "same number of key blocks in every query block, so use balance 'contiguous' or 'zigzag'"
            )
    g = granule(cell.cp_balance, cell.world_size)
    for length in (cell.seqlen, cp_check_length(cell)):
        if length % g:
            raise Unsupported(
                f"seqlen={length} is not a multiple of {g}, which balance={cell.cp_balance!r} needs "
                f"at world_size={cell.world_size}"
            )


def _mask(cell: Cell, seqlen: int, sample: int):
    return build_mask(cell.mask, seqlen, dict(cell.mask_params), seed=cell.seed, sample=sample, heads_kv=cell.heads_kv)


def mask_area_q_heads(mask, heads_q: int) -> int:
    """Attended (query head, q, k) triples of one batch element: area x Hq for shared masks, the
    sum over KV heads x the GQA group for per-KV-head masks (exact integers)."""
    if mask.per_head:
        return int(mask.area_of_heads().sum()) * (heads_q // mask.heads)
    return mask.area * heads_q


def _sharded_plan(cell: Cell, mask, rank: int, world: int, device: torch.device, kernel, comm: Comm | None = None):
    """The cell's sharding of `mask` over `world` ranks and this rank's plan of its steps."""
    sharding = make_sharding(cell.cp_balance, mask.seqlen_q, world, mask.slices)
    plan = build_plan(
        cell.cp_mechanism,
        dict(cell.cp_degrees),
        mask.slices,
        sharding,
        rank,
        cell.heads_q,
        cell.heads_kv,
        kernel,
        device,
        comm,
        blocks=mask.blocks,
    )
    return sharding, plan


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


# ---------------------------------------------------------------------------------- the cell
def _inputs(cell: Cell, seqlen: int, device: torch.device, seed: int):
    """Global q, k, v, dout (B, H, S, D), identical on every rank (same seed, drawn on the CPU)."""
    g = torch.Generator("cpu").manual_seed(seed)
    dt = torch_dtype(cell.dtype)
    b, d = cell.batch, cell.head_dim

    def draw(h: int) -> torch.Tensor:
        return torch.randn(b, h, seqlen, d, generator=g).to(device=device, dtype=dt)

    return draw(cell.heads_q), draw(cell.heads_kv), draw(cell.heads_kv), draw(cell.heads_q)


def _run_pass(pass_: str, q, k, v, dout, plan):
    if pass_ == Pass.FWD:
        with torch.no_grad():
            return cp_attention(q, k, v, plan), None
    out = cp_attention(q, k, v, plan)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def correctness(cell: Cell, rank: int, world: int, device: torch.device, kernel) -> dict:
    """Relative errors of output (and gradients) against the reference at the check length (mask draw 0)."""
    s = cp_check_length(cell)
    mask = _mask(cell, s, 0)
    sharding, plan = _sharded_plan(cell, mask, rank, world, device, kernel)
    q, k, v, dout = _inputs(cell, s, device, cell.seed + 1)
    pos = torch.from_numpy(sharding.positions(rank)).to(device)
    grads_wanted = cell.pass_ != Pass.FWD
    ql, kl, vl = (x[:, :, pos].contiguous().requires_grad_(grads_wanted) for x in (q, k, v))
    out, grads = _run_pass(cell.pass_, ql, kl, vl, dout[:, :, pos].contiguous(), plan)
    ref_dtype = torch.float64 if device.type == "cpu" else torch.float32
    ref = reference_attention(
        q, k, v, mask if mask.per_head else mask.slices, dout if grads_wanted else None, ref_dtype, kv_heads_per_chunk=1
    )
    mine = [out] + list(grads or [])
    sums = torch.tensor(
        [x for a, r in zip(mine, ref) for x in error_sums(a, r[:, :, pos])], dtype=torch.float64, device=device
    )
    dist.all_reduce(sums)  # every rank's share of the squared norms: the whole sequence's
    sums = sums.tolist()
    errs = [error_ratio(sums[2 * i], sums[2 * i + 1]) for i in range(len(mine))]
    names = ["rel_err_out", "rel_err_dq", "rel_err_dk", "rel_err_dv"]
    return {"check_seqlen": s, **{n: (e if math.isfinite(e) else float("inf")) for n, e in zip(names, errs)}}


# `repeat.graph` on a CP cell: its steps interleave collectives with host-side bookkeeping (bytes
# sent, the communication-free loop that toggles the exchange), none of which a replay would redo.
CP_GRAPH_REASON = "context-parallel cells are timed eagerly only (their collectives are not captured)"


def measure(cell: Cell, rank: int, world: int, device: torch.device, kernel, sample: int) -> dict[str, Any]:
    """One mask draw at the full length: plan, inputs, the timed pass (with and without
    communication); returns the row's measurement columns (complete on every rank)."""
    s, b = cell.seqlen, cell.batch
    t0 = time.perf_counter()
    mask = _mask(cell, s, sample)
    mask_build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    comm = Comm()
    sharding, plan = _sharded_plan(cell, mask, rank, world, device, kernel, comm)
    plan_s = time.perf_counter() - t0
    rank_area = plan.rank_area(b)
    # Random local inputs (timing never runs on zeros); generated on the device, per rank and draw.
    g = torch.Generator(device.type).manual_seed(cell.seed * 1000 + rank + 7919 * sample)
    dt = torch_dtype(cell.dtype)
    n = sharding.local_len
    need_grad = cell.pass_ != Pass.FWD
    q, k, v, dout = (
        torch.randn(b, h, n, cell.head_dim, generator=g, device=device, dtype=dt)
        for h in (cell.heads_q, cell.heads_kv, cell.heads_kv, cell.heads_q)
    )
    agreement = _full_length_agreement(cell, rank, world, device, plan, sharding, mask, q, k, v, dout)
    if "incorrect" in agreement:  # a wrong result is never a speed: every rank ends the cell so
        failed = agreement.pop("incorrect")
        raise CellFailure(Status.INCORRECT, failed, {**mask_columns(mask, sample), **agreement})
    for x in (q, k, v):
        x.requires_grad_(need_grad)
    if cell.pass_ == Pass.BWD:  # backward timed on one saved forward's graph
        out = cp_attention(q, k, v, plan)

        def run():
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    else:

        def run():
            return _run_pass(cell.pass_, q, k, v, dout, plan)

    rep = cell.repeat_dict
    idle_s = 0.0
    if rep.get("cooldown_s"):  # every rank idles together (repeat.cooldown_s), then reads its clock
        dist.barrier()
        idle_s = cool_down(rep["cooldown_s"], device)
        dist.barrier()
    clock0 = gpu_clock_state() if device.type == "cuda" else {}
    timer = RankTimer(timer_for(device, bool(rep.get("l2_flush", True))), dist.barrier, lambda x: _agree_max(x, device))
    comm.bytes_sent = 0
    with ClockSampler(gpu_clock_state) if device.type == "cuda" else no_sampler() as window:
        timing = time_under(timer, run, rep)
    bytes_per_iter = comm.bytes_sent // max(1, timing.timed_iters + timing.warmup_iters)
    peak = int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None
    comm.enabled = False  # the same local attention calls with communication removed
    free = time_under(timer, run, dict(rep, warmup=0, iters=timing.timed_iters, min_iters=1, ci_target=None))
    comm.enabled = True
    clock1 = gpu_clock_state() if device.type == "cuda" else {}
    per_rank = _gather(
        {
            "samples": timing.samples_ms,
            "free": free.samples_ms,
            "bytes": bytes_per_iter,
            "peak": peak,
            "clock0": clock0.get("clock_mhz"),
            "clock1": clock1.get("clock_mhz"),
            "throttle": clock1.get("throttle"),
            **window.summary(),
        }
    )
    # the iteration time is the slowest rank's (every rank ran the same count: the timer agrees on it)
    timing.samples_ms = [max(r["samples"][i] for r in per_rank) for i in range(timing.timed_iters)]
    free_ms = [max(r["free"][i] for r in per_rank) for i in range(free.timed_iters)]
    if cell.pass_ == Pass.BWD:
        timing.timer += RETAINED_GRAPH
    flops = softmax_flops(b * mask_area_q_heads(mask, cell.heads_q) / cell.heads_q, cell)
    return {
        **mask_columns(mask, sample),
        "mask_area": sum(rank_area),
        "rank_area": rank_area,
        **timing_columns(timing, flops, b * s, world),
        "mask_build_s": mask_build_s,
        "compile_s": timing.compile_s + plan_s,  # plan (sub-masks) + first call
        "cooldown_s": idle_s,
        "timer_wall_s": timing.wall_s + free.wall_s,  # warm-up, both timed loops, barriers
        "rank_ms": [_median(r["samples"]) for r in per_rank],
        **_rank_clocks(per_rank),
        "rank_bytes_sent": [int(r["bytes"]) for r in per_rank],
        "rank_peak_mem_bytes": [r["peak"] for r in per_rank] if device.type == "cuda" else None,
        "peak_mem_bytes": max(r["peak"] for r in per_rank) if device.type == "cuda" else None,
        "comm_exposed_ms": timing.median_ms - _median(free_ms),
        **({"graph_reason": CP_GRAPH_REASON} if rep.get("graph") else {}),
        **agreement,
    }


def _full_length_agreement(
    cell: Cell, rank: int, world: int, device: torch.device, plan, sharding, mask, q, k, v, dout
) -> dict[str, Any]:
    """With `check.agree_with` on a cell longer than its check: this draw's CP output (and, for a cell
    with a backward, its gradients with the draw's upstream gradient) and every rank's inputs gathered
    to global tensors on rank 0, compared there with a single-device kernel's on them
    (longca.run.agreement); the columns (and an `incorrect` reason) reach every rank."""
    if not agreement_applies(cell):
        return {}
    grads = compares_gradients(cell)
    local = [x.detach().requires_grad_(grads) for x in (q, k, v)]
    out, local_grads = _run_pass(Pass.BWD if grads else Pass.FWD, *local, dout, plan)
    names = ["q", "k", "v", "out"] + (["dout", *GRADIENTS] if grads else [])
    tensors = [q, k, v, out.detach()] + ([dout, *local_grads] if grads else [])
    del out, local_grads
    # gathered to rank 0 alone, one tensor at a time: (B, H, local, D) per rank -> (B, H, S, D) at the
    # sharding's positions, so no rank but 0 holds a whole sequence and rank 0 never holds one twice
    positions = [torch.from_numpy(sharding.positions(r)).to(device) for r in range(world)] if rank == 0 else []
    whole = {}
    for name, x in zip(names, tensors):
        parts = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        dist.gather(x.contiguous(), parts, dst=0)
        if rank == 0:
            g = x.new_empty(*x.shape[:2], cell.seqlen, x.shape[3])
            for pos, part in zip(positions, parts):
                g[:, :, pos] = part
            whole[name] = g.transpose(1, 2)  # a BSHD view
        del parts
    del tensors
    result: dict[str, Any] | None = None
    if rank == 0:
        result = compare(
            single_device(cell),
            mask,
            (whole["q"], whole["k"], whole["v"]),
            lambda: {n: whole[n] for n in ("out", *GRADIENTS) if n in whole},
            device,
            exclude_self=False,
            dout_bshd=whole.get("dout"),
        )
    whole.clear()
    box = [result]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _agreed(phase: str, fn, device: torch.device, *args: Any):
    """Run one phase, fn(*args), on every rank; if any rank failed, every rank raises the worst status with the
    first rank's reason (an all-reduce), so the group stays in step for the next cell."""
    status, reason, result, columns = Status.OK, None, None, {}
    try:
        result = fn(*args)
    except CellFailure as e:
        status, reason, columns = e.status, e.reason, e.columns
    except Exception as e:  # noqa: BLE001 - any failure becomes the cell's row
        status, reason = classify(e)
        if status == Status.ERROR:
            traceback.print_exc(file=sys.stderr)
    if device.type == "cuda" and status != Status.OK:
        torch.cuda.empty_cache()
    code = int(_agree_max(STATUS_CODE[Status(status)], device))
    if code:
        reasons = _gather(reason)
        worst = next(s for s, c in STATUS_CODE.items() if c == code)
        reason = next((r for r in reasons if r), "failed on another rank")
        raise CellFailure(worst, f"{phase}: {reason}", columns)
    return result


def run_cell(cell: Cell, rank: int, world: int, device: torch.device) -> list[dict[str, Any]]:
    """Every row of one CP cell (one per mask draw), on every rank (complete on rank 0)."""
    t_cell = time.perf_counter()
    check_s = 0.0
    rows: list[dict[str, Any]] = []
    check: dict[str, Any] = {}
    try:
        if world != cell.world_size:
            raise CellFailure(Status.ERROR, f"the cell's world_size {cell.world_size} but the group has {world} ranks")

        def prepare():
            kernel = rank_kernel(cell.kernel)
            runtime_refusal(cell, kernel)
            return kernel

        kernel = _agreed("plan", prepare, device)
        if cell.check_dict.get("enabled", True):
            t_check = time.perf_counter()

            def verify():
                result = correctness(cell, rank, world, device, kernel)
                check.update(result)  # kept for the row when the verdict fails
                failed = check_verdict(cell, result)  # identical on every rank (all-reduced errors)
                if failed:
                    raise CellFailure(Status.INCORRECT, failed)
                return result

            try:
                _agreed("check", verify, device)
            finally:
                check_s = time.perf_counter() - t_check
        for sample in range(cell.samples):
            timed_kernel = rank_kernel(cell.kernel)  # a fresh instance: what it records describes the timed run
            row = base_row(cell)
            row.update(_agreed("measure", measure, device, cell, rank, world, device, timed_kernel, sample))
            row.update(check_columns(check), status=Status.OK.value, reason=None)
            detail = timed_kernel.backend_detail()
            row["backend"] = detail or cell.kernel  # rank 0's kernel configuration (its steps)
            gate_peak(row, device)
            rows.append(row)
    except CellFailure as e:
        rows = [status_row(cell, e.status, e.reason, **check_columns(check), **e.columns)]
    for r in rows:
        r.update(cell_wall_s=time.perf_counter() - t_cell, check_s=check_s)
    return rows


def main(argv: list[str] | None = None) -> int:
    # Every thread's stack on SIGUSR1: the supervisor asks for them before killing a hung group.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # a rank outliving its launcher would keep timing on the device; its supervisor may have gone
    # while this process imported torch
    die_with_parent(supervisor=int(os.environ.get(SUPERVISOR_ENV) or 0) or None)
    job_file, done_dir = (argv if argv is not None else sys.argv[1:])[:2]
    job = json.loads(Path(job_file).read_text())
    cells = [Cell.from_json(c) for c in job["cells"]]
    devices = {c.device for c in cells}
    backends = {c.cp_backend for c in cells}
    if len(devices) > 1 or len(backends) > 1:
        raise SystemExit(
            f"one process group runs one device and backend; cells ask for {sorted(devices)} "
            f"and {sorted(map(str, backends))}"
        )
    device_type = devices.pop()
    load_all()  # the same kernels (and LONGCA_PLUGINS) as single-device workers
    timeout_s = max((c.timeout_s for c in cells), default=DEFAULT_TIMEOUT_S)
    rank, world, local = init_distributed(backends.pop(), timeout_s)
    device = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
    before, total = job.get("progress") or (0, 0)
    try:
        for j, (cell, output) in enumerate(zip(cells, job["outputs"])):
            rows = run_cell(cell, rank, world, device)
            if rank == 0:
                write_rows(output, rows)
                Path(done_dir, f"{cell.digest}.done").touch()
                print(cell_line(cell, summarize(rows), place(before, j, total)), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
