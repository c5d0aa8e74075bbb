"""Run context-parallel cells in one process group; rank 0 writes one result dict per cell.

    torchrun --nproc-per-node N -m longca.cp.bench --cells-json CELLS.json --out-dir DIR
    srun -n N python -m longca.cp.bench --cells-json CELLS.json --out-dir DIR

CELLS.json is a list of cells (dicts) with keys: cell_id, mechanism, mask, mask_params, seqlen
(global), batch, heads_q, heads_kv, head_dim, dtype, pass, world_size, degrees {ulysses, ring,
windows}, balance, local_kernel, seed, warmup, iters, budget_s, device, backend; optional:
mask_sample, check_seqlen, warmup_s (warm-up time budget: stop warming up once every rank has spent
it, after at least one iteration), cooldown_s (every rank idles this long before the warm-up). Each cell yields DIR/<cell_id>.json (written atomically) whose keys
are columns of longca.store.schema, with a status: ok, unsupported, incorrect, oom or error.

Per cell: the mask is cut for this sharding; the mechanism is first checked against a
single-process reference at check_seqlen (the cell's length if small, else a reduced length with
the same mask pattern and parameters) in output and, for backward passes, q/k/v gradients; then
timed at the full length: a barrier before every iteration, each rank timed (CUDA events /
perf_counter), iteration time = max over ranks. The same iterations are then replayed with
communication replaced by local no-ops: exposed communication = median iteration time minus
median communication-free time (noise can make it slightly negative; it is not clipped).
Block-sparse masks (block_sparse, variable_block_sparse; kept blocks per KV head, random scores)
run with local kernels that take block lists (naive, flex, triton_block_sparse) on contiguous or
zigzag sharding; their areas and FLOPs use the mean area per head, as single-device rows do.
All ranks agree on every failure (an all-reduced status) so one cell's failure never
desynchronises the next. A failure inside a collective on one rank only can still stall the group,
until the collective timeout (the largest timeout_s of the cells) makes it fail; the caller
(longca.run.chunk) gives each cell its own limit and turns a cell without an output file into a
`timeout` or `error` row.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import math
import os
import platform
import signal
import sys
import time
import traceback
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from longca.cp.comm import Comm
from longca.cp.local import Unsupported, check_local, get_local
from longca.cp.mechanisms import MECHANISMS, build_plan, cp_attention, resolve_degrees
from longca.cp.reference import reference_attention
from longca.cp.sharding import BALANCES, granule, make_sharding
from longca.cp.ulysses import kv_replication
from longca.kernels.registry import load_plugins
from longca.masks.registry import PATTERNS, build_mask
from longca.measure.cooldown import cool_down
from longca.measure.env import gpu_clock_state
from longca.measure.timer import RETAINED_GRAPH

PASSES = ("fwd", "bwd", "fwd_bwd")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Largest relative error that passes, by input dtype (measurement.md: bf16 lands 1e-3..1e-2).
TOLERANCE = {"float64": 1e-8, "float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5}
CHECK_SEQLEN = {"cpu": 256, "cuda": 4096}  # default reduced length of the correctness check
REQUIRED = ("cell_id", "mechanism", "mask", "seqlen", "batch", "heads_q", "heads_kv", "head_dim", "dtype",
            "pass", "world_size", "balance", "local_kernel")
STATUS_CODE = {"ok": 0, "unsupported": 1, "incorrect": 2, "oom": 3, "error": 4}
DEFAULT_TIMEOUT_S = 600.0  # collective timeout when cells carry no timeout_s


class CellFailure(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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
        raise SystemExit("longca.cp.bench must be launched by torchrun or srun (no RANK / SLURM_PROCID)")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size(), local


def _rank_clocks(per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The lowest SM clock over ranks at start and end, and the throttle reasons of any rank."""
    def low(key: str) -> int | None:
        values = [r[key] for r in per_rank if r.get(key) is not None]
        return min(values) if values else None

    masks = [int(r["throttle"], 16) for r in per_rank if r.get("throttle")]
    either = 0
    for m in masks:
        either |= m
    return {"clock_start_mhz": low("clock0"), "clock_end_mhz": low("clock1"),
            "throttle_reasons": hex(either) if masks else None}


def _agree(code: int, device: torch.device) -> int:
    t = torch.tensor([code], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def _gather(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


# ------------------------------------------------------------------------------------ helpers
def validate_cell(cell: dict, world: int) -> None:
    """Raise ValueError naming the field, its value and the allowed values."""
    missing = [k for k in REQUIRED if k not in cell]
    if missing:
        raise ValueError(f"cell is missing field(s) {missing}")
    choices = {"mechanism": sorted(MECHANISMS), "pass": list(PASSES), "dtype": sorted(DTYPES),
               "balance": list(BALANCES), "mask": sorted(PATTERNS)}
    for key, allowed in choices.items():
        if cell[key] not in allowed:
            raise ValueError(f"cell field {key!r} = {cell[key]!r}; allowed: {allowed}")
    if int(cell["world_size"]) != world:
        raise ValueError(f"cell field 'world_size' = {cell['world_size']} but the process group has {world} ranks")
    for key in ("seqlen", "batch", "heads_q", "heads_kv", "head_dim"):
        if int(cell[key]) < 1:
            raise ValueError(f"cell field {key!r} = {cell[key]!r}; allowed: integers >= 1")


def check_block_sparse(cell: dict, kernel) -> None:
    """Raise Unsupported for block-sparse cells CP cannot run as asked (ValueError for bad params)."""
    from longca.masks.registry import resolve_params

    if PATTERNS[cell["mask"]].family != "dynamic":
        return
    params = resolve_params(cell["mask"], cell.get("mask_params"))
    if params.get("score") != "random":
        raise Unsupported(f"mask_params.score={params.get('score')!r}: CP cells draw each rank's inputs "
                          f"separately, so importance scores of the global inputs do not exist; use score='random'")
    if not hasattr(kernel, "prepare_blocks"):
        raise Unsupported(f"local_kernel {kernel.name!r} takes slice masks only; block-sparse masks need "
                          f"naive, flex or triton_block_sparse")
    if cell["balance"] == "document":
        raise Unsupported("balance='document' balances slice masks by row area; a block-sparse mask keeps the "
                          "same number of key blocks in every query block, so use balance 'contiguous' or 'zigzag'")


def _mask(cell: dict, seqlen: int):
    return build_mask(cell["mask"], seqlen, cell.get("mask_params"), seed=int(cell.get("seed", 0)),
                      sample=int(cell.get("mask_sample", 0)), heads_kv=int(cell["heads_kv"]))


def mask_area_q_heads(mask, heads_q: int) -> int:
    """Attended (query head, q, k) triples of one batch element: area x Hq for shared masks, the
    sum over KV heads x the GQA group for per-KV-head masks (exact integers)."""
    if mask.per_head:
        return int(mask.area_of_heads().sum()) * (heads_q // mask.heads)
    return mask.area * heads_q


def check_length(cell: dict, world: int, device: str) -> int:
    """The correctness-check length: the cell's own if small enough, else the largest multiple of
    the sharding granule (4 W, which every balance divides) up to the device default."""
    s = int(cell["seqlen"])
    target = int(cell.get("check_seqlen") or CHECK_SEQLEN[device])
    if s <= target:
        return s
    granule = 4 * world * 16
    return max(granule, target // granule * granule)


def _sq_norms(x: torch.Tensor, ref: torch.Tensor) -> list[float]:
    x, ref = x.detach().double(), ref.detach().double()
    return [float(((x - ref) ** 2).sum()), float((ref ** 2).sum())]


def _median(xs: list[float]) -> float:
    return float(np.median(xs)) if xs else float("nan")


class Timer:
    """Per-iteration wall time of this rank: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def start(self) -> None:
        if self.cuda:
            self._a = torch.cuda.Event(enable_timing=True)
            self._b = torch.cuda.Event(enable_timing=True)
            self._a.record()
        else:
            self._t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self._b.record()
            torch.cuda.synchronize()
            return self._a.elapsed_time(self._b)
        return (time.perf_counter() - self._t) * 1e3


# ---------------------------------------------------------------------------------- the cell
def _inputs(cell: dict, seqlen: int, device: torch.device, generator_device: str, seed: int):
    """Global q, k, v, dout (B, H, S, D), identical on every rank (same seed)."""
    g = torch.Generator(generator_device).manual_seed(seed)
    dt = DTYPES[cell["dtype"]]
    b, hq, hk, d = (int(cell[k]) for k in ("batch", "heads_q", "heads_kv", "head_dim"))
    mk = lambda h: torch.randn(b, h, seqlen, d, generator=g, device=generator_device).to(device=device, dtype=dt)
    return mk(hq), mk(hk), mk(hk), mk(hq)


def _run_pass(pass_: str, q, k, v, dout, plan):
    if pass_ == "fwd":
        with torch.no_grad():
            return cp_attention(q, k, v, plan), None
    out = cp_attention(q, k, v, plan)
    return out, torch.autograd.grad(out, (q, k, v), dout)


def correctness(cell: dict, rank: int, world: int, device: torch.device, kernel) -> dict:
    """Relative errors of output (and gradients) against the reference at the check length."""
    s = check_length(cell, world, device.type)
    mask = _mask(cell, s)
    sharding = make_sharding(cell["balance"], s, world, mask.slices)
    plan = build_plan(cell["mechanism"], cell.get("degrees"), mask.slices, sharding, rank,
                      int(cell["heads_q"]), int(cell["heads_kv"]), kernel, device, blocks=mask.blocks)
    q, k, v, dout = _inputs(cell, s, device, "cpu", int(cell.get("seed", 0)) + 1)
    pos = torch.from_numpy(sharding.positions(rank)).to(device)
    ql, kl, vl = (x[:, :, pos].contiguous().requires_grad_(cell["pass"] != "fwd") for x in (q, k, v))
    out, grads = _run_pass(cell["pass"], ql, kl, vl, dout[:, :, pos].contiguous(), plan)
    ref_dtype = torch.float64 if device.type == "cpu" else torch.float32
    ref = reference_attention(q, k, v, mask if mask.per_head else mask.slices,
                              None if cell["pass"] == "fwd" else dout, ref_dtype,
                              kv_heads_per_chunk=1)
    mine = [out] + list(grads or [])
    sums = torch.tensor([x for a, r in zip(mine, ref) for x in _sq_norms(a, r[:, :, pos])],
                        dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    sums = sums.tolist()
    errs = [math.sqrt(sums[2 * i] / sums[2 * i + 1]) if sums[2 * i + 1] > 0 else math.sqrt(sums[2 * i])
            for i in range(len(mine))]
    names = ["rel_err_out", "rel_err_dq", "rel_err_dk", "rel_err_dv"]
    return {"check_seqlen": s, **dict(zip(names, errs))}


def measure(cell: dict, rank: int, world: int, device: torch.device, kernel, row: dict) -> None:
    """Build the full-size plan and inputs, then time the pass (with and without communication)."""
    s = int(cell["seqlen"])
    t0 = time.perf_counter()
    mask = _mask(cell, s)
    sharding = make_sharding(cell["balance"], s, world, mask.slices)
    row["mask_build_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    comm = Comm()
    plan = build_plan(cell["mechanism"], cell.get("degrees"), mask.slices, sharding, rank,
                      int(cell["heads_q"]), int(cell["heads_kv"]), kernel, device, comm, blocks=mask.blocks)
    plan_s = time.perf_counter() - t0
    b = int(cell["batch"])
    rank_area = plan.rank_area(b)
    row.update(mask_params=json.dumps(mask.params, sort_keys=True, default=str),
               num_documents=len(mask.documents) if mask.documents else None,
               distribution=mask.params.get("distribution"),
               mask_area=sum(rank_area), density=mask.density,  # area per head (mean over KV heads)
               rank_area=rank_area)
    # Random local inputs (timing never runs on zeros); generated on the device, per rank.
    g = torch.Generator(device.type).manual_seed(int(cell.get("seed", 0)) * 1000 + rank)
    dt = DTYPES[cell["dtype"]]
    n = sharding.local_len
    hq, hk, d = int(cell["heads_q"]), int(cell["heads_kv"]), int(cell["head_dim"])
    need_grad = cell["pass"] != "fwd"
    q = torch.randn(b, hq, n, d, generator=g, device=device, dtype=dt).requires_grad_(need_grad)
    k = torch.randn(b, hk, n, d, generator=g, device=device, dtype=dt).requires_grad_(need_grad)
    v = torch.randn(b, hk, n, d, generator=g, device=device, dtype=dt).requires_grad_(need_grad)
    dout = torch.randn(b, hq, n, d, generator=g, device=device, dtype=dt)
    timer = Timer(device)
    pass_ = cell["pass"]
    if pass_ == "bwd":  # backward timed from one saved forward
        out = cp_attention(q, k, v, plan)
        run = lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    else:
        run = lambda: _run_pass(pass_, q, k, v, dout, plan)
    budget = float(cell.get("budget_s", 60.0))
    warmup, iters = int(cell.get("warmup", 5)), int(cell.get("iters", 20))
    warmup_s = cell.get("warmup_s")
    idle_s = 0.0
    if cell.get("cooldown_s"):  # every rank idles together (repeat.cooldown_s), then reads its clock
        dist.barrier()
        idle_s = cool_down(cell["cooldown_s"], device)
        dist.barrier()
    clock0 = gpu_clock_state() if device.type == "cuda" else {}
    t_begin = time.perf_counter()
    tw = time.perf_counter()
    warmed = 0
    for i in range(max(1, warmup)):
        run()
        warmed += 1
        if i == 0 or warmup_s is not None:
            if device.type == "cuda":
                torch.cuda.synchronize()
        if i == 0:  # the first call compiles (flex) and autotunes: recorded apart from kernel time
            compile_s = time.perf_counter() - tw
        # ranks stop together (an all-reduce), or the next collective would pair different calls
        if warmup_s is not None and _agree(int(time.perf_counter() - tw >= float(warmup_s)), device):
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    warmup_wall = time.perf_counter() - tw
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    def loop(n_iters: int) -> list[float]:
        samples = []
        for i in range(n_iters):
            dist.barrier()
            if device.type == "cuda":
                torch.cuda.synchronize()
            timer.start()
            run()
            samples.append(timer.stop())
            over = 1 if time.perf_counter() - t_begin > budget else 0
            if _agree(over, device):
                break
        return samples

    comm.bytes_sent = 0
    samples = loop(iters)
    bytes_per_iter = comm.bytes_sent // max(1, len(samples))
    peak = int(torch.cuda.max_memory_allocated()) if device.type == "cuda" else None
    comm.enabled = False  # the same local attention calls with communication removed
    t_begin = time.perf_counter()
    free = loop(max(1, min(len(samples), iters)))
    comm.enabled = True
    timer_wall = time.perf_counter() - tw
    clock1 = gpu_clock_state() if device.type == "cuda" else {}
    per_rank = _gather({"samples": samples, "free": free, "bytes": bytes_per_iter, "peak": peak,
                        "clock0": clock0.get("clock_mhz"), "clock1": clock1.get("clock_mhz"),
                        "throttle": clock1.get("throttle")})
    n_it = min(len(r["samples"]) for r in per_rank)
    it_ms = [max(r["samples"][i] for r in per_rank) for i in range(n_it)]
    n_free = min(len(r["free"]) for r in per_rank)
    free_ms = [max(r["free"][i] for r in per_rank) for i in range(n_free)]
    med = _median(it_ms)
    flops = FLOP_FACTOR[pass_] * 4.0 * b * mask_area_q_heads(mask, hq) * d
    row.update(
        samples_ms=it_ms, median_ms=med, p20_ms=float(np.percentile(it_ms, 20)), p80_ms=float(np.percentile(it_ms, 80)),
        warmup_iters=warmed, timed_iters=n_it, rank_ms=[_median(r["samples"]) for r in per_rank],
        warmup_s=warmup_wall, cooldown_s=idle_s,
        timer_wall_s=timer_wall,  # warm-up, both timed loops (with and without communication), barriers
        # the slowest rank's clock bounds each iteration (the max over ranks); reasons of any rank
        **_rank_clocks(per_rank),
        rank_bytes_sent=[int(r["bytes"]) for r in per_rank],
        rank_peak_mem_bytes=[r["peak"] for r in per_rank] if device.type == "cuda" else None,
        peak_mem_bytes=max(r["peak"] for r in per_rank) if device.type == "cuda" else None,
        comm_exposed_ms=med - _median(free_ms),
        compile_s=compile_s + plan_s,  # plan (sub-masks, block masks) + first call
        flops=flops, flop_model="softmax_exact_area",
        tflops=flops / (med * 1e-3 * world) / 1e12, tokens_per_s=b * s / (med * 1e-3),
    )


def _base_row(cell: dict, world: int, device: torch.device, kernel_name: str) -> dict:
    deg = None
    try:
        u, r, w = resolve_degrees(cell["mechanism"], world, cell.get("degrees"))
        deg = {"ulysses": u, "ring": r, "windows": w}
    except (ValueError, KeyError):
        pass
    pat = PATTERNS.get(cell.get("mask"))
    return {
        "cell_id": cell.get("cell_id"), "kernel": kernel_name, "kernel_family": "softmax", "pass": cell.get("pass"),
        "batch": cell.get("batch"), "seqlen_q": cell.get("seqlen"), "seqlen_k": cell.get("seqlen"),
        "heads_q": cell.get("heads_q"), "heads_kv": cell.get("heads_kv"), "head_dim": cell.get("head_dim"),
        "head_dim_v": cell.get("head_dim"), "dtype": cell.get("dtype"), "layout": "bhsd",
        "mask": cell.get("mask"), "mask_family": pat.family if pat else None,
        "mask_params": json.dumps(cell.get("mask_params") or {}, sort_keys=True),
        "mask_form": "block_sparse" if pat and pat.family == "dynamic" else "slices",
        "seed": cell.get("seed", 0), "mask_sample": cell.get("mask_sample", 0),
        "world_size": world, "cp_mechanism": cell.get("mechanism"), "cp_degrees": json.dumps(deg, sort_keys=True),
        "cp_balance": cell.get("balance"),
        "timer": ("cuda_events" if device.type == "cuda" else "cpu_monotonic")
        + (RETAINED_GRAPH if cell.get("pass") == "bwd" else ""),  # bwd: every sample on one forward's graph
        "l2_flush": False, "backend": kernel_name, "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or "cpu"),
        "device_count": world, "torch": torch.__version__,
    }


def run_cell(cell: dict, rank: int, world: int, device: torch.device) -> dict:
    """One cell, on every rank; returns the row (complete on rank 0)."""
    t_cell = time.perf_counter()
    name = str(cell.get("local_kernel", "naive"))
    row = _base_row(cell, world, device, name)
    status, reason = "ok", None
    try:
        try:
            validate_cell(cell, world)
            kernel = get_local(name)
            check_local(kernel, device.type, cell["dtype"])
            u, _, _ = resolve_degrees(cell["mechanism"], world, cell.get("degrees"))
            kv_replication(int(cell["heads_q"]), int(cell["heads_kv"]), u)
            check_block_sparse(cell, kernel)
            for length in (int(cell["seqlen"]), check_length(cell, world, device.type)):
                if length % granule(cell["balance"], world):
                    raise Unsupported(f"seqlen={length} is not a multiple of {granule(cell['balance'], world)}, "
                                      f"which balance={cell['balance']!r} needs at world_size={world}")
        except Unsupported as e:
            raise CellFailure("unsupported", str(e))
        except ValueError as e:
            raise CellFailure("error", f"invalid cell: {e}")
        for phase in ("check", "measure"):
            local_status, local_reason = "ok", None
            try:
                if phase == "check":
                    t_check = time.perf_counter()
                    errs = correctness(cell, rank, world, device, kernel)
                    row.update(errs, check_s=time.perf_counter() - t_check)
                    tol = TOLERANCE[cell["dtype"]]
                    bad = {k: v for k, v in errs.items() if k.startswith("rel_err") and not v <= tol}
                    if bad:  # identical on every rank (all-reduced errors)
                        raise CellFailure("incorrect", f"relative error above {tol:g} at S={errs['check_seqlen']}: "
                                          + ", ".join(f"{k}={v:.3g}" for k, v in bad.items()))
                else:
                    kernel = get_local(name)  # a fresh instance: what it records describes the timed run
                    measure(cell, rank, world, device, kernel, row)
                    detail = getattr(kernel, "backend_detail", lambda: None)()
                    if detail:  # rank 0's kernel configuration (this rank's steps)
                        row["backend"] = detail
            except CellFailure as e:
                local_status, local_reason = e.status, e.reason
            except Unsupported as e:
                local_status, local_reason = "unsupported", str(e)
            except torch.cuda.OutOfMemoryError as e:
                local_status, local_reason = "oom", str(e).splitlines()[0]
            except Exception as e:  # noqa: BLE001 - any failure becomes the cell's row
                local_status, local_reason = "error", f"{type(e).__name__}: {e}"
                traceback.print_exc(file=sys.stderr)
            if device.type == "cuda" and local_status != "ok":
                torch.cuda.empty_cache()
            code = _agree(STATUS_CODE[local_status], device)
            if code:
                reasons = _gather(local_reason)
                worst = [s for s, c in STATUS_CODE.items() if c == code][0]
                first = next((r for r in reasons if r), "failed on another rank")
                raise CellFailure(worst, f"{phase}: {first}")
    except CellFailure as e:
        status, reason = e.status, e.reason
    row.update(status=status, reason=reason, cell_wall_s=time.perf_counter() - t_cell)
    return row


def write_row(row: dict, out_dir: str) -> str:
    """Atomic write of DIR/<cell_id>.json (tmp file, then os.replace)."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{row['cell_id']}.json")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(row, f, sort_keys=True, default=float)
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    # Every thread's stack on SIGUSR1: the supervisor asks for them before killing a hung group.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    ap = argparse.ArgumentParser(prog="python -m longca.cp.bench", description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--cells-json", help="JSON list of CP cells")
    src.add_argument("--preset", help="a named list of cells from longca.cp.presets")
    ap.add_argument("--only", default=None, help="run only cells whose cell_id contains this text")
    ap.add_argument("--out-dir", required=True, help="one <cell_id>.json per cell is written here")
    args = ap.parse_args(argv)
    if args.preset:
        from longca.cp.presets import PRESETS

        if args.preset not in PRESETS:
            raise SystemExit(f"unknown preset {args.preset!r}; allowed: {sorted(PRESETS)}")
        cells = PRESETS[args.preset]()
    else:
        with open(args.cells_json) as f:
            cells = json.load(f)
    if isinstance(cells, dict):
        cells = [cells]
    if args.only:
        cells = [c for c in cells if args.only in c["cell_id"]]
    devices = {c.get("device", "cpu") for c in cells}
    backends = {c.get("backend") for c in cells} - {None}
    if len(devices) > 1 or len(backends) > 1:
        raise SystemExit(f"one process group runs one device and backend; cells ask for {sorted(devices)} "
                         f"and {sorted(backends)}")
    device_type = devices.pop() if devices else "cpu"
    backend = backends.pop() if backends else ("nccl" if device_type == "cuda" else "gloo")
    # The same plugins as single-device workers (they may add LOCAL_KERNELS, e.g. tests' faulty ones).
    load_plugins()
    timeout_s = max((float(c["timeout_s"]) for c in cells if c.get("timeout_s")), default=DEFAULT_TIMEOUT_S)
    rank, world, local = init_distributed(backend, timeout_s)
    device = torch.device("cuda", local) if device_type == "cuda" else torch.device("cpu")
    try:
        for cell in cells:
            row = run_cell(cell, rank, world, device)
            if rank == 0:
                write_row(row, args.out_dir)
                print(f"[cp] {row['cell_id']}: {row['status']}"
                      + (f" ({row['reason']})" if row["reason"] else f" {row['median_ms']:.3f} ms, "
                         f"{row['tflops']:.2f} TFLOP/s/GPU, exposed comm {row['comm_exposed_ms']:.3f} ms"), flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
