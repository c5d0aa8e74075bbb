"""Exclusive GPUs for a chunk, so that two chunks never time their cells on one GPU.

Snakemake's local executor (`snakemake --cores 8` on a GPU host, or inside a SLURM allocation)
starts as many chunk jobs as it has cores, and each would otherwise run on the first visible GPU
beside the others. So a chunk that needs GPUs takes them among the visible ones
(CUDA_VISIBLE_DEVICES, or all) by an exclusive `flock` on one file per GPU, all it needs or none,
waits while too few are free, and narrows CUDA_VISIBLE_DEVICES to its own for its workers and CP
ranks. The kernel drops the locks when the process ends, however it ends, so a killed run leaves
nothing to clean up; its workers and CP launchers hold them too (inherited descriptors), so a lock is
free only once no process of the run is left.

Lock files name a GPU as CUDA_VISIBLE_DEVICES does (an index or a UUID), in a folder per host or,
inside a SLURM job, per job: SLURM may number each job's GPUs from 0, so jobs sharing a node keep
apart namespaces, while the chunks of one allocation share one.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_DIR_ENV = "LONGCA_GPU_LOCK_DIR"
# The lock descriptors this process holds: its workers and CP launchers inherit them (`pass_fds`), so
# a flock is dropped only when the last process of the run that could touch the GPU has ended, not
# when the supervisor alone dies while a worker is still tearing down on the device.
_held: list[int] = []


def held_lock_fds() -> tuple[int, ...]:
    """The descriptors of the GPU locks this process holds (for its children to inherit)."""
    return tuple(_held)


def default_lock_dir() -> Path:
    """One folder per host, shared by every user's runs (GPUs are shared by them too); inside a
    SLURM job, a subfolder per job."""
    base = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "longca-gpu-locks")
    job = os.environ.get("SLURM_JOB_ID")
    return base / f"slurm-{job}" if job else base


def gpu_count() -> int:
    """GPUs this process can use (CUDA_VISIBLE_DEVICES applied); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_names() -> list[str]:
    """The usable GPUs' names as the driver gives them ("NVIDIA H200"), in order; [] without CUDA."""
    import torch

    return [torch.cuda.get_device_name(i) for i in range(gpu_count())]


def visible_gpus() -> list[str]:
    """The usable GPUs as CUDA_VISIBLE_DEVICES names them (indices or UUIDs), in order."""
    count = gpu_count()
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return [str(i) for i in range(count)]
    return [d.strip() for d in listed.split(",") if d.strip()][:count]


def _make_dir(folder: Path) -> None:
    """The folder and any missing parents, those created here sticky and world-writable (as /tmp),
    so that every user's runs can add lock files to them."""
    created = [d for d in (folder, *folder.parents) if not d.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    for d in created:
        try:
            d.chmod(0o1777)
        except PermissionError:  # another user's run made it first, and chmodded it
            pass


def _open_lock(folder: Path, name: str) -> int:
    path = folder / f"gpu-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)  # another user's run must be able to lock it too; only the creator may chmod
    except PermissionError:
        pass
    return fd


def _try_take(folder: Path, gpus: list[str], n: int) -> list[tuple[str, int]]:
    """Locks on n free GPUs as (name, fd), or none: never holds some while waiting for more."""
    taken: list[tuple[str, int]] = []
    for name in gpus:
        fd = _open_lock(folder, name)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        taken.append((name, fd))
        if len(taken) == n:
            return taken
    for _, fd in taken:
        os.close(fd)  # closing the last descriptor of the open file drops its flock
    return []


@contextmanager
def lease_gpus(
    n: int,
    *,
    lock_dir: Path | None = None,
    gpus: list[str] | None = None,
    poll_s: float = 1.0,
    log: Callable[[str], None] | None = None,
) -> Iterator[list[str] | None]:
    """Hold n of the visible GPUs exclusively for the block, with CUDA_VISIBLE_DEVICES narrowed to
    them; yields their names, or None where nothing is leased (n == 0, or no GPU: the cells then
    record why). `gpus` overrides the visible GPUs (tests).

    Raises ValueError before waiting when fewer than n GPUs are visible.
    """
    gpus = visible_gpus() if gpus is None and n > 0 else (gpus or [])
    if n <= 0 or not gpus:
        yield None
        return
    if n > len(gpus):
        raise ValueError(f"this job needs {n} GPUs (world_size) but this process sees {len(gpus)}")
    folder = lock_dir or default_lock_dir()
    _make_dir(folder)
    waited = False
    while not (taken := _try_take(folder, gpus, n)):
        if not waited and log:
            log(f"waiting for {n} free GPU(s) of {len(gpus)} (another longca chunk holds them; locks in {folder})")
        waited = True
        time.sleep(poll_s)
    previous = os.environ.get("CUDA_VISIBLE_DEVICES")
    names = [name for name, _ in taken]
    _held.extend(fd for _, fd in taken)
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(names)
    if log:
        log(f"leased GPU(s) {os.environ['CUDA_VISIBLE_DEVICES']}")
    try:
        yield names
    finally:
        if previous is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = previous
        for _, fd in taken:
            _held.remove(fd)
            os.close(fd)
