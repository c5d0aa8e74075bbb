"""CUDA-graph capture of a timed call: replays compute the same thing; what cannot be captured
says why. The CUDA cases run on a GPU (tools/gpu-host.sh with LONGCA_GPU_TESTS)."""

from __future__ import annotations

import pytest
import torch

from longca.measure.graphs import capture
from longca.measure.timer import CudaTimer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def test_on_the_cpu_there_is_no_graph():
    assert capture(lambda: None, torch.device("cpu")) == (None, "no CUDA graphs on cpu")


@needs_cuda
def test_a_replay_computes_what_the_call_does_and_is_timed():
    dev = torch.device("cuda")
    a, b, out = (torch.randn(512, 512, device=dev) for _ in range(3))
    captured, reason = capture(lambda: torch.matmul(a, b, out=out), dev)
    assert reason is None
    a.copy_(torch.eye(512, device=dev))
    captured.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, b)  # the replay read a's new contents
    timing = CudaTimer(dev).time(captured.replay, warmup=1, iters=20, min_iters=20)
    assert timing.timed_iters == 20 and 0 < timing.median_ms < 10
    captured.release()


@needs_cuda
def test_a_call_that_synchronises_with_the_host_is_not_captured():
    dev = torch.device("cuda")
    x = torch.ones(4, device=dev)
    captured, reason = capture(lambda: x.sum().item(), dev)
    assert captured is None and reason.startswith("not capturable in a CUDA graph: ")
    assert (x + 1).sum().item() == 8  # the device is usable after the failed capture
