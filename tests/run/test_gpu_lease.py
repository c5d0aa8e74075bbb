from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from longca.run.gpu_lease import lease_gpus


@pytest.fixture(autouse=True)
def _no_assignment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_concurrent_chunks_get_different_gpus_and_set_the_variable(tmp_path: Path) -> None:
    with lease_gpus(1, lock_dir=tmp_path, gpus=["0", "1"]) as first:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == str(first[0])
        os.environ.pop("CUDA_VISIBLE_DEVICES")  # as a second process would see it
        with lease_gpus(1, lock_dir=tmp_path, gpus=["0", "1"]) as second:
            assert first != second and sorted(first + second) == ["0", "1"]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_chunk_waits_until_a_gpu_is_free(tmp_path: Path) -> None:
    order: list[str] = []

    def other() -> None:
        time.sleep(0.3)
        with lease_gpus(1, lock_dir=tmp_path, gpus=["0"], poll_s=0.05):
            order.append("second got it")

    with lease_gpus(1, lock_dir=tmp_path, gpus=["0"]):
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.6)
        order.append("first releases")
    t.join(5)
    assert order == ["first releases", "second got it"]


def test_a_cp_chunk_takes_all_it_needs_or_none(tmp_path: Path) -> None:
    with lease_gpus(1, lock_dir=tmp_path, gpus=["0", "1"]):
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        got: list[list[int]] = []
        t = threading.Thread(target=lambda: got.append(_lease(tmp_path, 2, 2)))
        t.start()
        time.sleep(0.4)
        assert got == []  # one of two free: it waits, holding neither
        with lease_gpus(1, lock_dir=tmp_path, gpus=["0", "1"]) as single:
            assert single is not None  # the free one was not held by the waiting CP chunk
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    t.join(5)
    assert got == [["0", "1"]]


def _lease(folder: Path, n: int, count: int) -> list[str]:
    with lease_gpus(n, lock_dir=folder, gpus=[str(i) for i in range(count)], poll_s=0.05) as ids:
        return list(ids or [])


def test_a_killed_holder_frees_its_gpu(tmp_path: Path) -> None:
    code = (
        "import os, time; from pathlib import Path; from longca.run.gpu_lease import lease_gpus\n"
        f"with lease_gpus(1, lock_dir=Path({str(tmp_path)!r}), gpus=['0']):\n"
        "    print('held', flush=True); time.sleep(60)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    got: list[list[int]] = []
    t = threading.Thread(target=lambda: got.append(_lease(tmp_path, 1, 1)))
    t.start()
    time.sleep(0.3)
    assert got == []
    proc.kill()
    proc.wait()
    t.join(5)
    assert got == [["0"]]


def test_a_narrowed_assignment_is_shared_out_and_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # CUDA_VISIBLE_DEVICES=3,5 (a user's choice, or a SLURM allocation running Snakemake locally):
    # chunks lease among those two, each narrowed to its own, and the variable comes back after.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with lease_gpus(1, lock_dir=tmp_path, gpus=["3", "5"]) as first:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == first[0]
        os.environ["CUDA_VISIBLE_DEVICES"] = "3,5"  # as a second process would see it
        with lease_gpus(1, lock_dir=tmp_path, gpus=["3", "5"]) as second:
            assert sorted(first + second) == ["3", "5"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"


def test_the_visible_gpus_come_from_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from longca.run import gpu_lease

    monkeypatch.setattr(gpu_lease, "gpu_count", lambda: 2)
    assert gpu_lease.visible_gpus() == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, 7 ,")
    assert gpu_lease.visible_gpus() == ["GPU-aa", "7"]


def test_slurm_jobs_on_one_node_keep_apart_namespaces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # SLURM may number each job's GPUs from 0: two jobs' "0" are different GPUs.
    from longca.run.gpu_lease import default_lock_dir

    monkeypatch.setenv("LONGCA_GPU_LOCK_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "11")
    with lease_gpus(1, gpus=["0"]):
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        monkeypatch.setenv("SLURM_JOB_ID", "12")
        with lease_gpus(1, gpus=["0"], poll_s=0.05) as other_job:
            assert other_job == ["0"]
    assert default_lock_dir() == tmp_path / "slurm-12"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert default_lock_dir() == tmp_path


def test_no_gpu_needed_or_none_present_leases_nothing(tmp_path: Path) -> None:
    for n, gpus in ((0, ["0", "1"]), (1, [])):
        with lease_gpus(n, lock_dir=tmp_path, gpus=gpus) as ids:
            assert ids is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_more_gpus_than_the_host_has_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs 4 GPUs .* sees 2"):
        with lease_gpus(4, lock_dir=tmp_path, gpus=["0", "1"]):
            pass


def test_lock_folders_it_creates_are_open_to_every_user(tmp_path: Path) -> None:
    folder = tmp_path / "longca-gpu-locks" / "slurm-7"
    with lease_gpus(1, lock_dir=folder, gpus=["0"]):
        pass
    for d in (folder, folder.parent):
        assert d.stat().st_mode & 0o7777 == 0o1777
    assert tmp_path.stat().st_mode & 0o7777 != 0o1777  # what existed before is left as it was


def test_a_gpu_stays_leased_while_a_child_that_inherited_the_lock_lives(tmp_path: Path) -> None:
    """The supervisor's workers inherit its lock descriptors: killing the supervisor alone leaves
    the GPU leased until its last worker has gone too."""
    code = (
        "import subprocess, sys, time; from pathlib import Path\n"
        "from longca.run.gpu_lease import held_lock_fds, lease_gpus\n"
        f"with lease_gpus(1, lock_dir=Path({str(tmp_path)!r}), gpus=['0']):\n"
        "    child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], pass_fds=held_lock_fds())\n"
        "    print(child.pid, flush=True); time.sleep(60)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    child = int(proc.stdout.readline())
    try:
        proc.kill()
        proc.wait()
        got: list[list[str]] = []
        t = threading.Thread(target=lambda: got.append(_lease(tmp_path, 1, 1)))
        t.start()
        time.sleep(0.5)
        assert got == []  # the supervisor is gone, its child still holds the GPU
        os.kill(child, 9)
        t.join(5)
        assert got == [["0"]]
    finally:
        try:
            os.kill(child, 9)
        except ProcessLookupError:
            pass
