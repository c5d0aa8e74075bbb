"""Run one single-device cell: build the mask, check correctness, time, and return result rows.

Every outcome is a row: ok, unsupported (with the reason), oom, error, incorrect. Timeouts and
crashes are recorded by the supervising process (longca.run.chunk), which owns the clock.
"""

from __future__ import annotations

import json
import time
import traceback
import uuid
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from longca.kernels import registry
from longca.kernels.base import (DTYPES, Unsupported, backward_refusal, choose_form, dtype_refusal, grad_changes_form,
                                 package_available, static_unsupported_reason)
from longca.masks.forms import forms_of
from longca.masks.mask import Mask
from longca.masks.registry import PATTERNS, build_mask, resolve_params
from longca.measure.cooldown import cool_down
from longca.measure.env import environment, gpu_clock_state
from longca.measure.flops import attention_flops
from longca.measure.peak import peak_tflops
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error
from longca.measure.reference_cache import ReferenceCache
from longca.measure.timer import RETAINED_GRAPH, time_under, timer_for
from longca.spec.cells import Cell

RUN_ID = uuid.uuid4().hex[:12]  # one per process: rows of one run share it
_check_cache: dict[tuple, dict[str, Any]] = {}
_reference_cache = ReferenceCache()  # shared by the kernels checked on one problem


class CellFailure(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def base_row(cell: Cell) -> dict[str, Any]:
    """Identity, shape, mask and environment columns of a cell (no measurement)."""
    pattern = PATTERNS.get(cell.mask)
    row = {
        "spec": cell.spec, "sweep": cell.sweep, "cell_id": cell.id, "cell_digest": cell.digest, "run_id": RUN_ID,
        "kernel": cell.kernel, "pass": cell.pass_, "batch": cell.batch, "seqlen_q": cell.seqlen,
        "seqlen_k": cell.seqlen, "heads_q": cell.heads_q, "heads_kv": cell.heads_kv, "head_dim": cell.head_dim,
        "head_dim_v": cell.head_dim, "dtype": cell.dtype, "mask": cell.mask,
        "mask_family": pattern.family if pattern else None, "mask_variant": cell.mask_variant,
        "mask_params": json.dumps(dict(cell.mask_params), sort_keys=True), "seed": cell.seed,
        "mask_samples": cell.samples, "world_size": cell.world_size, "cp_mechanism": cell.cp_mechanism,
        "cp_variant": cell.cp_variant, "cp_degrees": json.dumps(dict(cell.cp_degrees)) if cell.cp_degrees else None,
        "cp_balance": cell.cp_balance, "timestamp": datetime.now(timezone.utc),
    }
    try:
        kernel = registry.get(cell.kernel)
        row["layout"] = kernel.layout
        row["kernel_family"] = kernel.caps.family
    except KeyError:
        pass
    env = environment(cell.device if cell.device != "cuda" or torch.cuda.is_available() else "cpu")
    row.update(env)
    return row


def status_row(cell: Cell, status: str, reason: str, **extra: Any) -> dict[str, Any]:
    row = base_row(cell)
    row.update(status=status, reason=reason, **extra)
    return row


def planned_unsupported(cell: Cell) -> str | None:
    """Reason a cell cannot run, known from declared capabilities alone (no device touched)."""
    kernel = registry.get(cell.kernel)
    block = resolve_params(cell.mask, dict(cell.mask_params)).get("block") if cell.mask == "block_sparse" else None
    return static_unsupported_reason(
        kernel.caps, mask_name=cell.mask, mask_forms=forms_of(cell.mask), dtype=cell.dtype,
        head_dim=cell.head_dim, heads_q=cell.heads_q, heads_kv=cell.heads_kv, pass_=cell.pass_, device=cell.device,
        block_size=block)


def runtime_unsupported(cell: Cell, device: torch.device) -> str | None:
    kernel = registry.get(cell.kernel)
    caps = kernel.caps
    if not package_available(caps.package):
        return f"{caps.package} not installed"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "CUDA is not available on this machine"
        cc = torch.cuda.get_device_capability(device)
        if caps.min_compute_capability and cc < caps.min_compute_capability:
            return f"needs compute capability >= {caps.min_compute_capability}, device has {cc}"
        if caps.max_compute_capability and cc > caps.max_compute_capability:
            return f"needs compute capability <= {caps.max_compute_capability}, device has {cc}"
        refusal = dtype_refusal(cell.dtype, cc)
        if refusal:
            return refusal
    if cell.pass_ != "fwd":
        return backward_refusal(kernel, device)
    return None


def _make_inputs(cell: Cell, seqlen: int, layout: str, device: torch.device, dtype: torch.dtype, seed: int,
                 need_grad: bool) -> tuple[torch.Tensor, ...]:
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


def _to_bshd(x: torch.Tensor, layout: str, batch: int) -> torch.Tensor:
    if layout == "bhsd":
        return x.transpose(1, 2)
    if layout == "thd":
        return x.reshape(batch, -1, x.shape[-2], x.shape[-1])
    return x


# The last masks built in this process, for the next cell of the same problem (a sweep runs a
# problem's fwd and bwd cells one after the other): a 512K block-64 layout takes ~20 s to draw.
# Masks drawn from the cell's inputs (importance scores) are not kept.
_MASKS_KEPT = 2
_mask_cache: dict[tuple, Mask] = {}


def _build(cell: Cell, seqlen: int, sample: int, inputs=None, keep: bool = False) -> tuple[Mask, float]:
    """The cell's mask at `seqlen` and its build time. With `keep` (the timed samples; checks are at
    most check.max_seqlen long, where drawing is cheap) an earlier sample's identical mask is reused,
    with build time 0.0."""
    t0 = time.perf_counter()
    params = dict(cell.mask_params)
    pattern = PATTERNS[cell.mask]
    # Block-sparse layouts are per KV head; importance scores come from the cell's own inputs.
    wants_inputs = pattern.needs_inputs_for(params) if hasattr(pattern, "needs_inputs_for") else pattern.needs_inputs
    key = None if wants_inputs or not keep else (cell.mask, cell.mask_params, seqlen, cell.seed, sample, cell.heads_kv)
    try:
        hash(key)
    except TypeError:  # a parameter given as a list: not worth a canonical form here
        key = None
    if key is not None and key in _mask_cache:
        _mask_cache[key] = _mask_cache.pop(key)  # most recently used last
        return _mask_cache[key], 0.0
    mask = build_mask(cell.mask, seqlen, params, seed=cell.seed, sample=sample, heads_kv=cell.heads_kv,
                      inputs=inputs if wants_inputs else None)
    if key is not None:
        while len(_mask_cache) >= _MASKS_KEPT:
            _mask_cache.pop(next(iter(_mask_cache)))
        _mask_cache[key] = mask
    return mask, time.perf_counter() - t0


# dtypes whose rounding of the inputs alone is larger than a correct kernel's own error: e4m3 keeps 3
# mantissa bits, and rounding q, k, v moved Flex's fp8 output by 5-6% from the float32 reference on
# the unrounded draws, against 3.1-3.9% from the reference on the rounded ones (H200, call 59). Their
# reference takes the rounded inputs, so the check judges the kernel; bf16 and fp16 keep the float32
# draws (their rounding is ~0.3%), as since the first sweep.
ROUNDED_REFERENCE_DTYPES = frozenset({"float8_e4m3fn"})


def _tolerance(cell: Cell) -> tuple[float, float]:
    tol = cell.check_dict["tolerance"]
    out_tol = float(tol[cell.dtype])
    return out_tol, out_tol * float(tol.get("grad_factor", 3.0))


def checks_gradients(kernel: Any, cell: Cell, device: torch.device) -> bool:
    """Whether the check compares gradients too. On a GPU a forward cell's check does (one check with
    gradients serves the fwd, bwd and fwd_bwd cells of the same shape), but never in a dtype the
    kernel's backward does not take: Flex's fp8 backward fails to compile, and trying it cost every
    fp8 check an Inductor compile (call 60)."""
    caps = kernel.caps
    return (caps.backward and (caps.backward_dtypes is None or cell.dtype in caps.backward_dtypes)
            and (cell.pass_ != "fwd" or device.type == "cuda") and backward_refusal(kernel, device) is None)


def check_correctness(cell: Cell, device: torch.device) -> dict[str, Any]:
    """Compare the kernel with a float64 (CPU) / float32 (GPU) reference on the same inputs.

    At the cell's length when it is within check.max_seqlen, otherwise at that reduced length with
    the same mask pattern and parameters (cached per process: every longer cell of the same
    kernel/mask/shape shares the one check). `cached` in the result says which (its time is 0).
    """
    kernel = registry.get(cell.kernel)
    check_len = min(cell.seqlen, int(cell.check_dict["max_seqlen"]))
    grads = checks_gradients(kernel, cell, device)
    dtype = DTYPES[cell.dtype]
    ref_dtype = torch.float64 if device.type == "cpu" else torch.float32

    def problem():
        q, k, v, do = _make_inputs(cell, check_len, "bshd", device, ref_dtype, cell.seed + 1, True)
        return (q, k, v, do), _build(cell, check_len, 0, inputs=(q.detach(), k.detach()))[0]

    built = None
    split = False
    if hasattr(kernel, "grad_changes_form"):
        # A kernel that builds another form for forward-only calls (Flex at block 64 on sm90) is
        # checked in the form its cell times: forward cells without gradients, the others with.
        built = problem()
        split = grad_changes_form(kernel, built[1], head_dim=cell.head_dim, dtype=dtype, device=device)
        grads = grads and (cell.pass_ != "fwd" or not split)
    key = (cell.kernel, cell.mask, cell.mask_params, cell.heads_q, cell.heads_kv, cell.head_dim, cell.dtype,
           cell.batch, check_len, cell.seed, str(device), json.dumps(cell.check_dict, sort_keys=True),
           cell.pass_ != "fwd" if split else None)
    if key in _check_cache and (_check_cache[key]["grads"] or not grads):
        return {**_check_cache[key], "cached": True}
    (q, k, v, do), mask = built or problem()
    rounded = cell.dtype in ROUNDED_REFERENCE_DTYPES
    if rounded:
        q, k, v = (x.detach().to(dtype).to(ref_dtype).requires_grad_(True) for x in (q, k, v))
    form = choose_form(kernel.caps, forms_of(cell.mask))
    prepared = kernel.prepare(mask, batch=cell.batch, heads_q=cell.heads_q, heads_kv=cell.heads_kv,
                              head_dim=cell.head_dim, dtype=dtype, device=device, form=form,
                              **({"grad": cell.pass_ != "fwd"} if split else {}))
    kq, kk, kv, kdo = (_from_bshd(x, prepared.layout).to(dtype).detach() for x in (q, k, v, do))
    for x in (kq, kk, kv):
        x.requires_grad_(grads)
    out = prepared.call(kq, kk, kv)
    prev_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        family_ref = prepared.extra.get("reference")  # non-softmax families bring their own reference
        # Softmax references depend on the problem, not the kernel: one per (mask, shape, seed, device).
        ref_key = None if family_ref else (cell.mask, cell.mask_params, cell.heads_q, cell.heads_kv, cell.head_dim,
                                           cell.batch, check_len, cell.seed, device.type, ref_dtype,
                                           cell.dtype if rounded else None)
        cached = _reference_cache.get(ref_key, grads, device) if ref_key else None
        if cached:
            ref = cached["out"]
        else:
            ref = family_ref(q, k, v) if family_ref else reference_attention(q, k, v, dense_mask_tensor(mask, device))
        result = {"check_seqlen": check_len,
                  "rel_err_out": relative_error(_to_bshd(out, prepared.layout, cell.batch), ref)}
        ref_grads = None
        if grads:
            try:
                out.backward(kdo)
            except Exception:  # noqa: BLE001 - a forward cell is judged on its output alone
                if cell.pass_ != "fwd":
                    raise
                grads = False
            else:
                if cached:
                    ref_grads = {name: cached[name] for name in ("dq", "dk", "dv")}
                else:
                    ref.backward(do)
                    ref_grads = {"dq": q.grad, "dk": k.grad, "dv": v.grad}
                for name, mine in (("dq", kq), ("dk", kk), ("dv", kv)):
                    result[f"rel_err_{name}"] = relative_error(_to_bshd(mine.grad, prepared.layout, cell.batch),
                                                               ref_grads[name])
        if ref_key and not cached:
            _reference_cache.put(ref_key, {"out": ref, **(ref_grads or {})})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = prev_tf32
    result["grads"] = grads
    if len(_check_cache) > 4096:
        _check_cache.clear()
    _check_cache[key] = result
    return {**result, "cached": False}


def check_verdict(cell: Cell, check: dict[str, Any]) -> str | None:
    """Why the cell's numbers are wrong, or None: the output always, gradients for passes with a backward."""
    out_tol, grad_tol = _tolerance(cell)
    names = ("out",) if cell.pass_ == "fwd" else ("out", "dq", "dk", "dv")
    if cell.pass_ != "fwd" and "rel_err_dq" not in check:
        return "gradients were not checked"
    bad = [f"{n}={check[f'rel_err_{n}']:.3g}" for n in names
           if check[f"rel_err_{n}"] > (out_tol if n == "out" else grad_tol)]
    if not bad:
        return None
    return (f"relative error above tolerance ({out_tol:g} out, {grad_tol:g} grads) at S={check['check_seqlen']}: "
            + ", ".join(bad))


def _from_bshd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "bhsd":
        return x.transpose(1, 2).contiguous()
    if layout == "thd":
        return x.reshape(-1, x.shape[-2], x.shape[-1]).contiguous()
    return x.contiguous()


def _measure_sample(cell: Cell, device: torch.device, sample: int, check: dict[str, Any] | None) -> dict[str, Any]:
    kernel = registry.get(cell.kernel)
    dtype = DTYPES[cell.dtype]
    rep = cell.repeat_dict
    need_grad = cell.pass_ != "fwd"
    q, k, v, do = _make_inputs(cell, cell.seqlen, kernel.layout, device, dtype, cell.seed + 1000 + sample, need_grad)
    mask, build_s = _build(cell, cell.seqlen, sample,
                           inputs=(_to_bshd(q, kernel.layout, cell.batch).detach(),
                                   _to_bshd(k, kernel.layout, cell.batch).detach()), keep=True)
    form = choose_form(kernel.caps, forms_of(cell.mask))
    # Kernels with a forward-only form get told whether gradients follow (see grad_changes_form).
    prepared = kernel.prepare(mask, batch=cell.batch, heads_q=cell.heads_q, heads_kv=cell.heads_kv,
                              head_dim=cell.head_dim, dtype=dtype, device=device, form=form,
                              **({"grad": need_grad} if hasattr(kernel, "grad_changes_form") else {}))
    timer = timer_for(device, bool(rep.get("l2_flush", True)))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    idle_s = cool_down(rep.get("cooldown_s"), device)  # before the clock read: it shows what the pause gave
    clock0 = gpu_clock_state() if device.type == "cuda" else {}

    def clear_grads():
        for x in (q, k, v):
            x.grad = None

    def timed(fn, before=None):  # the spec's repeat protocol around one call
        return time_under(timer, fn, rep, before)

    if cell.pass_ == "fwd":
        with torch.no_grad():
            timing = timed(lambda: prepared.call(q, k, v))
    elif cell.pass_ == "bwd" and rep.get("backward") == "retained_graph" and kernel.caps.retained_backward:
        # Opt-in: one untimed forward, then every warm-up and timed backward on its retained graph
        # (FlashAttention's benchmark_backward does the same), so a backward cell no longer runs a
        # forward per iteration outside the timed region. The row's timer says so.
        clear_grads()
        out = prepared.call(q, k, v)
        timing = timed(lambda: out.backward(do, retain_graph=True), before=clear_grads)
        timing.timer += RETAINED_GRAPH
    elif cell.pass_ == "bwd":
        # Backward alone (the default, and how the committed rows were timed): a fresh (untimed)
        # forward before each iteration, then the timed backward.
        saved: dict[str, torch.Tensor] = {}

        def fresh_forward():
            clear_grads()
            saved["out"] = prepared.call(q, k, v)

        timing = timed(lambda: saved["out"].backward(do), before=fresh_forward)
    else:
        timing = timed(lambda: prepared.call(q, k, v).backward(do), before=clear_grads)
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    clock1 = gpu_clock_state() if device.type == "cuda" else {}
    area = mask.area_per_head * cell.batch
    flops = attention_flops(area, cell.heads_q, cell.head_dim, cell.pass_)
    tflops = flops / (timing.median_ms * 1e-3) / 1e12
    row: dict[str, Any] = {
        "mask_form": form, "mask_sample": sample, "mask_area": int(round(area)),
        "density": mask.density, "num_documents": len(mask.documents) if mask.documents else None,
        "distribution": mask.params.get("distribution"), "mask_params": json.dumps(mask.params, sort_keys=True, default=str),
        "timer": timing.timer, "warmup_iters": timing.warmup_iters, "timed_iters": timing.timed_iters,
        "l2_flush": timing.l2_flush, "samples_ms": timing.samples_ms, "median_ms": timing.median_ms,
        "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms, "mask_build_s": build_s + prepared.build_s,
        "compile_s": max(prepared.compile_s, timing.compile_s), "warmup_s": timing.warmup_wall_s, "cooldown_s": idle_s,
        "timer_wall_s": timing.wall_s, "flops": flops, "flop_model": "softmax_exact_area", "tflops": tflops,
        "tokens_per_s": cell.batch * cell.seqlen / (timing.median_ms * 1e-3), "peak_mem_bytes": peak,
        "backend": prepared.info.get("backend"), "clock_start_mhz": clock0.get("clock_mhz"),
        "clock_end_mhz": clock1.get("clock_mhz"), "throttle_reasons": clock1.get("throttle"),
        "status": "ok", "reason": None,
    }
    if getattr(mask, "blocks", None) is not None:  # block-sparse masks
        row["block_size"] = mask.params.get("block")
        row["score_source"] = mask.params.get("score")
        row["variable_blocks"] = mask.name == "variable_block_sparse"
    if prepared.extra.get("flop_model"):  # families with their own FLOP model (linear attention)
        row["flop_model"] = prepared.extra["flop_model"]
        row["flops"] = float(prepared.extra["flops"][cell.pass_])
        row["tflops"] = row["flops"] / (timing.median_ms * 1e-3) / 1e12
    if check:
        row.update({k: v for k, v in check.items() if k.startswith("rel_err") or k == "check_seqlen"})
    peak_gate, source = peak_tflops(device, base_env_name(device), cell.dtype)
    if row["tflops"] > peak_gate:
        row["status"] = "error"
        row["reason"] = (f"throughput {row['tflops']:.1f} TFLOP/s above the device peak {peak_gate:.1f} ({source}): "
                         "a measurement or FLOP-count bug, not a result")
    row["_kernel_s"] = timing.kernel_s
    return row


def base_env_name(device: torch.device) -> str:
    return environment(device.type)["device_name"]


def _classify(exc: BaseException) -> tuple[str, str]:
    text = f"{type(exc).__name__}: {exc}".strip()
    first = text.splitlines()[0][:500] if text else type(exc).__name__
    if isinstance(exc, Unsupported):
        return "unsupported", str(exc)[:500]
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in text.lower():
        return "oom", first
    if "No available kernel" in text:
        return "unsupported", first
    return "error", first


def run_cell(cell: Cell) -> list[dict[str, Any]]:
    """All rows of one cell (one per mask sample), never raising for the cell's own failures.

    Rows whose key `_fatal` is true ask the caller to restart the process (a CUDA error leaves the
    context unusable).
    """
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
    rows: list[dict[str, Any]] = []
    check = None
    t_check, check_s, failed = None, 0.0, None
    try:
        if cell.check_dict.get("enabled", True):
            t_check = time.perf_counter()
            check = check_correctness(cell, device)
            check_s = 0.0 if check["cached"] else time.perf_counter() - t_check
            t_check = None
            failed = check_verdict(cell, check)
        if failed:  # an incorrect cell keeps its wall and check time like any other
            r = status_row(cell, "incorrect", failed)
            r.update({k: v for k, v in check.items() if k.startswith("rel_err") or k == "check_seqlen"})
            rows = [r]
        else:
            for sample in range(cell.samples):
                row = base_row(cell)
                row.update(_measure_sample(cell, device, sample, check))
                rows.append(row)
    except BaseException as exc:  # noqa: BLE001 - every failure of the cell becomes its row
        if isinstance(exc, KeyboardInterrupt):
            raise
        if t_check is not None:  # failed inside the check: its time so far
            check_s = time.perf_counter() - t_check
        status, reason = _classify(exc)
        row = status_row(cell, status, reason)
        if status == "error":
            row["reason"] = reason + " | " + "".join(traceback.format_exception_only(type(exc), exc)).strip()[-300:]
        if device.type == "cuda" and ("CUDA error" in str(exc) or "illegal memory access" in str(exc)):
            row["_fatal"] = True
        rows = [row]
    finally:
        if device.type == "cuda" and rows and rows[0]["status"] != "ok":
            torch.cuda.empty_cache()  # after an OOM or error, give the next cell a clean pool
    wall = time.perf_counter() - t_cell
    for r in rows:
        r["cell_wall_s"] = wall
        r["check_s"] = check_s  # one check per cell: every row carries it, count it once per cell
    return rows


def summarize(rows: list[dict[str, Any]]) -> str:
    r = rows[0]
    if r["status"] == "ok":
        med = float(np.median([x["median_ms"] for x in rows]))
        tf = float(np.median([x["tflops"] for x in rows]))
        return f"ok {med:.3f} ms {tf:.1f} TFLOP/s"
    return f"{r['status']}: {r['reason']}"
