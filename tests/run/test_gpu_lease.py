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
    with lease_gpus(1, lock_dir=tmp_path, count=2) as first:
        assert os.environ["CUDA_VISIBLE_DEVICES"] == str(first[0])
        os.environ.pop("CUDA_VISIBLE_DEVICES")  # as a second process would see it
        with lease_gpus(1, lock_dir=tmp_path, count=2) as second:
            assert first != second and sorted(first + second) == [0, 1]
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_a_chunk_waits_until_a_gpu_is_free(tmp_path: Path) -> None:
    order: list[str] = []

    def other() -> None:
        time.sleep(0.3)
        with lease_gpus(1, lock_dir=tmp_path, count=1, poll_s=0.05):
            order.append("second got it")

    with lease_gpus(1, lock_dir=tmp_path, count=1):
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        t = threading.Thread(target=other)
        t.start()
        time.sleep(0.6)
        order.append("first releases")
    t.join(5)
    assert order == ["first releases", "second got it"]


def test_a_cp_chunk_takes_all_it_needs_or_none(tmp_path: Path) -> None:
    with lease_gpus(1, lock_dir=tmp_path, count=2):
        os.environ.pop("CUDA_VISIBLE_DEVICES")
        got: list[list[int]] = []
        t = threading.Thread(target=lambda: got.append(_lease(tmp_path, 2, 2)))
        t.start()
        time.sleep(0.4)
        assert got == []  # one of two free: it waits, holding neither
        with lease_gpus(1, lock_dir=tmp_path, count=2) as single:
            assert single is not None  # the free one was not held by the waiting CP chunk
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    t.join(5)
    assert got == [[0, 1]]


def _lease(folder: Path, n: int, count: int) -> list[int]:
    with lease_gpus(n, lock_dir=folder, count=count, poll_s=0.05) as ids:
        return list(ids or [])


def test_a_killed_holder_frees_its_gpu(tmp_path: Path) -> None:
    code = ("import os, time; from pathlib import Path; from longca.run.gpu_lease import lease_gpus\n"
            f"with lease_gpus(1, lock_dir=Path({str(tmp_path)!r}), count=1):\n"
            "    print('held', flush=True); time.sleep(60)\n")
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
    assert got == [[0]]


def test_an_existing_assignment_is_respected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with lease_gpus(1, lock_dir=tmp_path, count=8) as ids:
        assert ids is None and os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    assert list(tmp_path.iterdir()) == []


def test_no_gpu_needed_or_none_present_leases_nothing(tmp_path: Path) -> None:
    for n, count in ((0, 2), (1, 0)):
        with lease_gpus(n, lock_dir=tmp_path, count=count) as ids:
            assert ids is None and "CUDA_VISIBLE_DEVICES" not in os.environ


def test_more_gpus_than_the_host_has_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs 4 GPUs .* has 2"):
        with lease_gpus(4, lock_dir=tmp_path, count=2):
            pass
