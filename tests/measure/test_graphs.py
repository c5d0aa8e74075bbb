"""CUDA-graph capture of a timed call: replays compute the same thing; what cannot be captured
says why. The CUDA cases run on a GPU (tools/gpu-host.sh with LONGCA_GPU_TESTS)."""

from __future__ import annotations

import pytest
import torch

from longca.measure.graphs import ATTEMPTS, WARMUP, CaptureRetryWarning, capture, held_by_failed_captures, pool_state
from longca.measure.timer import CudaTimer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


def test_on_the_cpu_there_is_no_graph():
    assert capture(lambda: None, torch.device("cpu")) == (None, "no CUDA graphs on cpu")


def test_a_pool_is_free_leaked_or_in_use_by_what_its_segments_hold():
    """From `torch.cuda.memory_snapshot()` after `empty_cache`: a pool with no segment is free;
    segments holding no tensor are kept by a pool reference alone (the failed capture's, which is
    then released); a segment holding a tensor is in use (its reference must not be released)."""
    pool, other = (0, 7), (0, 8)

    def seg(pool_id, allocated):
        return {"segment_pool_id": pool_id, "allocated_size": allocated, "total_size": 2 << 20}

    assert pool_state([], pool) == "free"
    assert pool_state([seg(other, 0), seg(other, 512)], pool) == "free"
    assert pool_state([seg(pool, 0), seg(pool, 0), seg(other, 512)], pool) == "leaked"
    assert pool_state([seg(pool, 0), seg(list(pool), 512)], pool) == "in use"


def test_no_failed_capture_holds_memory_in_this_process():
    """Without CUDA none can; with it, every failed capture of the tests before gave its pool back."""
    assert held_by_failed_captures() == 0


@needs_cuda
def test_a_failed_capture_gives_its_memory_back():
    """A capture that fails keeps its memory pool for the life of the process in PyTorch up to at
    least 2.11; `capture` gives it back, so a later cell has the whole device."""
    dev = torch.device("cuda")
    x = torch.ones(4, device=dev)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_reserved(dev)
    size = 256 << 20

    def call():
        torch.empty(size, dtype=torch.uint8, device=dev).fill_(1)  # inside a capture: from its pool
        return x.sum().item()  # ends any capture

    with pytest.warns(CaptureRetryWarning):
        for _ in range(3):
            assert capture(call, dev)[0] is None
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved(dev) - before < size
    assert held_by_failed_captures() == 0


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
    assert torch.randn(4, device=dev).isfinite().all()  # and its default generator out of capture mode


@needs_cuda
def test_a_capture_that_fails_once_is_tried_again_and_says_so():
    """The first attempt's capture synchronises with the host, which no capture mode allows; the
    second captures, with a warning naming the first's mode and failure."""
    assert ATTEMPTS >= 2
    dev = torch.device("cuda")
    x, out = torch.ones(4, device=dev), torch.zeros(4, device=dev)
    calls = []

    def call():
        calls.append(1)
        if len(calls) == WARMUP + 1:  # attempt 1's captured call
            x.sum().item()
        return torch.mul(x, 2, out=out)

    with pytest.warns(CaptureRetryWarning, match=r"attempt 1 of \d+ \(thread_local mode\) failed: not capturable"):
        captured, reason = capture(call, dev)
    assert reason is None and len(calls) == 2 * (WARMUP + 1)
    assert torch.equal(captured.replayed()[0], torch.full((4,), 2.0, device=dev))
    captured.release()


@needs_cuda
def test_a_backward_is_captured_on_the_stream_its_forward_ran_on():
    """Autograd runs each backward op on its forward op's stream: with the forward run on the
    capture stream (`prepare`), the backward is captured, and a replay from NaN outputs writes the
    eager backward's gradients."""
    dev = torch.device("cuda")
    q, k, v = (torch.randn(1, 4, 512, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    sdpa(q, k, v, is_causal=True).backward(dout)
    kept = {}

    def forward():
        kept["out"] = sdpa(q, k, v, is_causal=True)

    captured, reason = capture(
        lambda: torch.autograd.grad(kept["out"], (q, k, v), dout, retain_graph=True), dev, forward
    )
    assert reason is None and len(captured.outputs) == 3
    for replayed, x in zip(captured.replayed(), (q, k, v)):
        assert torch.allclose(replayed.float(), x.grad.float(), rtol=2e-2, atol=2e-2)
    captured.release()


@needs_cuda
def test_work_left_outside_the_capture_reads_nan_after_a_replay():
    """A call whose result was computed before the capture (cached on the host side) replays
    nothing: `replayed` shows it instead of the stale values."""
    dev = torch.device("cuda")
    cached, scratch = torch.ones(8, device=dev), torch.zeros(1, device=dev)

    def call():
        scratch.add_(1)  # the graph is not empty: only the result's work is missing from it
        return cached

    captured, reason = capture(call, dev)
    assert reason is None
    assert torch.isnan(captured.replayed()[0]).all()
    captured.release()
