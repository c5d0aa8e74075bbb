"""A measuring process dies with the run that started it.

A worker or CP rank outliving its supervisor keeps timing on the device while the next run starts
on it (spoiling both runs' numbers), and writes what it finishes as if the run were still on. On
Linux the kernel kills such a process when its parent exits (`prctl(PR_SET_PDEATHSIG, SIGKILL)`);
a process whose parent is already gone when it asks (the race before the call) exits at once.
Elsewhere there is no such call and nothing is done: the supervisor's own SIGTERM handler still
takes its children down.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h


class RunStopped(BaseException):
    """The run this process belongs to is gone (its supervisor's pipe is closed): not a cell's
    result, so nothing is recorded for the cell in flight (longca.run.cell re-raises it)."""


SUPERVISOR_ENV = "LONGCA_SUPERVISOR_PID"  # the chunk supervisor's pid, for processes two launches down


def die_with_parent(parent: int | None = None, supervisor: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent exits; exit at once when `parent` (the
    pid expected) is already gone, or `supervisor` (the run's supervisor, for a CP rank whose parent
    is the launcher) is no longer alive: either may have ended before the request, and then no signal
    will come (a rank imports torch for seconds before it asks). Whether the request was made (Linux
    only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if parent is not None and os.getppid() != parent:
        os._exit(1)
    if supervisor is not None and not _alive(supervisor):
        os._exit(1)
    return True


def _alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie awaiting its parent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
