"""Exclusive GPUs for a chunk on a host where nothing else assigns them.

Snakemake's local executor (`snakemake --cores 8` on one GPU host) starts as many chunk jobs as it
has cores, and each would time its cells on GPU 0 beside the others. So a chunk that needs GPUs
and finds no assignment (CUDA_VISIBLE_DEVICES unset) takes free ones by an exclusive `flock` on one
file per GPU in a host-wide folder, waits while too few are free, and sets CUDA_VISIBLE_DEVICES for
its workers and CP ranks. The kernel drops the locks when the process ends, however it ends, so a
killed run leaves nothing to clean up. Where a scheduler or the user set CUDA_VISIBLE_DEVICES
(SLURM does for each job) that assignment is respected and nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

LOCK_DIR_ENV = "LONGCA_GPU_LOCK_DIR"


def default_lock_dir() -> Path:
    """One folder per host, shared by every user's runs (GPUs are shared by them too)."""
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "longca-gpu-locks")


def gpu_count() -> int:
    """GPUs this process can use (CUDA_VISIBLE_DEVICES applied); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _open_lock(folder: Path, index: int) -> int:
    path = folder / f"gpu-{index}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)  # another user's run must be able to lock it too; only the creator may chmod
    except PermissionError:
        pass
    return fd


def _try_take(folder: Path, count: int, n: int) -> list[tuple[int, int]]:
    """Locks on n free GPUs as (index, fd), or none: never holds some while waiting for more."""
    taken: list[tuple[int, int]] = []
    for i in range(count):
        fd = _open_lock(folder, i)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        taken.append((i, fd))
        if len(taken) == n:
            return taken
    for _, fd in taken:
        os.close(fd)  # closing the last descriptor of the open file drops its flock
    return []


@contextmanager
def lease_gpus(n: int, *, lock_dir: Path | None = None, count: int | None = None, poll_s: float = 1.0,
               log: Callable[[str], None] | None = None) -> Iterator[list[int] | None]:
    """Hold n GPUs of this host exclusively for the block; yields their indices, or None where nothing
    is leased (n == 0, CUDA_VISIBLE_DEVICES already set, or no GPU: the cells then record why).

    Raises ValueError before waiting when the host has fewer than n GPUs.
    """
    if n <= 0 or "CUDA_VISIBLE_DEVICES" in os.environ:
        yield None
        return
    count = gpu_count() if count is None else count
    if count == 0:
        yield None
        return
    if n > count:
        raise ValueError(f"this job needs {n} GPUs (world_size) but this host has {count}")
    folder = lock_dir or default_lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        folder.chmod(0o1777)  # sticky and world-writable, as /tmp: every user can add lock files
    except PermissionError:
        pass
    waited = False
    while not (taken := _try_take(folder, count, n)):
        if not waited and log:
            log(f"waiting for {n} free GPU(s) of {count} (another longca chunk holds them; locks in {folder})")
        waited = True
        time.sleep(poll_s)
    ids = [i for i, _ in taken]
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
    if log:
        log(f"leased GPU(s) {os.environ['CUDA_VISIBLE_DEVICES']}")
    try:
        yield ids
    finally:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        for _, fd in taken:
            os.close(fd)
