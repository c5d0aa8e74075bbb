"""Run one single-device cell: build the mask, check correctness, time, and return result rows.

Every outcome is a row: ok, unsupported (with the reason), oom, error, incorrect. Timeouts and
crashes are recorded by the supervising process (longca.run.chunk), which owns the clock.
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from longca.kernels.base import (
    DTYPES,
    backward_refusal,
    grad_changes_form,
    prepares_per_pass,
)
from longca.kernels.layout import from_bshd, to_bshd
from longca.masks.mask import Mask
from longca.masks.registry import build_mask
from longca.measure.clocks import ClockSampler, no_sampler
from longca.measure.cooldown import cool_down
from longca.measure.env import gpu_clock_state
from longca.measure.graphs import capture
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error
from longca.measure.reference_cache import ReferenceCache, default_budget_bytes
from longca.measure.timer import RETAINED_GRAPH, time_under, timer_for
from longca.run.agreement import GRADIENTS, agreement_applies, compare, compares_gradients
from longca.run.check import check_columns, check_verdict, tolerance
from longca.run.lifeline import RunStopped
from longca.run.rows import base_row, classify, gate_peak, mask_columns, softmax_flops, status_row, timing_columns
from longca.run.serving import beyond_memory, planned_unsupported, prepare_for, runtime_unsupported
from longca.run.time_left import LeftForLater
from longca.spec.cells import Cell
from longca.store.draws import load_draw, save_draw
from longca.vocab import Pass, Status

# The last masks built, for the next cell of the same problem (a sweep runs a problem's cells, every
# kernel and pass, one after the other): a 512K block-64 layout takes ~20 s to draw; three draws.
MASKS_KEPT = 4
CHECKS_KEPT = 4096


@dataclass
class CellCaches:
    """What a process keeps from one cell for the next, owned by whoever runs the cells (a worker
    keeps one for its chunk; `run_cell` without one starts afresh): correctness checks at the reduced
    length (every longer cell of the same kernel, mask, shape and dtype shares one), references (every
    kernel checked on one problem shares one: longca.measure.reference_cache), full-length results
    for the agreement (every kernel of one problem and draw shares a comparator's) and the last masks
    drawn (not those drawn from a cell's inputs)."""

    checks: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    references: ReferenceCache = field(default_factory=ReferenceCache)
    masks: dict[tuple, Mask] = field(default_factory=dict)
    # full-length results of comparators and listed kernels per draw (longca.run.agreement): at 512K
    # an entry with gradients is about 19 GB, and a problem's cells need two of them
    agreements: ReferenceCache = field(default_factory=lambda: ReferenceCache(default_budget_bytes(0.4, 64 << 30)))


def _make_inputs(
    cell: Cell, seqlen: int, layout: str, device: torch.device, dtype: torch.dtype, seed: int, need_grad: bool
) -> tuple[torch.Tensor, ...]:
    """Random normal q, k, v, dout in the kernel's layout (never zeros).

    Drawn on the cell's device by its own generator: at 32K tokens x 64 heads the CPU generator
    took seconds per cell (most of a GPU cell's wall time), the device one milliseconds. The same
    seed gives the same inputs on the same device type.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    b, hq, hkv, d = cell.batch, cell.heads_q, cell.heads_kv, cell.head_dim
    # float32 on the CPU (its generator's reference path); the target dtype directly on a GPU, but
    # bf16 for fp8, which torch does not draw: N(0, 1) rounded to e4m3 unscaled (well inside its
    # +-448), so an fp8 kernel's descales are 1 and nothing but the kernel is timed
    draw_dtype = torch.float32 if device.type != "cuda" else (torch.bfloat16 if dtype.itemsize == 1 else dtype)

    def rand(h: int) -> torch.Tensor:
        x = torch.randn(b, seqlen, h, d, generator=gen, dtype=draw_dtype, device=device)
        return x.to(dtype=dtype)

    q, k, v, do = rand(hq), rand(hkv), rand(hkv), rand(hq)
    tensors = []
    for x in (q, k, v, do):
        if layout == "bhsd":
            x = x.transpose(1, 2).contiguous()
        elif layout == "thd":
            x = x.reshape(b * seqlen, x.shape[2], d).contiguous()
        tensors.append(x)
    for x in tensors[:3]:
        x.requires_grad_(need_grad)
    return tuple(tensors)


def _build(
    cell: Cell, seqlen: int, sample: int, caches: CellCaches, inputs=None, keep: bool = False
) -> tuple[Mask, float]:
    """The cell's mask at `seqlen` and its build time. With `keep` (the timed samples; checks are at
    most check.max_seqlen long, where drawing is cheap) an earlier sample's identical mask is reused,
    with build time 0.0."""
    t0 = time.perf_counter()
    params = dict(cell.mask_params)
    pattern = cell.pattern
    # Block-sparse layouts are per KV head; importance scores come from the cell's own inputs.
    wants_inputs = pattern.needs_inputs_for(params)
    key = None if wants_inputs or not keep else (cell.mask, cell.mask_params, seqlen, cell.seed, sample, cell.heads_kv)
    try:
        hash(key)
    except TypeError:  # a parameter given as a list: not worth a canonical form here
        key = None
    kept = caches.masks
    if key is not None and key in kept:
        kept[key] = kept.pop(key)  # most recently used last
        return kept[key], 0.0
    mask = build_mask(
        cell.mask,
        seqlen,
        params,
        seed=cell.seed,
        sample=sample,
        heads_kv=cell.heads_kv,
        inputs=inputs if wants_inputs else None,
    )
    if key is not None:
        while len(kept) >= MASKS_KEPT:
            kept.pop(next(iter(kept)))
        kept[key] = mask
    return mask, time.perf_counter() - t0


# dtypes whose rounding of the inputs alone is larger than a correct kernel's own error: e4m3 keeps 3
# mantissa bits, and rounding q, k, v moved Flex's fp8 output by 5-6% from the float32 reference on
# the unrounded draws, against 3.1-3.9% from the reference on the rounded ones (H200). Their
# reference takes the rounded inputs, so the check judges the kernel; bf16 and fp16 keep the float32
# draws (their rounding is ~0.3%), as since the first sweep.
ROUNDED_REFERENCE_DTYPES = frozenset({"float8_e4m3fn"})


def checks_gradients(kernel: Any, cell: Cell, device: torch.device) -> bool:
    """Whether the check compares gradients too. On a GPU a forward cell's check does (one check with
    gradients serves the fwd, bwd and fwd_bwd cells of the same shape), but never in a dtype the
    kernel's backward does not take: Flex's fp8 backward fails to compile, and trying it cost every
    fp8 check an Inductor compile."""
    caps = kernel.caps
    return (
        caps.backward_reason(dtype=cell.dtype, head_dim=cell.head_dim, gqa=cell.heads_q != cell.heads_kv) is None
        and (cell.pass_ != Pass.FWD or device.type == "cuda")
        and backward_refusal(kernel, device) is None
    )


def check_correctness(cell: Cell, device: torch.device, caches: CellCaches | None = None) -> dict[str, Any]:
    """Compare the kernel with a float64 (CPU) / float32 (GPU) reference on the same inputs.

    At the cell's length when it is within check.max_seqlen, otherwise at that reduced length with
    the same mask pattern and parameters (cached per process: every longer cell of the same
    kernel/mask/shape shares the one check). `cached` in the result says which (its time is 0).
    """
    caches = caches if caches is not None else CellCaches()
    kernel = cell.adapter
    check_len = min(cell.seqlen, int(cell.check_dict["max_seqlen"]))
    grads = checks_gradients(kernel, cell, device)
    dtype = DTYPES[cell.dtype]
    ref_dtype = torch.float64 if device.type == "cpu" else torch.float32

    def problem():
        q, k, v, do = _make_inputs(cell, check_len, "bshd", device, ref_dtype, cell.seed + 1, True)
        return (q, k, v, do), _build(cell, check_len, 0, caches, inputs=(q.detach(), k.detach()))[0]

    built = None
    split = False
    if prepares_per_pass(kernel):
        # A kernel that builds another form for forward-only calls (Flex at block 64 on sm90) is
        # checked in the form its cell times: forward cells without gradients, the others with.
        built = problem()
        split = grad_changes_form(kernel, built[1], head_dim=cell.head_dim, dtype=dtype, device=device)
        grads = grads and (cell.pass_ != Pass.FWD or not split)
    key = (
        cell.kernel,
        cell.mask,
        cell.mask_params,
        cell.heads_q,
        cell.heads_kv,
        cell.head_dim,
        cell.dtype,
        cell.batch,
        check_len,
        cell.seed,
        str(device),
        # the check's own settings: the full-length agreement's keys do not change what it computes
        json.dumps({k: v for k, v in cell.check_dict.items() if not k.startswith("agree_")}, sort_keys=True),
        cell.pass_ != Pass.FWD if split else None,
    )
    if key in caches.checks and (caches.checks[key]["grads"] or not grads):
        return {**caches.checks[key], "cached": True}
    (q, k, v, do), mask = built or problem()
    rounded = cell.dtype in ROUNDED_REFERENCE_DTYPES
    if rounded:
        q, k, v = (x.detach().to(dtype).to(ref_dtype).requires_grad_(True) for x in (q, k, v))
    prepared, _ = prepare_for(cell, kernel, mask, dtype, device, cell.pass_ != Pass.FWD if split else None)
    kq, kk, kv, kdo = (from_bshd(x, prepared.layout).to(dtype).detach() for x in (q, k, v, do))
    for x in (kq, kk, kv):
        x.requires_grad_(grads)
    out = prepared.call(kq, kk, kv)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        family_ref = prepared.extra.get("reference")  # non-softmax families bring their own reference
        # Softmax references depend on the problem, not the kernel: one per (mask, shape, seed, device).
        ref_key = (
            None
            if family_ref
            else (
                cell.mask,
                cell.mask_params,
                cell.heads_q,
                cell.heads_kv,
                cell.head_dim,
                cell.batch,
                check_len,
                cell.seed,
                device.type,
                ref_dtype,
                cell.dtype if rounded else None,
            )
        )
        cached = caches.references.get(ref_key, grads, device) if ref_key else None
        if cached:
            ref = cached["out"]
        else:
            ref = family_ref(q, k, v) if family_ref else reference_attention(q, k, v, dense_mask_tensor(mask, device))
        result = {
            "check_seqlen": check_len,
            "rel_err_out": relative_error(to_bshd(out, prepared.layout, cell.batch), ref),
        }
        ref_grads = None
        if grads:
            try:
                out.backward(kdo)
            except Exception:  # noqa: BLE001 - a forward cell is judged on its output alone
                if cell.pass_ != Pass.FWD:
                    raise
                grads = False
            else:
                if cached:
                    ref_grads = {name: cached[name] for name in ("dq", "dk", "dv")}
                else:
                    ref.backward(do)
                    ref_grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad}
                for name, mine in (("dq", kq), ("dk", kk), ("dv", kv)):
                    result[f"rel_err_{name}"] = relative_error(
                        to_bshd(mine.grad, prepared.layout, cell.batch), ref_grads[name]
                    )
        if ref_key and not cached:
            caches.references.put(ref_key, {"out": ref, **(ref_grads or {})})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    result["grads"] = grads
    if len(caches.checks) > CHECKS_KEPT:
        caches.checks.clear()
    caches.checks[key] = result
    return {**result, "cached": False}


def _measure_sample(
    cell: Cell, device: torch.device, sample: int, check: dict[str, Any] | None, caches: CellCaches
) -> dict[str, Any]:
    kernel = cell.adapter
    dtype = DTYPES[cell.dtype]
    rep = cell.repeat_dict
    need_grad = cell.pass_ != Pass.FWD
    q, k, v, do = _make_inputs(cell, cell.seqlen, kernel.layout, device, dtype, cell.seed + 1000 + sample, need_grad)
    mask, build_s = _build(
        cell,
        cell.seqlen,
        sample,
        caches,
        inputs=(to_bshd(q, kernel.layout, cell.batch).detach(), to_bshd(k, kernel.layout, cell.batch).detach()),
        keep=True,
    )
    prepared, form = prepare_for(cell, kernel, mask, dtype, device, need_grad)

    def agree(own_results):  # the full-length agreement of this draw (longca.run.agreement)
        return compare(
            cell,
            mask,
            tuple(to_bshd(x, kernel.layout, cell.batch) for x in (q, k, v)),
            own_results,
            device,
            dout_bshd=to_bshd(do, kernel.layout, cell.batch) if need_grad else None,
            held=caches.agreements,
            draw=sample,
        )

    def incorrect(agreement):  # a wrong result is never a speed: the row keeps what disagreed, no timing
        reason = agreement.pop("incorrect")
        return {
            **mask_columns(mask, sample),
            "mask_form": form,
            **agreement,
            **check_columns(check or {}),
            "status": Status.INCORRECT.value,
            "reason": reason,
            "_kernel_s": 0.0,
        }

    def clear_grads():
        for x in (q, k, v):
            x.grad = None

    retained = cell.pass_ == Pass.BWD and rep.get("backward") == "retained_graph" and kernel.caps.retained_backward
    saved: dict[str, torch.Tensor] = {}  # a backward's forward output, kept for the retained timed calls
    # The full-length agreement runs before the timing, on the timed call itself at the cell's shape
    # (the forward, and the backward on the forward the retained timed calls then reuse), so that call
    # is the protocol's warm-up: at 512K one more warm-up backward would be a 40 s call. The
    # comparator's memory is freed before the peak-memory count starts.
    own: dict[str, float] = {}
    agreement: dict[str, Any] = {}
    if agreement_applies(cell):
        agreement = agree(
            lambda: _own_results(
                prepared, kernel.layout, cell, (q, k, v), do if need_grad else None, saved, retained, own
            )
        )
        if "incorrect" in agreement:
            return incorrect(agreement)
    timer = timer_for(device, bool(rep.get("l2_flush", True)))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    idle_s = cool_down(rep.get("cooldown_s"), device)  # before the clock read: it shows what the pause gave
    clock0 = gpu_clock_state() if device.type == "cuda" else {}
    warmed = bool(own)

    def timed(fn, before=None):  # the spec's repeat protocol around one call
        return time_under(timer, fn, dict(rep, warmup=0) if warmed else rep, before)

    # the SM clock and throttle reasons while the calls run (a read before can catch the idle clock)
    with ClockSampler(gpu_clock_state) if device.type == "cuda" else no_sampler() as window:
        if cell.pass_ == Pass.FWD:
            with torch.no_grad():
                timing = timed(lambda: prepared.call(q, k, v))
        elif retained:
            # Opt-in: one untimed forward, then every warm-up and timed backward on its retained graph
            # (FlashAttention's benchmark_backward does the same), so a backward cell no longer runs a
            # forward per iteration outside the timed region. The row's timer says so.
            clear_grads()
            if "out" not in saved:
                saved["out"] = prepared.call(q, k, v)
            timing = timed(lambda: saved["out"].backward(do, retain_graph=True), before=clear_grads)
            timing.timer += RETAINED_GRAPH
        elif cell.pass_ == Pass.BWD:
            # Backward alone (the default, and how the committed rows were timed): a fresh (untimed)
            # forward before each iteration, then the timed backward.

            def fresh_forward():
                clear_grads()
                saved["out"] = prepared.call(q, k, v)

            timing = timed(lambda: saved["out"].backward(do), before=fresh_forward)
        else:
            timing = timed(lambda: prepared.call(q, k, v).backward(do), before=clear_grads)
        if warmed:  # the agreement's call was the warm-up: its wall, and its first-call cost as compile time
            timing.warmup_iters, timing.warmup_wall_s = 1, own["wall_s"]
            timing.compile_s = max(own["timed_part_s"] - timing.median_ms / 1000.0, 0.0)
        # the eager calls' peak: a captured backward's second forward and graph pool are not the kernel's
        peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
        graph = graph_columns(
            cell, rep, timer, device, timing.median_ms, _graph_pass(cell, kernel, prepared.call, (q, k, v), do)
        )
    saved.clear()
    clock1 = gpu_clock_state() if device.type == "cuda" else {}
    area = mask.area_per_head * cell.batch
    row: dict[str, Any] = {
        **mask_columns(mask, sample),
        "mask_form": form,
        "mask_area": int(round(area)),
        **timing_columns(timing, softmax_flops(area, cell), cell.batch * cell.seqlen),
        "mask_build_s": build_s + prepared.build_s,
        "compile_s": max(prepared.compile_s, timing.compile_s),
        "cooldown_s": idle_s,
        "peak_mem_bytes": peak,
        "backend": prepared.info.get("backend"),
        "clock_start_mhz": clock0.get("clock_mhz"),
        "clock_end_mhz": clock1.get("clock_mhz"),
        "throttle_reasons": clock1.get("throttle"),
        **window.summary(),
        **graph,
        **agreement,
        "status": Status.OK.value,
        "reason": None,
    }
    if prepared.extra.get("flop_model"):  # families with their own FLOP model (linear attention)
        row["flop_model"] = prepared.extra["flop_model"]
        row["flops"] = float(prepared.extra["flops"][cell.pass_])
        row["tflops"] = row["flops"] / (timing.median_ms * 1e-3) / 1e12
    if check:
        row.update(check_columns(check))
    row["_kernel_s"] = timing.kernel_s
    return row


def _own_results(
    prepared: Any,
    layout: str,
    cell: Cell,
    inputs: tuple[torch.Tensor, ...],
    dout: torch.Tensor | None,
    saved: dict[str, torch.Tensor],
    retain: bool,
    walls: dict[str, float],
) -> dict[str, torch.Tensor]:
    """The cell's call run once at full length, as the timed calls will run it, and its results as
    (B, S, H, D) tensors for the agreement: the output and, with `dout`, the gradients. With `retain`
    the forward's output stays in `saved` for the retained timed backward. `walls` gets the call's
    wall (`wall_s`, synchronised) and that of the part the cell times (`timed_part_s`: the backward
    of a backward cell), whose excess over a timed call is the row's compile time."""
    sync = torch.cuda.synchronize if inputs[0].is_cuda else (lambda: None)
    for x in inputs:
        x.grad = None
    t0 = time.perf_counter()
    if dout is None:
        with torch.no_grad():
            out = prepared.call(*inputs)
        sync()
        part_from = t0
    else:
        out = prepared.call(*inputs)
        sync()
        part_from = t0 if cell.pass_ == Pass.FWD_BWD else time.perf_counter()
        out.backward(dout, retain_graph=retain)
        sync()
        if retain:
            saved["out"] = out
    end = time.perf_counter()
    walls.update(wall_s=end - t0, timed_part_s=end - part_from)
    results = {"out": to_bshd(out.detach(), layout, cell.batch)}
    if compares_gradients(cell):
        for name, x in zip(GRADIENTS, inputs):
            results[name] = to_bshd(x.grad, layout, cell.batch)
    return results


def run_cell(
    cell: Cell,
    caches: CellCaches | None = None,
    keep_draws: str | Path | None = None,
    on_draw: Callable[[int], None] | None = None,
    may_start: Callable[[int], str | None] | None = None,
    on_checked: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """All rows of one cell (one per mask sample), never raising for the cell's own failures.
    `caches`: what earlier cells of this process left for this one (none: a fresh start).
    `keep_draws`: the cell's file; each finished draw of a sampled mask is kept beside it
    (longca.store.draws) and a draw an earlier, stopped run kept is taken as it is, not measured
    again. Its row keeps its own run, time and clocks; `cell_wall_s` adds the wall that draw took.
    `on_draw(k)`: called when draw k is measured (the worker tells its supervisor, whose time limit
    then starts again: `timeout_s` bounds one draw of a sampled mask, not all of them).
    `may_start(k)`: asked before draw k is measured; a reason stops the cell there by raising
    LeftForLater, its finished draws kept (longca.run.time_left: the draw does not fit in the time
    the run has left). `on_checked()`: called when the check has passed, before the first draw (the
    worker times a first draw from there: a check that autotunes can take minutes, a draw seconds).

    Rows whose key `_fatal` is true ask the caller to restart the process (a CUDA error leaves the
    context unusable).
    """
    caches = caches if caches is not None else CellCaches()
    t_cell = time.perf_counter()
    try:
        reason = planned_unsupported(cell)
    except KeyError as exc:
        return [status_row(cell, "error", str(exc))]
    if reason:
        return [status_row(cell, "unsupported", reason)]
    device = torch.device(cell.device)
    reason = runtime_unsupported(cell, device)
    if reason:
        return [status_row(cell, "unsupported", reason)]
    reason = beyond_memory(cell, device)
    if reason:
        return [status_row(cell, Status.OOM, reason)]
    rows: list[dict[str, Any]] = []
    check = None
    t_check, check_s, failed, earlier_s = None, 0.0, None, 0.0
    try:
        if cell.check_dict.get("enabled", True):
            t_check = time.perf_counter()
            check = check_correctness(cell, device, caches)
            check_s = 0.0 if check["cached"] else time.perf_counter() - t_check
            t_check = None
            failed = check_verdict(cell, check)
        if not failed and on_checked is not None:
            on_checked()
        if failed:  # an incorrect cell keeps its wall and check time like any other
            rows = [status_row(cell, Status.INCORRECT, failed, **check_columns(check))]
        else:
            t_draw = t_cell
            for sample in range(cell.samples):
                kept = load_draw(keep_draws, sample) if keep_draws and cell.samples > 1 else None
                if kept is not None:
                    earlier_s += kept["cell_wall_s"] or 0.0
                    rows.append(kept)
                    if draws_settled(rows, cell.repeat_dict.get("draws_within")):
                        break
                    continue
                if may_start is not None and (why := may_start(sample)):
                    raise LeftForLater(why)
                row = base_row(cell)
                row.update(_measure_sample(cell, device, sample, check, caches))
                gate_peak(row, device)
                rows.append(row)
                if keep_draws and cell.samples > 1:  # the wall of this draw alone, to add up on resume
                    save_draw(keep_draws, sample, {**row, "cell_wall_s": time.perf_counter() - t_draw})
                if on_draw is not None:
                    on_draw(sample)
                t_draw = time.perf_counter()
                if draws_settled(rows, cell.repeat_dict.get("draws_within")):
                    break
    except BaseException as exc:  # noqa: BLE001 - every failure of the cell becomes its row
        if isinstance(exc, (KeyboardInterrupt, SystemExit, LeftForLater, RunStopped)):  # not the cell's: no row
            raise
        if t_check is not None:  # failed inside the check: its time so far
            check_s = time.perf_counter() - t_check
        status, reason = classify(exc)
        row = status_row(cell, status, reason)
        if status == "error":
            row["reason"] = reason + " | " + "".join(traceback.format_exception_only(type(exc), exc)).strip()[-300:]
        if device.type == "cuda" and ("CUDA error" in str(exc) or "illegal memory access" in str(exc)):
            row["_fatal"] = True
        rows = [row]
    finally:
        if device.type == "cuda" and rows and rows[0]["status"] != "ok":
            torch.cuda.empty_cache()  # after an OOM or error, give the next cell a clean pool
    wall = time.perf_counter() - t_cell + earlier_s
    for r in rows:
        r["cell_wall_s"] = wall
        r["check_s"] = check_s  # one check per cell: every row carries it, count it once per cell
    return rows


def draws_settled(rows: list[dict[str, Any]], within: float | None) -> bool:
    """Whether a sampled mask's draws so far settle its answer (`repeat.draws_within`): two or more
    draws, all ok, whose headline medians (the replayed one where there is one) spread by at most
    `within` of their median. The median of the draws lies between the smallest and the largest
    draw's, so another draw could move it by no more than that spread."""
    if not within or len(rows) < 2 or any(r.get("status") != Status.OK.value for r in rows):
        return False
    medians = [r.get("graph_median_ms") or r["median_ms"] for r in rows]
    mid = float(np.median(medians))
    return mid > 0 and (max(medians) - min(medians)) / mid <= within


@dataclass
class GraphPass:
    """What a CUDA graph captures of a cell's pass: `call` (after `prepare`, run on the capture
    stream before it and never captured), and `expected()`, what a replay must reproduce (the eager
    calls' results); `release()` drops what `prepare` kept."""

    call: Callable[[], Any]
    expected: Callable[[], list[torch.Tensor]]
    tolerance: float
    prepare: Callable[[], Any] | None = None
    release: Callable[[], None] = lambda: None
    no_grad: bool = False


def _graph_pass(cell: Cell, kernel, call, inputs: tuple, dout) -> GraphPass | str:
    """The cell's pass as a capturable call, or why it has none. The forward: the call itself. A
    backward alone: autograd's backward of one forward run before the capture on its stream, every
    replay on that retained graph (as the eager `retained_graph` backward); forward+backward: both.
    Gradients come from torch.autograd.grad, so the eager calls' `.grad` (the full-length
    agreement compares them) stay as the last eager backward left them.

    A pass with a backward differentiates with respect to leaves of its own, made on the capture
    stream before each attempt (`prepare`) and sharing the inputs' storage. The inputs' gradient
    accumulators were made on the default stream by the eager calls, whose retained graph keeps
    them alive; a captured backward that ends in them makes the capture wait on that stream, which
    may end it (PyTorch warns: "The AccumulateGrad node's stream does not match ..."): the first
    backward capture of a sweep's process failed in every capture mode right after that warning
    (an H200, 2026-12-06)."""
    out_tol, grad_tol = tolerance(cell)
    if cell.pass_ == Pass.FWD:
        return GraphPass(call=lambda: call(*inputs), expected=lambda: [call(*inputs)], tolerance=out_tol, no_grad=True)

    def grads():
        return [x.grad for x in inputs]

    kept: dict[str, Any] = {}

    def own_leaves():
        kept.clear()  # the last attempt's leaves and graph go before this attempt's are made
        kept["leaves"] = tuple(x.detach().requires_grad_(x.requires_grad) for x in inputs)

    if cell.pass_ == Pass.FWD_BWD:
        return GraphPass(
            call=lambda: torch.autograd.grad(call(*kept["leaves"]), kept["leaves"], dout),
            expected=grads,
            tolerance=grad_tol,
            prepare=own_leaves,
            release=kept.clear,
        )
    if not kernel.caps.retained_backward:
        return f"{cell.kernel}'s backward cannot run twice on one forward (Capabilities.retained_backward)"

    def forward():
        own_leaves()
        kept["out"] = call(*kept["leaves"])

    return GraphPass(
        call=lambda: torch.autograd.grad(kept["out"], kept["leaves"], dout, retain_graph=True),
        expected=grads,
        tolerance=grad_tol,
        prepare=forward,
        release=kept.clear,
    )


def graph_columns(
    cell: Cell, rep: dict, timer, device: torch.device, eager_ms: float | None, graph_pass: GraphPass | str
) -> dict:
    """With `repeat.graph`, the cell's pass captured in a CUDA graph and its replays timed under the
    same protocol (graph_* columns: kernel time without host launch time), or the reason there is
    none. Nothing without `repeat.graph` (rows keep their columns empty). With
    `repeat.graph_below_ms`, only calls whose eager median (`eager_ms`) is shorter are replayed: a
    launch costs microseconds, so a long call's replays would repeat its timing at its full cost.
    Before it is timed, one replay must reproduce the eager calls' results within the cell's
    tolerance, from outputs set to NaN: a graph that left work outside its capture is not timed."""
    if not rep.get("graph"):
        return {}
    limit = rep.get("graph_below_ms")
    if limit is not None and eager_ms is not None and eager_ms >= limit:
        return {
            "graph_reason": f"eager median {eager_ms:.3g} ms >= repeat.graph_below_ms {limit:g}: "
            "launch time is negligible"
        }
    if isinstance(graph_pass, str):
        return {"graph_reason": graph_pass}
    with torch.no_grad() if graph_pass.no_grad else torch.enable_grad():
        captured, reason = capture(graph_pass.call, device, graph_pass.prepare)
        try:
            if captured is None:
                return {"graph_reason": reason}
            try:
                reason = _replay_disagrees(captured.replayed(), graph_pass.expected(), graph_pass.tolerance)
            except torch.OutOfMemoryError:  # the forward's eager output beside the graph's: the eager row stands
                reason = "out of memory comparing a replay with the eager call: not timed"
            if reason:
                return {"graph_reason": reason}
            timing = time_under(timer, captured.replay, dict(rep, warmup=1, warmup_s=None))
        finally:
            if captured is not None:
                captured.release()
            graph_pass.release()
    ci = timing.ci
    return {"graph_median_ms": timing.median_ms, "graph_ci_low_ms": ci.low, "graph_ci_high_ms": ci.high}


def _replay_disagrees(replayed: list[torch.Tensor], expected: list, tol: float) -> str | None:
    """Why a replay's results are not the eager call's, or None."""
    pairs = [(r, e) for r, e in zip(replayed, expected) if e is not None]
    if len(replayed) != len(expected) or not pairs:
        return f"the captured call returned {len(replayed)} tensors where the eager call gives {len(expected)}"
    errors = [relative_error(r, e.detach()) for r, e in pairs]
    if max(errors) <= tol:
        return None
    return (
        f"a replay does not reproduce the eager call (relative error {max(errors):.3g} > {tol:g}; "
        "work outside the capture leaves NaN): not timed"
    )
