"""Run a chunk of cells (one Snakemake job) so that every cell ends as a row, whatever happens.

- Cells a kernel cannot run (known from capabilities) get their `unsupported` rows here, with no
  device touched.
- Device cells run in a worker process (longca.run.worker), its log streamed to our stderr as it
  runs (a chunk stopped from outside still shows what it did). The supervisor watches each cell's
  time limit: on expiry it kills the worker, writes a `timeout` row and starts a new worker for
  the remaining cells. A worker that dies mid-cell (segfault, abort, OOM-kill) costs only that
  cell, recorded as `error` with the signal and the end of its log.
- Context-parallel cells are launched as N processes (torchrun locally, srun inside a SLURM
  allocation) running longca.run.ranks; rank 0 writes each cell's rows and reports it done, and the
  supervisor streams the group's log to its stderr and watches each cell's time limit the same way:
  a hung or crashed group costs its running cell, and a new group continues with the rest.
"""

from __future__ import annotations

import codecs
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from longca.run.gpu_lease import gpu_count, gpu_names, held_lock_fds, lease_gpus
from longca.run.lifeline import SUPERVISOR_ENV, die_with_parent
from longca.run.rows import cell_line, clip_line, place, status_row, summarize
from longca.run.serving import planned_unsupported
from longca.run.time_left import TimeLeft
from longca.spec.cells import Cell, expand
from longca.spec.model import Spec, SpecError
from longca.store.write import write_rows

GRACE_S = 30.0  # start-up and compilation allowance on top of a cell's own limit
# A CP launcher's time to stop its ranks on SIGTERM (srun forwards it) before SIGKILL; with the stack
# dump, _on_term stays well inside the 10 s tools/gpu-host.sh gives between its TERM and KILL.
CP_TERM_WAIT_S = 5.0
# Children to take down if we are stopped -> seconds they get after SIGTERM before SIGKILL.
_children: dict[subprocess.Popen, float] = {}
# Logs of running CP groups -> [bytes already copied to our stderr, decoder]: streamed as they grow,
# so a chunk stopped from outside still shows what its group was doing.
_streams: dict[Path, list] = {}


def _on_term(signum, frame):  # noqa: ARG001
    """Stopped (SIGTERM, e.g. a scheduler's time limit): stop workers and CP groups too, never orphan them."""
    for proc, term_wait_s in list(_children.items()):
        if term_wait_s and proc.poll() is None:  # a CP group: show where it was
            _dump_stacks(proc, 1.0)
        _stop(proc, term_wait_s)
    for path in list(_streams):
        _pump(path)
    raise SystemExit(128 + signum)


def _log(msg: str) -> None:
    print(f"[longca] {msg}", file=sys.stderr, flush=True)


def _line(cell: Cell, outcome: str, progress: tuple[int, int], index: int) -> None:
    """The terminal's line for the cell at `index` of a group whose chunk `progress` describes."""
    print(cell_line(cell, outcome, place(progress[0], index, progress[1])), file=sys.stderr)


def _stream(path: Path) -> None:
    """Start copying a child's log to our stderr as it grows (see _pump)."""
    _streams[path] = [0, codecs.getincrementaldecoder("utf-8")(errors="replace")]


def _end_stream(path: Path) -> None:
    """Copy the rest of a child's log and stop streaming it."""
    _pump(path)
    sys.stderr.write(_streams.pop(path)[1].decode(b"", final=True))
    sys.stderr.flush()


def _pump(path: Path) -> None:
    """Copy what a streamed log gained since the last call to our stderr."""
    state = _streams.get(path)
    if state is None:
        return
    try:
        with open(path, "rb") as f:
            f.seek(state[0])
            data = f.read()
    except OSError:
        return
    if data:
        state[0] += len(data)
        sys.stderr.write(state[1].decode(data))
        sys.stderr.flush()


def _tail(path: Path, n: int = 1500) -> str:
    try:
        data = path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""
    return " | ".join(line for line in data.splitlines() if line.strip())[-n:]


def _descendants(pid: int) -> dict[int, int]:
    """Process group of every live descendant of pid, by pid (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return {}
    for name in entries:
        try:
            fields = Path("/proc", name, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        groups[int(name)] = int(fields[2])
    out: dict[int, int] = {}
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in out:
                out[child] = groups[child]
                stack.append(child)
    return out


def _stop(proc: subprocess.Popen, term_wait_s: float = 0.0) -> None:
    """SIGKILL a child's process group and all its descendants, after term_wait_s of SIGTERM when given.

    Descendants are found by walking /proc, not by group: torchrun starts every rank in a session of
    its own, so killing torchrun's group alone orphans the ranks (still holding their GPUs). Never
    waits through Popen (its lock is not reentrant), so the SIGTERM handler may call it."""
    if proc.poll() is not None:  # already reaped: its pid may name another process by now
        return
    tree = _descendants(proc.pid)
    if term_wait_s > 0:
        _send(os.killpg, proc.pid, signal.SIGTERM)
        end = time.monotonic() + term_wait_s
        while proc.poll() is None and time.monotonic() < end:
            time.sleep(0.1)
        tree.update(_descendants(proc.pid))
    for group in {proc.pid, *tree.values()} - {os.getpgrp()}:
        _send(os.killpg, group, signal.SIGKILL)
    for pid in tree:
        _send(os.kill, pid, signal.SIGKILL)


def _send(kill: Callable[[int, int], None], target: int, sig: int) -> None:
    """os.kill / os.killpg that ignores a target already gone (or no longer ours)."""
    try:
        kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _dump_stacks(proc: subprocess.Popen, wait_s: float = 2.0) -> None:
    """Ask a CP group's ranks for their Python stacks (longca.run.ranks registers faulthandler on
    SIGUSR1), so the log shows where a hung group is stuck. srun forwards the signal to its tasks;
    under torchrun the ranks are signalled directly (torchrun itself would die of it)."""
    targets = [proc.pid] if Path(proc.args[0]).name == "srun" else []
    for pid in _descendants(proc.pid):
        try:
            if b"longca.run.ranks" in Path(f"/proc/{pid}/cmdline").read_bytes():
                targets.append(pid)
        except OSError:
            pass
    for pid in targets:
        _send(os.kill, pid, signal.SIGUSR1)
    if targets:
        time.sleep(wait_s)


def _kill(proc: subprocess.Popen, term_wait_s: float = 0.0) -> None:
    _stop(proc, term_wait_s)
    proc.wait()
    _children.pop(proc, None)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def run_device_cells(
    cells: list[Cell],
    outputs: list[str],
    workdir: Path,
    time_left: TimeLeft | None = None,
    progress: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    """Run cells in worker processes, restarting after timeouts and crashes. Returns sweep stats,
    and in "skipped" the outputs of cells left for a later run (`time_left`: they did not fit).
    `progress`: (cells of the chunk before these, cells of the chunk), for the terminal's lines."""
    job_file = workdir / "job.json"
    job = {"cells": [c.to_json() for c in cells], "outputs": outputs, "progress": list(progress)}
    if time_left is not None:
        job["time_left"] = time_left.to_json()
    job_file.write_text(json.dumps(job))
    start = 0
    stats: dict[str, Any] = {"kernel_s": 0.0, "restarts": 0, "skipped": []}
    while start < len(cells):
        job = json.loads(job_file.read_text())
        job["start"] = start
        job_file.write_text(json.dumps(job))
        log_path = workdir / f"worker-{start}.log"
        read_fd, write_fd = os.pipe()
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "longca.run.worker", str(job_file), str(write_fd), str(os.getpid())],
                pass_fds=(write_fd, *held_lock_fds()),  # the GPU stays leased while the worker lives
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            _children[proc] = 0.0
        _stream(log_path)
        os.close(write_fd)
        reader = os.fdopen(read_fd, "r")
        current = None
        deadline = time.monotonic() + GRACE_S + cells[start].timeout_s
        buf = ""
        finished_through = start - 1
        while True:
            timeout = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([reader], [], [], min(timeout, 5.0))
            _pump(log_path)
            if not ready:
                if time.monotonic() >= deadline:
                    idx = current if current is not None else finished_through + 1
                    _kill(proc)
                    cell = cells[idx]
                    write_rows(
                        outputs[idx],
                        [
                            status_row(
                                cell,
                                "timeout",
                                f"exceeded the cell time limit of {cell.timeout_s:g} s"
                                + (" (a draw of its mask)" if cell.samples > 1 else "")
                                + "; worker killed",
                            )
                        ],
                    )
                    _line(cell, f"timeout after {cell.timeout_s:g} s", progress, idx)
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
                    _line(cell, f"error: {reason}", progress, current)
                    finished_through = current
                    stats["restarts"] += 1
                elif code not in (0, 3) and finished_through + 1 < len(cells):
                    # Died between cells (e.g. at start-up): blame the next cell rather than loop forever.
                    idx = finished_through + 1
                    write_rows(
                        outputs[idx],
                        [
                            status_row(
                                cells[idx],
                                "error",
                                f"worker failed to start ({_describe_exit(code)}): {_tail(log_path)}"[:2000],
                            )
                        ],
                    )
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
                elif parts[0] == "DRAW" and current is not None:
                    # a finished draw is progress: the limit bounds one draw of a sampled mask
                    deadline = max(deadline, time.monotonic() + cells[current].timeout_s)
                elif parts[0] in ("DONE", "SKIP"):
                    finished_through = int(parts[1])
                    if parts[0] == "DONE":
                        stats["kernel_s_worker"] = float(parts[2])
                    else:
                        stats["skipped"].append(outputs[finished_through])
                    current = None
                    if finished_through + 1 < len(cells):
                        deadline = time.monotonic() + cells[finished_through + 1].timeout_s + GRACE_S
        reader.close()
        _children.pop(proc, None)
        stats["kernel_s"] += stats.pop("kernel_s_worker", 0.0)
        _end_stream(log_path)
        start = finished_through + 1
    return stats


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it): a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cp_launch_command(world: int, launcher: str) -> list[str]:
    if launcher == "auto":
        launcher = "srun" if os.environ.get("SLURM_JOB_ID") and shutil.which("srun") else "torchrun"
    if launcher == "srun":
        return [
            "srun",
            "--overlap",
            f"--ntasks={world}",
            "--kill-on-bad-exit=1",
            sys.executable,
            "-m",
            "longca.run.ranks",
        ]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world}",
        "-m",
        "longca.run.ranks",
    ]


def run_cp_cells(
    cells: list[Cell], outputs: list[str], workdir: Path, launcher: str = "auto", progress: tuple[int, int] = (0, 0)
) -> None:
    """Run the chunk's CP cells (all of one world size) in N-process groups, one cell limit at a time.

    Rank 0 runs cells in job order, so the first cell not reported done is the running one.
    When it outlives its limit (plus GRACE_S for a group's first cell, which covers start-up) the
    group is killed, the cell gets a `timeout` row and a new group starts at the next cell; a group
    that exits early costs its running cell an `error` row the same way. Every launch consumes at
    least one cell, so the loop ends."""
    world = cells[0].world_size
    done_dir = workdir / "cp_done"
    done_dir.mkdir()
    done: set[str] = set()

    def collect() -> None:
        """Note every cell rank 0 has written so far (a killed group keeps its finished cells)."""
        done.update(c.digest for c in cells if (done_dir / f"{c.digest}.done").exists())

    def first_open(lo: int) -> int:
        return next((i for i in range(lo, len(cells)) if cells[i].digest not in done), len(cells))

    start = 0
    while start < len(cells):
        job_file = workdir / f"cp_job-{start}.json"
        job = {"cells": [c.to_json() for c in cells[start:]], "outputs": outputs[start:]}
        job["progress"] = [progress[0] + start, progress[1]]  # rank 0's line for each cell says where it stands
        job_file.write_text(json.dumps(job))
        env = dict(os.environ)
        env.setdefault("MASTER_ADDR", socket.gethostname() if os.environ.get("SLURM_JOB_ID") else "127.0.0.1")
        if "MASTER_PORT" not in os.environ:  # a fresh port per launch: a killed group's may still be held
            env["MASTER_PORT"] = str(free_port())
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        env[SUPERVISOR_ENV] = str(os.getpid())  # ranks check it is alive (longca.run.lifeline)
        cmd = cp_launch_command(world, launcher) + [str(job_file), str(done_dir)]
        log_path = workdir / f"cp-{start}.log"
        _log(f"launching {len(cells) - start} CP cell(s) on {world} processes: {' '.join(cmd[:6])} ...")
        with open(log_path, "wb") as log:
            # the launcher dies with this supervisor, and each rank with its launcher (longca.run.ranks)
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                pass_fds=held_lock_fds(),  # the GPUs stay leased while the launcher lives
            )
            _children[proc] = CP_TERM_WAIT_S
        _stream(log_path)
        current = start
        deadline = time.monotonic() + GRACE_S + cells[start].timeout_s
        code = None
        hung_log = ""
        try:
            while True:
                try:
                    code = proc.wait(timeout=max(0.0, min(2.0, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    pass
                _pump(log_path)
                collect()
                now_open = first_open(current)
                if now_open != current:  # a new result: the clock starts for the next cell (or shut-down)
                    current = now_open
                    deadline = time.monotonic() + (cells[current].timeout_s if current < len(cells) else GRACE_S)
                elif time.monotonic() >= deadline:
                    _dump_stacks(proc)
                    hung_log = _tail(log_path)  # before the launcher's shutdown messages
                    _kill(proc, CP_TERM_WAIT_S)
                    break
        finally:
            _children.pop(proc, None)
        _end_stream(log_path)
        collect()
        idx = first_open(start)
        if idx >= len(cells):
            break
        cell = cells[idx]
        if code is None and idx == current:
            reason = (
                f"exceeded the cell time limit of {cell.timeout_s:g} s"
                + (f" (+{GRACE_S:g} s start-up)" if idx == start else "")
                + f"; CP process group killed; log: {hung_log}"
            )
            write_rows(outputs[idx], [status_row(cell, "timeout", reason[:2000])])
            _line(cell, f"timeout after {cell.timeout_s:g} s", progress, idx)
            done.add(cell.digest)
        elif code is not None:
            reason = f"no result from the CP process group ({_describe_exit(code)}); log: {_tail(log_path)}"
            write_rows(outputs[idx], [status_row(cell, "error", reason[:2000])])
            _line(cell, f"error: {reason}", progress, idx)
            done.add(cell.digest)
        # else: killed as its cell was reported: progress was made, the next group starts at the open cell
        start = first_open(idx)


def check_gpu_model(spec: Spec, names: list[str] | None = None) -> None:
    """Stop a run whose GPUs (`names`, by default this process's) are not the model the spec's rows
    are for (`gpu_model`, which the spec allows only with device: cuda), before any cell file is
    written: rows of another model, or `unsupported` rows of a machine without one, would join the
    spec's set as if measured there, and a cell with a file is never run again."""
    if spec.gpu_model is None:
        return
    want = spec.gpu_model
    names = gpu_names() if names is None else names
    if not names:
        raise SpecError(
            "gpu_model", f"{want!r}: this machine has no CUDA GPU; run this spec on a machine with {want} GPUs"
        )
    other = sorted({n for n in names if want.lower() not in n.lower()})
    if other:
        raise SpecError(
            "gpu_model",
            f"{want!r} is not in this machine's GPU name(s) {other}: this spec's rows are for {want} "
            f"(a set holds one GPU model); run it on a machine with {want} GPUs, or copy the spec under "
            "another name and gpu_model",
        )


def run_chunk(
    spec: Spec,
    outputs: list[str],
    results_dir: str = "results",
    launcher: str = "auto",
    cells: list[Cell] | None = None,
    time_left: TimeLeft | None = None,
) -> int:
    """Produce the cell files `outputs` of `spec` (its `cells`, when the caller expanded them already);
    with `time_left`, single-device cells that do not fit in it are left for a later run."""
    signal.signal(signal.SIGTERM, _on_term)
    check_gpu_model(spec)
    # a folder that cannot take the cell files (read-only, full, a file in the way) fails here, as one
    # OSError naming it, before any worker starts
    folder = Path(results_dir) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
        pass
    by_path = {os.path.normpath(c.output(results_dir)): c for c in (cells if cells is not None else expand(spec))}
    wanted = []
    for out in outputs:
        key = os.path.normpath(out)
        if key not in by_path:
            raise ValueError(f"{out!r} is not a cell output of spec {spec.name!r} under {results_dir!r}")
        wanted.append((by_path[key], out))
    planned = [(c, o, why) for c, o in wanted if (why := planned_unsupported(c))]
    total = len(wanted)
    for cell, out, why in planned:
        write_rows(out, [status_row(cell, "unsupported", why)])
    # known from the capabilities before anything runs: a line per kernel, mask and reason, not per cell
    groups: dict[tuple[str, str, str], int] = {}
    for cell, _, why in planned:
        key = (cell.kernel, cell.mask, why)
        groups[key] = groups.get(key, 0) + 1
    for (kernel, mask, why), n in groups.items():
        line = f"[longca] {n} cell(s) of {kernel} {mask} unsupported (by its capabilities): {' '.join(why.split())}"
        print(clip_line(line), file=sys.stderr, flush=True)
    runnable = [(c, o) for c, o in wanted if c.digest not in {p[0].digest for p in planned}]
    device = [(c, o) for c, o in runnable if c.cp_mechanism is None]
    cp = [(c, o) for c, o in runnable if c.cp_mechanism is not None]
    gpus = gpu_count() if spec.device == "cuda" and cp else 0
    too_wide = [(c, o) for c, o in cp if gpus and c.world_size > gpus]
    for k, (cell, out) in enumerate(too_wide, start=len(planned)):
        rows = [status_row(cell, "unsupported", f"needs {cell.world_size} GPUs (world_size); {gpus} visible")]
        write_rows(out, rows)
        print(cell_line(cell, summarize(rows), place(0, k, total)), file=sys.stderr, flush=True)
    cp = [pair for pair in cp if pair not in too_wide]
    # Never two chunks on one GPU (Snakemake's local executor starts many at once): see gpu_lease.
    needed = max([1 if device else 0] + [c.world_size for c, _ in cp]) if spec.device == "cuda" else 0
    with lease_gpus(needed, log=_log):
        return _run_cells(outputs, wanted, device, cp, results_dir, launcher, time_left)


def _run_cells(
    outputs: list[str],
    wanted: list[tuple[Cell, str]],
    device: list[tuple[Cell, str]],
    cp: list[tuple[Cell, str]],
    results_dir: str,
    launcher: str,
    time_left: TimeLeft | None = None,
) -> int:
    t0 = time.perf_counter()
    stats: dict[str, Any] = {"kernel_s": 0.0, "skipped": []}
    with tempfile.TemporaryDirectory(prefix="longca-chunk-") as tmp:
        # the terminal numbers a chunk's cells in the order they end: the planned ones came first
        offset = len(wanted) - len(device) - len(cp)
        if device:
            stats = run_device_cells(
                [c for c, _ in device], [o for _, o in device], Path(tmp), time_left, (offset, len(wanted))
            )
        offset += len(device)
        by_world: dict[int, list[tuple[Cell, str]]] = {}
        for c, o in cp:
            by_world.setdefault(c.world_size, []).append((c, o))
        for w, members in sorted(by_world.items()):
            sub = Path(tmp) / f"cp{w}"
            sub.mkdir()
            run_cp_cells([c for c, _ in members], [o for _, o in members], sub, launcher, (offset, len(wanted)))
            offset += len(members)
    wall = time.perf_counter() - t0
    skipped = set(stats["skipped"])
    if device:
        later = f", {len(skipped)} left for a later run (time left)" if skipped else ""
        _log(
            f"chunk done: {len(wanted) - len(skipped)} cells in {wall:.1f} s{later}; summed timed kernel time "
            f"{stats['kernel_s']:.1f} s ({100 * stats['kernel_s'] / max(wall, 1e-9):.1f}% of wall)"
        )
    missing = [o for o in outputs if not Path(o).exists() and o not in skipped]
    if missing:
        raise RuntimeError(f"cells without a result file after the chunk: {missing[:5]}")
    return 0
