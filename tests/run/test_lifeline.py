"""A measuring process dies with its run: a worker whose supervisor is gone (killed alone, so no
handler ran) stops at once and writes nothing; a closed status pipe is never a cell's result."""

import os
import signal
import subprocess
import sys
import time

import pytest

from longca.run.lifeline import RunStopped

SPEC = """
name: lifeline
device: cpu
repeat: {warmup: 0, iters: 3, min_iters: 3, budget_s: 10, l2_flush: false}
check: {max_seqlen: 128}
timeout_s: 60
kernels: [test_hang]
masks: [full]
seqlens: [192]
heads: ["2:2"]
head_dims: [16]
dtypes: [float32]
passes: [fwd]
sweeps: [{name: s}]
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_dies_with_its_killed_supervisor_and_writes_nothing(tmp_path, plugin_env, live_processes):
    def _workers(marker: str) -> list[int]:
        return list(live_processes(marker, "longca.run.worker"))

    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    results = tmp_path / "results"
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the chunk's work folder (job.json) under tmp_path
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "longca.cli", "run", "--spec", str(spec), "--results", str(results)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 90
        while not _workers(str(tmp_path)) and time.monotonic() < end and proc.poll() is None:
            time.sleep(0.2)
        workers = _workers(str(tmp_path))
        assert workers, (tmp_path / "run.log").read_text()[-2000:]
        time.sleep(2.0)  # inside the cell, whose call never returns
        os.kill(proc.pid, signal.SIGKILL)  # the supervisor alone: no handler runs, its worker is not told
        proc.wait()
        end = time.monotonic() + 10
        while _workers(str(tmp_path)) and time.monotonic() < end:
            time.sleep(0.1)
        assert not _workers(str(tmp_path)), "a worker outlived its run"
        assert not list(results.rglob("*.parquet")), "the interrupted cell left a file"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in _workers(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
        log.close()


def test_a_closed_status_pipe_stops_the_run_instead_of_becoming_the_cells_error(monkeypatch):
    """The cell runner passes RunStopped on (no row), as it does KeyboardInterrupt."""
    from longca.run.cell import run_cell
    from longca.spec.cells import expand
    from longca.spec.load import load_spec

    spec = load_spec(
        text=SPEC.replace("test_hang", "naive").replace("min_iters: 3, budget_s: 10", "min_iters: 1, budget_s: 1")
    )
    (cell,) = expand(spec)

    def gone(k):
        raise RunStopped("the supervisor's status pipe is closed")

    with pytest.raises(RunStopped):
        run_cell(cell, on_draw=gone)


def test_the_worker_status_pipe_turns_a_broken_pipe_into_run_stopped():
    from longca.run.worker import _StatusPipe

    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    pipe = _StatusPipe(os.fdopen(write_fd, "w", buffering=1))
    previous = signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python ignores it; say so for the test
    try:
        with pytest.raises(RunStopped):
            pipe.write("DRAW 0 0\n")
    finally:
        signal.signal(signal.SIGPIPE, previous)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_whose_parent_is_already_gone_exits_at_once():
    # a child asks with a parent pid that is not its parent's: it exits with status 1 at once
    code = "from longca.run.lifeline import die_with_parent; die_with_parent(1); print('lived')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "lived" not in out.stdout
    code = "import os; from longca.run.lifeline import die_with_parent; print(die_with_parent(os.getppid()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True"  # its parent is alive: it goes on


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_process_whose_supervisor_is_already_gone_exits_at_once():
    # a CP rank's parent is the launcher: it checks the run's supervisor too (here a pid that is gone)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = f"from longca.run.lifeline import die_with_parent; die_with_parent(supervisor={gone.pid}); print('lived')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "lived" not in out.stdout
    code = "import os; from longca.run.lifeline import die_with_parent; print(die_with_parent(supervisor=os.getppid()))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "True"
