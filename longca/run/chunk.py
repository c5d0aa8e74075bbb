"""Run a chunk of cells (one Snakemake job) so that every cell ends as a row, whatever happens.

- Cells a kernel cannot run (known from capabilities) get their `unsupported` rows here, with no
  device touched.
- Device cells run in a worker process (longca.run.worker). The supervisor watches each cell's
  time limit: on expiry it kills the worker, writes a `timeout` row and starts a new worker for
  the remaining cells. A worker that dies mid-cell (segfault, abort, OOM-kill) costs only that
  cell, recorded as `error` with the signal and the end of its log.
- Context-parallel cells are launched as N processes (torchrun locally, srun inside a SLURM
  allocation) running longca.cp.bench; rank 0 reports each cell, and the supervisor writes the rows.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from longca.run.cell import planned_unsupported, status_row
from longca.spec.cells import Cell, expand
from longca.spec.load import load_spec
from longca.store.write import write_rows

GRACE_S = 30.0  # start-up and compilation allowance on top of a cell's own limit
_children: set[subprocess.Popen] = set()  # process groups to take down if we are stopped


def _on_term(signum, frame):  # noqa: ARG001
    """Stopped (SIGTERM, e.g. a scheduler's time limit): stop workers and CP groups too, never orphan them."""
    for proc in list(_children):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    raise SystemExit(128 + signum)


def _log(msg: str) -> None:
    print(f"[longca] {msg}", file=sys.stderr, flush=True)


def _tail(path: Path, n: int = 1500) -> str:
    try:
        data = path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in data.splitlines() if line.strip())[-n:]


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_device_cells(cells: list[Cell], outputs: list[str], workdir: Path) -> dict[str, float]:
    """Run cells in worker processes, restarting after timeouts and crashes. Returns sweep stats."""
    job_file = workdir / "job.json"
    job_file.write_text(json.dumps({"cells": [c.to_json() for c in cells], "outputs": outputs}))
    start = 0
    stats = {"kernel_s": 0.0, "restarts": 0}
    while start < len(cells):
        job = json.loads(job_file.read_text())
        job["start"] = start
        job_file.write_text(json.dumps(job))
        log_path = workdir / f"worker-{start}.log"
        read_fd, write_fd = os.pipe()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "longca.run.worker", str(job_file), str(write_fd)],
                                    pass_fds=(write_fd,), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            _children.add(proc)
        os.close(write_fd)
        reader = os.fdopen(read_fd, "r")
        current = None
        deadline = time.monotonic() + GRACE_S + cells[start].timeout_s
        buf = ""
        finished_through = start - 1
        while True:
            timeout = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([reader], [], [], min(timeout, 5.0))
            if not ready:
                if time.monotonic() >= deadline:
                    idx = current if current is not None else finished_through + 1
                    _kill(proc)
                    cell = cells[idx]
                    write_rows(outputs[idx], [status_row(cell, "timeout", f"exceeded the cell time limit of "
                                                                         f"{cell.timeout_s:g} s; worker killed")])
                    _log(f"{cell.id}: timeout after {cell.timeout_s:g} s")
                    finished_through = idx
                    stats["restarts"] += 1
                    break
                continue
            chunk = os.read(reader.fileno(), 65536).decode()
            if not chunk:  # worker exited
                code = proc.wait()
                if current is not None and finished_through < current:
                    cell = cells[current]
                    reason = f"worker crashed ({_describe_exit(code)}) while running the cell; log: {_tail(log_path)}"
                    write_rows(outputs[current], [status_row(cell, "error", reason[:2000])])
                    _log(f"{cell.id}: {reason[:300]}")
                    finished_through = current
                    stats["restarts"] += 1
                elif code not in (0, 3) and finished_through + 1 < len(cells):
                    # Died between cells (e.g. at start-up): blame the next cell rather than loop forever.
                    idx = finished_through + 1
                    write_rows(outputs[idx], [status_row(cells[idx], "error",
                                                         f"worker failed to start ({_describe_exit(code)}): {_tail(log_path)}"[:2000])])
                    finished_through = idx
                if code == 3:
                    stats["restarts"] += 1
                break
            buf += chunk
            while "\n" in buf:
                line, buf = buf.split("\n", 1)
                parts = line.split()
                if parts[0] == "START":
                    current = int(parts[1])
                    deadline = time.monotonic() + cells[current].timeout_s + (GRACE_S if current == start else 0)
                elif parts[0] == "DONE":
                    finished_through = int(parts[1])
                    stats["kernel_s_worker"] = float(parts[2])
                    current = None
                    if finished_through + 1 < len(cells):
                        deadline = time.monotonic() + cells[finished_through + 1].timeout_s + GRACE_S
        reader.close()
        stats["kernel_s"] += stats.pop("kernel_s_worker", 0.0)
        sys.stderr.write(log_path.read_text(errors="replace"))
        start = finished_through + 1
    return stats


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cp_launch_command(world: int, launcher: str) -> list[str]:
    if launcher == "auto":
        launcher = "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "torchrun"
    if launcher == "srun":
        return ["srun", "--overlap", f"--ntasks={world}", "--kill-on-bad-exit=1", sys.executable, "-m", "longca.cp.bench"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
            "-m", "longca.cp.bench"]


def run_cp_cells(cells: list[Cell], outputs: list[str], workdir: Path, launcher: str = "auto") -> None:
    """Launch one N-process group for the chunk's CP cells (all of one world size)."""
    world = cells[0].world_size
    cells_file = workdir / "cp_cells.json"
    out_dir = workdir / "cp_out"
    out_dir.mkdir()
    payload = []
    for c in cells:
        payload.append({
            "cell_id": c.digest, "mechanism": c.cp_mechanism, "mask": c.mask, "mask_params": dict(c.mask_params),
            "seqlen": c.seqlen, "batch": c.batch, "heads_q": c.heads_q, "heads_kv": c.heads_kv,
            "head_dim": c.head_dim, "dtype": c.dtype, "pass": c.pass_, "world_size": c.world_size,
            "degrees": dict(c.cp_degrees), "balance": c.cp_balance, "local_kernel": c.kernel, "seed": c.seed,
            "samples": c.samples, "device": c.device, "backend": c.cp_backend, "timeout_s": c.timeout_s,
            "check": c.check_dict, **dict(c.repeat),
        })
    cells_file.write_text(json.dumps(payload))
    env = dict(os.environ)
    env.setdefault("MASTER_ADDR", socket.gethostname() if os.environ.get("SLURM_JOB_ID") else "127.0.0.1")
    env.setdefault("MASTER_PORT", str(_free_port()))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    cmd = cp_launch_command(world, launcher) + ["--cells-json", str(cells_file), "--out-dir", str(out_dir)]
    limit = sum(c.timeout_s for c in cells) + GRACE_S * 2
    log_path = workdir / "cp.log"
    _log(f"launching {len(cells)} CP cell(s) on {world} processes: {' '.join(cmd[:6])} ...")
    done: set[str] = set()

    def collect() -> None:
        """Rows for every cell rank 0 has reported so far (a killed group keeps its finished cells)."""
        for cell, path in zip(cells, outputs):
            result_file = out_dir / f"{cell.digest}.json"
            if cell.digest in done or not result_file.exists():
                continue
            results = json.loads(result_file.read_text())
            rows = []
            for res in results if isinstance(results, list) else [results]:
                row = status_row(cell, res.get("status", "error"), res.get("reason"))
                row.update({k: v for k, v in res.items() if k not in ("cell_id",)})
                rows.append(row)
            write_rows(path, rows)
            done.add(cell.digest)

    deadline = time.monotonic() + limit
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        _children.add(proc)
        code, why = None, ""
        while True:
            try:
                code = proc.wait(timeout=2.0)
                why = _describe_exit(code)
                break
            except subprocess.TimeoutExpired:
                collect()
                if time.monotonic() > deadline:
                    _kill(proc)
                    code, why = None, f"the CP process group exceeded its time limit of {limit:g} s and was killed"
                    break
    collect()
    sys.stderr.write(log_path.read_text(errors="replace")[-20000:])
    for cell, path in zip(cells, outputs):
        if cell.digest in done:
            continue
        else:
            status = "timeout" if code is None else "error"
            write_rows(path, [status_row(cell, status, f"no result from the CP process group ({why}); log: "
                                                       f"{_tail(log_path)}"[:2000])])


def run_chunk(spec_path: str, outputs: list[str], results_dir: str = "results", launcher: str = "auto") -> int:
    signal.signal(signal.SIGTERM, _on_term)
    spec = load_spec(spec_path)
    by_path = {os.path.normpath(c.output(results_dir)): c for c in expand(spec)}
    wanted = []
    for out in outputs:
        key = os.path.normpath(out)
        if key not in by_path:
            raise ValueError(f"{out!r} is not a cell output of spec {spec.name!r} under {results_dir!r}")
        wanted.append((by_path[key], out))
    planned = [(c, o) for c, o in wanted if c.cp_mechanism is None and planned_unsupported(c)]
    for cell, out in planned:
        write_rows(out, [status_row(cell, "unsupported", planned_unsupported(cell))])
    device = [(c, o) for c, o in wanted if c.cp_mechanism is None and (c, o) not in planned]
    cp = [(c, o) for c, o in wanted if c.cp_mechanism is not None]
    t0 = time.perf_counter()
    stats = {"kernel_s": 0.0}
    with tempfile.TemporaryDirectory(prefix="longca-chunk-") as tmp:
        if device:
            stats = run_device_cells([c for c, _ in device], [o for _, o in device], Path(tmp))
        by_world: dict[int, list[tuple[Cell, str]]] = {}
        for c, o in cp:
            by_world.setdefault(c.world_size, []).append((c, o))
        for w, members in sorted(by_world.items()):
            sub = Path(tmp) / f"cp{w}"
            sub.mkdir()
            run_cp_cells([c for c, _ in members], [o for _, o in members], sub, launcher)
    wall = time.perf_counter() - t0
    if device:
        _log(f"chunk done: {len(wanted)} cells in {wall:.1f} s; summed timed kernel time {stats['kernel_s']:.1f} s "
             f"({100 * stats['kernel_s'] / max(wall, 1e-9):.1f}% of wall)")
    missing = [o for o in outputs if not Path(o).exists()]
    if missing:
        raise RuntimeError(f"cells without a result file after the chunk: {missing[:5]}")
    return 0
