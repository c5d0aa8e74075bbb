"""One cell end to end on the CPU: rows, correctness gate, peak gate, unsupported reasons."""

import json

import pytest
import torch

from longca.measure.timer import timer_for
from longca.run.cell import run_cell
from longca.spec.cells import expand
from longca.spec.load import load_spec


def spec(
    kernels,
    masks="[full, causal]",
    extra="",
    passes="[bwd]",
    dtypes="[float32]",
    repeat="warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false",
    check="max_seqlen: 256",
):
    return load_spec(
        text=f"""
name: t
device: cpu
repeat: {{{repeat}}}
check: {{{check}}}
mask_samples: {{multi_document: 2, single: 1}}
kernels: {kernels}
masks: {masks}
seqlens: [192]
heads: ["2:1"]
head_dims: [16]
dtypes: {dtypes}
passes: {passes}
{extra}
sweeps: [{{name: s}}]
"""
    )


def test_naive_and_sdpa_rows_are_ok_and_checked():
    for cell in expand(spec("[naive, sdpa_math]")):
        rows = run_cell(cell)
        assert len(rows) == 1
        r = rows[0]
        assert r["status"] == "ok", r["reason"]
        assert r["rel_err_out"] < 1e-5 and r["rel_err_dq"] < 1e-5
        assert r["timed_iters"] >= 1 and len(r["samples_ms"]) == r["timed_iters"]
        assert r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
        assert r["mask_area"] == (192 * 192 if cell.mask == "full" else 192 * 193 // 2)
        assert r["flops"] == 2.5 * 4 * r["mask_area"] * 2 * 16
        assert r["device"] == "cpu" and r["git_commit"] is not None


def test_multi_document_mask_gives_one_row_per_sample():
    cell = expand(spec("[sdpa_math]", masks="[causal_document]"))[0]
    rows = run_cell(cell)
    assert [r["mask_sample"] for r in rows] == [0, 1]
    assert all(r["status"] == "ok" and r["distribution"] for r in rows)


def test_planned_unsupported_has_reason():
    cell = expand(spec("[sdpa_flash]", masks="[causal_document]"))[0]
    (row,) = run_cell(cell)
    assert row["status"] == "unsupported"
    assert "causal_document" in row["reason"] and "kernel takes" in row["reason"]


def test_cuda_only_kernel_on_cpu_is_unsupported():
    (row,) = run_cell(expand(spec("[sdpa_cudnn]"))[0])
    assert row["status"] == "unsupported" and "cpu" in row["reason"]


def test_wrong_kernel_is_incorrect_never_a_speed(plugin_env):
    (row,) = run_cell(expand(spec("[test_wrong]"))[0])
    assert row["status"] == "incorrect"
    assert row.get("median_ms") is None and row.get("tflops") is None
    assert row["rel_err_out"] == pytest.approx(0.01, rel=1e-3)


def test_impossible_speed_is_an_error(plugin_env):
    s = spec("[test_too_fast]", masks="[full]")
    cell = expand(s)[0]
    import dataclasses

    cell = dataclasses.replace(cell, seqlen=2048, heads_q=16, heads_kv=16, head_dim=128, pass_="fwd")
    (row,) = run_cell(cell)
    assert row["status"] == "error", row
    assert "above the device peak" in row["reason"]


def test_exception_and_oom_become_rows(plugin_env):
    rows = {c.kernel: run_cell(c)[0] for c in expand(spec("[test_raise, test_oom]", masks="[full]"))}
    assert rows["test_raise"]["status"] == "error" and "deliberate failure" in rows["test_raise"]["reason"]
    assert rows["test_oom"]["status"] == "oom"


def test_block_sparse_cells_record_their_blocks():
    s = spec("[sdpa_math]", masks="[{name: block_sparse, block: 32, density: 0.5, score: importance}]")
    (row,) = run_cell(expand(s)[0])
    assert row["status"] == "ok", row["reason"]
    assert (row["block_size"], row["score_source"], row["variable_blocks"]) == (32, "importance", False)
    # Kept area is whole 32 x 32 blocks; half of the 6 x 6 block grid per head, exactly.
    assert row["mask_area"] == 18 * 32 * 32 and row["density"] == 0.5


def test_backward_refused_at_run_time_is_unsupported_and_forward_still_runs(monkeypatch):
    # A kernel may refuse its backward for what is installed (fla on Hopper with Triton < 3.7.1):
    # the backward cell becomes `unsupported` with the reason, the forward cell is measured.
    from longca.kernels import registry

    monkeypatch.setattr(
        registry.get("naive"), "backward_refusal", lambda device: "this Triton computes wrong gradients", raising=False
    )
    (row,) = run_cell(expand(spec("[naive]", masks="[causal]"))[0])
    assert row["status"] == "unsupported" and row["reason"] == "this Triton computes wrong gradients"
    (row,) = run_cell(expand(spec("[naive]", masks="[causal]", passes="[fwd]"))[0])
    assert row["status"] == "ok" and row["rel_err_out"] < 1e-5


def test_rows_carry_phase_times_and_the_check_counts_once(monkeypatch):
    from longca.run.cell import CellCaches

    caches = CellCaches()  # a fresh process: the first cell checks
    bwd, fwd = expand(spec("[sdpa_math]", masks="[full]", passes="[bwd, fwd]"))
    (first,) = run_cell(bwd, caches)
    (second,) = run_cell(fwd, caches)  # same shape: the backward cell's check (with gradients) serves it
    assert first["status"] == second["status"] == "ok"
    assert first["check_s"] > 0 and second["check_s"] == 0.0
    for r in (first, second):
        timed = sum(r["samples_ms"]) / 1000
        assert 0 < r["warmup_s"] <= r["timer_wall_s"] and timed <= r["timer_wall_s"]
        assert r["warmup_s"] + timed <= r["timer_wall_s"] + 1e-9
        assert r["compile_s"] <= r["warmup_s"]
        assert r["timer_wall_s"] + r["check_s"] + r["mask_build_s"] <= r["cell_wall_s"]


def test_warmup_time_budget_of_the_spec_cuts_the_warmups():
    fixed = "warmup: 5, iters: 1, min_iters: 1, budget_s: 0.2, l2_flush: false"
    (row,) = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=fixed))[0])
    assert row["warmup_iters"] == 5
    budgeted = fixed + ", warmup_s: 1.0e-9"
    (row,) = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=budgeted))[0])
    assert row["status"] == "ok" and row["warmup_iters"] == 1


def test_cooldown_of_the_spec_idles_before_each_measured_row():
    fixed = "warmup: 1, iters: 1, min_iters: 1, budget_s: 0.2, l2_flush: false"
    (plain,) = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=fixed))[0])
    assert plain["cooldown_s"] == 0.0
    rows = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=fixed + ", cooldown_s: 0.15"))[0])
    for r in rows:
        assert r["status"] == "ok" and r["cooldown_s"] >= 0.15
        # outside the timer, inside the cell
        assert r["timer_wall_s"] + r["check_s"] + r["mask_build_s"] + r["cooldown_s"] <= r["cell_wall_s"]


@pytest.mark.parametrize("kernel", ["naive", "sdpa_math"])
def test_backward_on_a_retained_graph_runs_one_forward(kernel, monkeypatch):
    from longca.kernels import registry

    adapter = registry.get(kernel)
    real_prepare, forwards = adapter.prepare, []

    def prepare(mask, **kwargs):
        p = real_prepare(mask, **kwargs)
        call = p.call
        p.call = lambda *a: forwards.append(1) or call(*a)
        return p

    monkeypatch.setattr(adapter, "prepare", prepare)
    iters = "warmup: 2, iters: 4, min_iters: 4, budget_s: 100.0, l2_flush: false"
    for backward, timer_forwards, timer in (
        ("fresh_forward", 2 + 4, "cpu_monotonic"),
        ("retained_graph", 1, "cpu_monotonic+retained_graph"),
    ):
        forwards.clear()
        # no check: every forward counted is the timer's
        (row,) = run_cell(
            expand(
                spec(f"[{kernel}]", masks="[causal]", check="enabled: false", repeat=f"{iters}, backward: {backward}")
            )[0]
        )
        assert row["status"] == "ok" and row["timer"] == timer
        assert (row["warmup_iters"], row["timed_iters"], len(forwards)) == (2, 4, timer_forwards)
    (row,) = run_cell(expand(spec(f"[{kernel}]", masks="[causal]", repeat=f"{iters}, backward: retained_graph"))[0])
    assert row["status"] == "ok" and row["rel_err_dq"] < 1e-5  # the check is the same under either protocol


def test_a_kernel_that_refuses_a_retained_graph_keeps_fresh_forwards(monkeypatch):
    import dataclasses

    from longca.kernels import registry

    adapter = registry.get("naive")
    monkeypatch.setattr(adapter, "caps", dataclasses.replace(adapter.caps, retained_backward=False))
    repeat = "warmup: 1, iters: 2, min_iters: 2, budget_s: 100.0, l2_flush: false, backward: retained_graph"
    (row,) = run_cell(expand(spec("[naive]", masks="[causal]", repeat=repeat))[0])
    assert row["status"] == "ok" and row["timer"] == "cpu_monotonic"


def test_incorrect_cell_keeps_its_wall_and_check_time(plugin_env, monkeypatch):
    (row,) = run_cell(expand(spec("[test_wrong]"))[0])
    assert row["status"] == "incorrect"
    assert row["check_s"] > 0 and row["cell_wall_s"] >= row["check_s"]


def test_kernels_on_the_same_problem_share_one_reference(monkeypatch):
    """The float32/float64 reference depends on the problem only: a second kernel's check reuses it
    and gets the same errors as against a freshly computed one."""
    from longca.measure.reference_cache import ReferenceCache
    from longca.run import cell as cell_mod

    calls = []
    real = cell_mod.reference_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(cell_mod, "reference_attention", counting)
    naive, sdpa = expand(spec("[naive, sdpa_math]", masks="[causal]"))
    caches = cell_mod.CellCaches()
    shared = [cell_mod.check_correctness(c, cell_mod.torch.device("cpu"), caches) for c in (naive, sdpa)]
    assert len(calls) == 1 and caches.references.hits == 1
    nothing_kept = cell_mod.CellCaches(references=ReferenceCache(max_bytes=0))  # stores no reference
    fresh = cell_mod.check_correctness(sdpa, cell_mod.torch.device("cpu"), nothing_kept)
    assert len(calls) == 2
    for name in ("rel_err_out", "rel_err_dq", "rel_err_dk", "rel_err_dv"):
        assert shared[1][name] == fresh[name] and shared[1][name] < 1e-5


def test_a_reference_is_not_shared_across_masks_or_shapes(monkeypatch):
    from longca.measure.reference_cache import ReferenceCache
    from longca.run import cell as cell_mod

    caches = cell_mod.CellCaches(references=ReferenceCache())
    cells = expand(spec("[naive]", masks="[full, causal]"))
    cells += expand(spec("[naive]", masks="[causal]", extra='heads: ["2:2"]'))
    for c in cells:
        check = cell_mod.check_correctness(c, cell_mod.torch.device("cpu"), caches)
        assert check["rel_err_out"] < 1e-5 and check["rel_err_dq"] < 1e-5
    assert caches.references.hits == 0 and len(caches.references) == 3


def test_a_kernel_with_a_forward_only_form_is_prepared_and_checked_per_pass(monkeypatch):
    # Flex at block 64 on sm90 builds a forward-only BlockMask: the forward cell must be timed and
    # checked in that form, the backward cell in the form with gradients; one check cannot serve both.
    from longca.kernels import registry
    from longca.run import cell as cell_mod

    sdpa = registry.get("sdpa_math")
    grads_asked = []
    real_prepare = sdpa.prepare

    def prepare(mask, *, grad=True, **kwargs):
        grads_asked.append(grad)
        return real_prepare(mask, **kwargs)

    monkeypatch.setattr(sdpa, "grad_changes_form", lambda mask, **kw: True, raising=False)
    monkeypatch.setattr(sdpa, "prepare", prepare)
    caches = cell_mod.CellCaches()
    bwd, fwd = expand(spec("[sdpa_math]", masks="[causal]", passes="[bwd, fwd]"))
    (b,) = run_cell(bwd, caches)
    (f,) = run_cell(fwd, caches)
    assert b["status"] == f["status"] == "ok"
    assert b["check_s"] > 0 and f["check_s"] > 0  # the forward cell was checked in its own form
    assert f.get("rel_err_dq") is None and b["rel_err_dq"] < 1e-5
    # check and timed samples of the backward cell with gradients, then those of the forward cell without
    assert grads_asked[0] is True and grads_asked[-1] is False
    assert set(grads_asked[: len(grads_asked) // 2]) == {True} and set(grads_asked[len(grads_asked) // 2 :]) == {False}


def test_the_next_cell_of_the_same_problem_reuses_its_mask(monkeypatch):
    # fwd and bwd cells of one problem run one after the other: the second does not draw the mask
    # again (a 512K block-64 layout takes ~20 s), and records no build time for it.
    from longca.run import cell as cell_mod

    built = []
    real = cell_mod.build_mask

    def counting(*args, **kwargs):
        built.append(args[1])  # the length
        return real(*args, **kwargs)

    monkeypatch.setattr(cell_mod, "build_mask", counting)
    caches = cell_mod.CellCaches()
    masks = "[{name: block_sparse, block: 32, density: 0.5}]"
    bwd, fwd = expand(spec("[naive]", masks=masks, passes="[bwd, fwd]"))
    (b,) = run_cell(bwd, caches)
    (f,) = run_cell(fwd, caches)
    assert b["status"] == f["status"] == "ok"
    # the check (its own draw, kept apart) and the backward cell draw; the forward cell reuses
    assert built == [192, 192]
    assert b["mask_build_s"] > 0 and f["mask_build_s"] == 0.0
    assert f["mask_area"] == b["mask_area"] and f["density"] == b["density"]
    # another seed is another mask
    (other,) = run_cell(expand(spec("[naive]", masks=masks, passes="[fwd]", extra="seed: 5"))[0], caches)
    assert len(built) == 4 and other["mask_build_s"] > 0


def test_masks_drawn_from_the_inputs_are_not_kept(monkeypatch):
    from longca.run import cell as cell_mod

    caches = cell_mod.CellCaches()
    masks = "[{name: block_sparse, block: 32, density: 0.5, score: importance}]"
    for c in expand(spec("[naive]", masks=masks, passes="[bwd, fwd]")):
        (row,) = run_cell(c, caches)
        assert row["status"] == "ok" and row["mask_build_s"] > 0
    assert caches.masks == {}


class _UpcastFp8:
    """Test kernel: takes e4m3 inputs and computes in float32 on exactly the rounded values (what fp8
    tensor cores multiply), returning float32: exact up to float32 against a reference on the same
    rounded inputs, about 5% off one on the unrounded draws."""

    name = "test_fp8_upcast"
    layout = "bhsd"
    description = "test kernel: fp8 inputs computed in float32"

    def __init__(self):
        from longca.kernels.adapters.naive import NaiveAttention
        from longca.kernels.base import Capabilities

        self.caps = Capabilities(
            mask_forms=frozenset({"full", "dense"}),
            dtypes=frozenset({"float8_e4m3fn"}),
            devices=frozenset({"cpu"}),
            backward_dtypes=frozenset(),
        )
        self._naive = NaiveAttention()

    def prepare(self, mask, **kw):
        import torch

        from longca.kernels.base import Prepared

        assert kw["dtype"] == torch.float8_e4m3fn
        good = self._naive.prepare(mask, **{**kw, "dtype": torch.float32})
        return Prepared(
            call=lambda q, k, v: good.call(q.float(), k.float(), v.float()),
            layout=self.layout,
            info={"backend": "test"},
        )


@pytest.fixture
def fp8_kernel(monkeypatch):
    from longca.kernels import registry

    monkeypatch.setitem(registry.KERNELS, "test_fp8_upcast", _UpcastFp8())


def test_fp8_cells_are_checked_against_the_reference_on_their_rounded_inputs(fp8_kernel, monkeypatch):
    from longca.run import cell as cell_mod

    fwd, bwd = expand(spec("[test_fp8_upcast]", masks="[causal]", dtypes="[fp8]", passes="[fwd, bwd]"))
    assert fwd.dtype == bwd.dtype == "float8_e4m3fn" and json.loads(fwd.check)["tolerance"]["float8_e4m3fn"] == 0.08
    (row,) = run_cell(fwd)
    assert row["status"] == "ok", row["reason"]
    assert row["rel_err_out"] < 1e-6 and row["dtype"] == "float8_e4m3fn"
    (row,) = run_cell(bwd)
    assert row["status"] == "unsupported" and row["reason"].startswith("no backward in float8_e4m3fn")
    # against the unrounded draws, the same exact kernel is several percent off: the rounding, not the kernel
    monkeypatch.setattr(cell_mod, "ROUNDED_REFERENCE_DTYPES", frozenset())
    off = cell_mod.check_correctness(fwd, cell_mod.torch.device("cpu"))["rel_err_out"]
    assert 1e-2 < off < 1e-1


def test_fp8_inputs_are_unscaled_normal_draws_rounded_to_e4m3():
    import torch

    from longca.run.cell import _make_inputs

    cell = expand(spec("[naive]", passes="[fwd]"))[0]
    q, k, v, do = _make_inputs(cell, 192, "bhsd", torch.device("cpu"), torch.float8_e4m3fn, 7, False)
    assert {x.dtype for x in (q, k, v, do)} == {torch.float8_e4m3fn}
    ((q32, *_),) = [_make_inputs(cell, 192, "bhsd", torch.device("cpu"), torch.float32, 7, False)]
    assert torch.equal(q.float(), q32.to(torch.float8_e4m3fn).float())  # the same draws, rounded
    assert 0.9 < q.float().std() < 1.1 and not q.requires_grad


def test_a_check_never_runs_a_backward_in_a_dtype_the_kernel_has_none_for():
    """On a GPU a forward cell's check also compares gradients, except in a dtype the kernel's
    backward does not take (fp8 for Flex)."""
    import torch

    from longca.kernels import registry
    from longca.run.cell import checks_gradients

    flex = registry.get("flex")
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    for dtype, on_gpu in (("[bf16]", True), ("[fp8]", False)):
        fwd, bwd = expand(spec("[flex]", masks="[causal]", dtypes=dtype, passes="[fwd, bwd]"))
        assert checks_gradients(flex, fwd, cuda) is on_gpu
        assert checks_gradients(flex, bwd, cpu) is on_gpu  # (an fp8 bwd cell is planned unsupported first)
        assert checks_gradients(flex, fwd, cpu) is False


def test_every_row_carries_the_interval_of_its_median_and_the_adaptive_protocol_says_if_met():
    plain = run_cell(expand(spec("[naive]", masks="[full]"))[0])[0]
    assert plain["ci_low_ms"] <= plain["median_ms"] <= plain["ci_high_ms"]
    assert plain["ci_target"] is None and plain["ci_met"] is None
    adaptive = spec(
        "[naive]",
        masks="[full]",
        # a budget that a loaded CPU cannot exhaust before a +-50% interval: the loop stops once met
        repeat="warmup: 1, iters: 400, min_iters: 1, budget_s: 60.0, l2_flush: false, ci_target: 0.5",
    )
    cell = expand(adaptive)[0]
    row = run_cell(cell)[0]
    assert row["status"] == "ok" and row["ci_target"] == 0.5
    assert row["ci_met"] is True and row["timed_iters"] >= 6 and row["timer_wall_s"] < 60.0
    assert row["ci_low_ms"] <= row["median_ms"] <= row["ci_high_ms"]
    assert cell.digest != expand(spec("[naive]", masks="[full]", repeat=adaptive_repeat_without_target()))[0].digest


def adaptive_repeat_without_target() -> str:
    return "warmup: 1, iters: 400, min_iters: 1, budget_s: 60.0, l2_flush: false"


def test_graph_replay_is_asked_for_and_each_row_says_why_it_has_none_on_the_cpu():
    fixed = "warmup: 1, iters: 2, min_iters: 1, budget_s: 0.2, l2_flush: false"
    (plain,) = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=fixed))[0])
    assert plain.get("graph_reason") is None and plain.get("graph_median_ms") is None  # not asked for
    cells = expand(spec("[naive]", masks="[full]", passes="[fwd, bwd, fwd_bwd]", repeat=fixed + ", graph: true"))
    reasons = {c.pass_: run_cell(c)[0]["graph_reason"] for c in cells}
    assert reasons == {p: "no CUDA graphs on cpu" for p in ("fwd", "bwd", "fwd_bwd")}


class CpuGraph:
    """Stands in for a CUDA graph on the CPU (they need a GPU; tests/measure/test_graphs.py captures
    real ones there): `prepare` runs once, the call once at capture, and each replay runs it again
    and writes its results into the tensors the capture returned, as a graph's replays rewrite its
    static outputs. `escaped`: replays write nothing, as when the call's work ran outside the capture."""

    made: list = []

    def __init__(self, fn, prepare, escaped=False):
        if prepare is not None:
            prepare()
        self.fn, self.escaped, self.replays, self.released = fn, escaped, 0, False
        self.outputs = list(self._run())
        CpuGraph.made.append(self)

    def _run(self):
        out = self.fn()
        return out if isinstance(out, tuple) else (out,)

    def replay(self):
        self.replays += 1
        if not self.escaped:
            for o, new in zip(self.outputs, self._run()):
                o.copy_(new)

    def replayed(self):
        for o in self.outputs:
            o.fill_(float("nan"))
        self.replay()
        return self.outputs

    def release(self):
        self.released = True


@pytest.fixture
def cpu_graphs(monkeypatch):
    import longca.run.cell as cell_module

    CpuGraph.made = []
    monkeypatch.setattr(cell_module, "capture", lambda fn, device, prepare=None: (CpuGraph(fn, prepare), None))
    return CpuGraph.made


GRAPHED = "warmup: 1, iters: 4, min_iters: 4, budget_s: 1.0, l2_flush: false, graph: true, backward: retained_graph"


@pytest.mark.parametrize("pass_", ["fwd", "bwd", "fwd_bwd"])
def test_graph_replay_times_each_pass_s_captured_call_under_the_same_timer(cpu_graphs, pass_):
    """Every pass is captured: a backward alone on one forward run before the capture (the eager
    retained graph's), forward+backward whole. One replay is checked against the eager calls, then
    the warm-up and the timed replays follow."""
    (row,) = run_cell(expand(spec("[naive]", masks="[causal]", passes=f"[{pass_}]", repeat=GRAPHED))[0])
    assert row["status"] == "ok" and row.get("graph_reason") is None
    (graph,) = cpu_graphs
    assert graph.replays == 1 + 1 + 4 and graph.released  # the check, the warm-up, the timed calls
    assert len(graph.outputs) == (1 if pass_ == "fwd" else 3)  # the output, or dq, dk, dv
    assert row["graph_ci_low_ms"] <= row["graph_median_ms"] <= row["graph_ci_high_ms"]


def test_a_replay_that_does_not_reproduce_the_eager_call_is_not_timed(monkeypatch):
    import longca.run.cell as cell_module

    monkeypatch.setattr(
        cell_module, "capture", lambda fn, device, prepare=None: (CpuGraph(fn, prepare, escaped=True), None)
    )
    fixed = "warmup: 1, iters: 2, min_iters: 2, budget_s: 1.0, l2_flush: false, graph: true"
    for cell in expand(spec("[naive]", masks="[full]", passes="[fwd, bwd]", repeat=fixed)):
        (row,) = run_cell(cell)
        assert row["status"] == "ok" and row.get("graph_median_ms") is None  # the eager timing stands
        assert row["graph_reason"].startswith("a replay does not reproduce the eager call (relative error inf > ")


def test_a_captured_backward_leaves_the_eager_gradients_and_refuses_without_a_retained_graph(cpu_graphs):
    """The full-length agreement compares the last eager backward's `.grad`: the captured backward
    takes its own (torch.autograd.grad) and leaves them. A kernel whose backward cannot run twice on
    one forward has no backward alone to capture."""
    from types import SimpleNamespace

    from longca.run.cell import _graph_pass, graph_columns

    (cell,) = expand(spec("[naive]", masks="[full]", passes="[bwd]", repeat=GRAPHED))
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 2, 8, 4, dtype=torch.float64)

    def call(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    call(q, k, v).backward(dout)
    eager = [x.grad.clone() for x in (q, k, v)]
    kernel = SimpleNamespace(caps=SimpleNamespace(retained_backward=True))
    cols = graph_columns(
        cell,
        cell.repeat_dict,
        timer_for(torch.device("cpu")),
        torch.device("cpu"),
        1.0,
        _graph_pass(cell, kernel, call, (q, k, v), dout),
    )
    assert cols["graph_median_ms"] > 0
    assert all(torch.equal(x.grad, e) for x, e in zip((q, k, v), eager))
    assert all(torch.allclose(o, e) for o, e in zip(cpu_graphs[0].outputs, eager))
    refused = _graph_pass(cell, SimpleNamespace(caps=SimpleNamespace(retained_backward=False)), call, (q, k, v), dout)
    assert refused == "naive's backward cannot run twice on one forward (Capabilities.retained_backward)"


@pytest.mark.parametrize("pass_", ["bwd", "fwd_bwd"])
def test_a_captured_backward_differentiates_with_respect_to_leaves_of_its_own(pass_):
    """The inputs' gradient accumulators belong to the eager calls' graph (made on the default
    stream, kept alive by it): the captured pass never ends in them, so no hook of an input fires,
    and its gradients are still the eager ones."""
    from types import SimpleNamespace

    from longca.run.cell import _graph_pass

    (cell,) = expand(spec("[naive]", masks="[full]", passes=f"[{pass_}]", repeat=GRAPHED))
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dout = torch.randn(1, 2, 8, 4, dtype=torch.float64)

    def call(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v

    eager_out = call(q, k, v)
    eager_out.backward(dout, retain_graph=True)
    fired = []
    for x in (q, k, v):
        x.register_hook(lambda g: fired.append(g))
    kernel = SimpleNamespace(caps=SimpleNamespace(retained_backward=True))
    graph_pass = _graph_pass(cell, kernel, call, (q, k, v), dout)
    for _ in range(2):  # each attempt's prepare makes new leaves
        graph_pass.prepare()
        grads = graph_pass.call()
        assert fired == []
        assert all(torch.allclose(g, x.grad) for g, x in zip(grads, (q, k, v)))
    graph_pass.release()


def test_graph_replay_skips_calls_longer_than_graph_below_ms(monkeypatch):
    """A long call's replays would repeat its timing at full cost for a launch time of microseconds."""
    import longca.run.cell as cell_module

    monkeypatch.setattr(
        cell_module, "capture", lambda fn, device, prepare=None: (_ for _ in ()).throw(AssertionError("captured"))
    )
    fixed = "warmup: 1, iters: 2, min_iters: 1, budget_s: 0.2, l2_flush: false, graph: true, graph_below_ms: 1.0e-6"
    (row,) = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=fixed))[0])
    assert row["status"] == "ok" and row.get("graph_median_ms") is None
    assert row["graph_reason"].startswith("eager median ") and row["graph_reason"].endswith(
        ">= repeat.graph_below_ms 1e-06: launch time is negligible"
    )


def test_a_stopped_cell_keeps_its_finished_draws_and_the_next_run_measures_only_the_rest(tmp_path, monkeypatch):
    """A run stopped inside a cell of a sampled mask (here: interrupted while measuring its second
    draw) keeps the first draw's row beside the cell file; the next run takes that row as it is and
    measures only the second, and its wall adds the first draw's."""
    import longca.run.cell as cell_mod
    from longca.store.draws import clear_draws, draw_file

    cell = next(c for c in expand(spec("[naive]", masks="[causal_document]", passes="[fwd]")) if c.samples == 2)
    out = tmp_path / "cell-x.parquet"
    measure = cell_mod._measure_sample

    def stopped_at_the_second_draw(c, device, sample, check, caches):
        if sample == 1:
            raise KeyboardInterrupt  # the run stops here (a worker is killed: nothing after this runs)
        return measure(c, device, sample, check, caches)

    monkeypatch.setattr(cell_mod, "_measure_sample", stopped_at_the_second_draw)
    with pytest.raises(KeyboardInterrupt):
        run_cell(cell, keep_draws=out)
    assert draw_file(out, 0).is_file() and not draw_file(out, 1).exists() and not out.exists()
    assert not draw_file(out, 0).name.endswith(".parquet")  # never read as a cell's rows

    measured: list[int] = []

    def counting(c, device, sample, check, caches):
        measured.append(sample)
        return measure(c, device, sample, check, caches)

    monkeypatch.setattr(cell_mod, "_measure_sample", counting)
    rows = run_cell(cell, keep_draws=out)
    assert measured == [1]  # the first draw is not measured again
    assert [r["mask_sample"] for r in rows] == [0, 1] and {r["status"] for r in rows} == {"ok"}
    first = cell_mod.load_draw(out, 0)
    assert rows[0]["timestamp"] == first["timestamp"] and rows[0]["samples_ms"] == first["samples_ms"]
    assert rows[0]["cell_wall_s"] == rows[1]["cell_wall_s"] > first["cell_wall_s"]  # the draws' walls add up
    clear_draws(out)
    assert not list(tmp_path.iterdir())
    # without keep_draws (or for a cell of one draw) nothing is written beside the cell
    monkeypatch.setattr(cell_mod, "_measure_sample", measure)
    run_cell(cell)
    single = next(c for c in expand(spec("[naive]", passes="[fwd]")) if c.samples == 1)
    run_cell(single, keep_draws=out)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("kernel", ["sdpa_flash", "sdpa_cudnn", "flex"])
def test_on_a_gpu_every_pass_of_torch_s_kernels_has_a_replayed_time(kernel):
    """Forward, backward alone (on a retained forward captured on its stream) and forward+backward
    are captured, their replays reproduce the eager calls and are timed."""
    if kernel == "sdpa_cudnn" and torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("cuDNN SDPA's backward here needs sm90")
    cells = expand(
        load_spec(
            text=f"""
name: t
device: cuda
repeat: {{{GRAPHED}}}
check: {{max_seqlen: 1024}}
kernels: [{kernel}]
masks: [causal]
seqlens: [1024]
heads: ["4:4"]
head_dims: [64]
dtypes: [bfloat16]
passes: [fwd, bwd, fwd_bwd]
sweeps: [{{name: s}}]
"""
        )
    )
    for cell in cells:
        (row,) = run_cell(cell)
        assert row["status"] == "ok", row["reason"]
        assert row.get("graph_reason") is None, (cell.pass_, row["graph_reason"])
        assert row["graph_ci_low_ms"] <= row["graph_median_ms"] <= row["graph_ci_high_ms"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("pass_", ["bwd", "fwd_bwd"])
def test_on_a_gpu_a_backward_is_captured_while_the_eager_graph_keeps_the_inputs_accumulators(pass_):
    """As in a cell: the eager calls' retained graph, made on the default stream, is alive during the
    capture and holds the inputs' gradient accumulators. The captured pass differentiates with
    respect to leaves of its own, so its first attempt captures (a backward ending in the eager
    accumulators failed in every capture mode) and its replay gives the eager gradients."""
    import warnings
    from types import SimpleNamespace

    from longca.measure.graphs import CaptureRetryWarning, capture
    from longca.run.cell import _graph_pass

    dev = torch.device("cuda")
    (cell,) = expand(spec("[naive]", masks="[causal]", passes=f"[{pass_}]", repeat=GRAPHED))  # its pass
    q, k, v = (torch.randn(1, 4, 1024, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)

    def call(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    eager_out = call(q, k, v)  # kept alive, as the cell keeps its retained forward
    eager_out.backward(dout, retain_graph=True)
    kernel = SimpleNamespace(caps=SimpleNamespace(retained_backward=True))
    graph_pass = _graph_pass(cell, kernel, call, (q, k, v), dout)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureRetryWarning)
        captured, reason = capture(graph_pass.call, dev, graph_pass.prepare)
    assert reason is None
    for replayed, x in zip(captured.replayed(), (q, k, v)):
        assert torch.allclose(replayed.float(), x.grad.float(), rtol=2e-2, atol=2e-2)
    captured.release()
    graph_pass.release()
    del eager_out


def test_running_out_of_memory_checking_a_replay_keeps_the_eager_row(monkeypatch):
    import longca.run.cell as cell_module

    class OutOfMemory(CpuGraph):
        def replayed(self):
            raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(cell_module, "capture", lambda fn, device, prepare=None: (OutOfMemory(fn, prepare), None))
    (row,) = run_cell(expand(spec("[naive]", masks="[full]", passes="[fwd]", repeat=GRAPHED))[0])
    assert row["status"] == "ok" and row["median_ms"] > 0 and row.get("graph_median_ms") is None
    assert row["graph_reason"] == "out of memory comparing a replay with the eager call: not timed"


@pytest.mark.parametrize(
    "medians, within, settled",
    [
        ([10.0, 10.1], 0.02, True),  # spread 0.1 over the median 10.05: 1.0%
        ([10.0, 10.3], 0.02, False),  # 3.0%
        ([10.0, 10.5, 10.2], 0.05, True),  # 0.5 over 10.2: 4.9%
        ([10.0, 10.5, 10.2], 0.04, False),
        ([10.0], 0.5, False),  # one draw says nothing of the spread
        ([10.0, 10.0], None, False),  # not asked for
    ],
)
def test_draws_settle_by_their_spread(medians, within, settled):
    from longca.run.cell import draws_settled

    rows = [{"status": "ok", "median_ms": m} for m in medians]
    assert draws_settled(rows, within) is settled


def test_draws_settle_on_the_replayed_time_and_never_past_a_failed_draw():
    from longca.run.cell import draws_settled

    # eager times 10 and 20 (host jitter), replays 5.0 and 5.05: the headline is the replay's
    assert draws_settled(
        [
            {"status": "ok", "median_ms": 10.0, "graph_median_ms": 5.0},
            {"status": "ok", "median_ms": 20.0, "graph_median_ms": 5.05},
        ],
        0.02,
    )
    assert not draws_settled([{"status": "ok", "median_ms": 10.0}, {"status": "error", "median_ms": None}], 0.5)


@pytest.mark.parametrize("medians, draws", [((10.0, 10.1, 12.0), 2), ((10.0, 11.0, 10.5), 3)])
def test_a_sampled_mask_stops_drawing_once_two_draws_agree(monkeypatch, medians, draws):
    import longca.run.cell as cell_mod

    def measured(cell, device, sample, check, caches):  # each draw's median as given, nothing timed
        return {"mask_sample": sample, "median_ms": medians[sample], "status": "ok", "reason": None}

    monkeypatch.setattr(cell_mod, "_measure_sample", measured)
    repeat = "warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false, draws_within: 0.02"
    s = spec("[sdpa_math]", masks="[causal_document]", repeat=repeat, extra="mask_samples: {multi_document: 3}")
    (cell,) = expand(s)
    rows = run_cell(cell)
    assert [r["mask_sample"] for r in rows] == list(range(draws))
    assert all(r["mask_samples"] == 3 for r in rows)  # 3 planned, `draws` taken


def test_a_cell_its_device_cannot_hold_is_an_oom_row_before_anything_is_allocated():
    s = load_spec(
        text="""
name: t
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false}
kernels: [naive]
masks: [full]
seqlens: ["8M"]
heads: ["64:64"]
head_dims: [128]
dtypes: [float32]
passes: [bwd]
sweeps: [{name: s}]
"""
    )
    (row,) = run_cell(expand(s)[0])
    assert row["status"] == "oom"
    assert row["reason"].startswith("out of memory: q, k, v and the output, with their gradients alone need 2048.0 GiB")


def test_the_cpu_allocators_refusal_is_an_oom():
    from longca.run.rows import classify

    exc = RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried ...")
    assert classify(exc)[0] == "oom"
    assert classify(RuntimeError("some other failure"))[0] == "error"


def test_a_cell_looks_its_kernel_and_mask_up_once(monkeypatch):
    """The cell carries its adapter and pattern (Cell.adapter, Cell.pattern): running it asks the
    registry for its kernel once, however many steps use it."""
    from longca.kernels import registry

    calls = []
    real = registry.get
    monkeypatch.setattr(registry, "get", lambda name: (calls.append(name), real(name))[1])
    (cell,) = [c for c in expand(spec("[naive]", masks="[full_document]")) if c.pass_ == "bwd"]
    rows = run_cell(cell)
    assert [r["status"] for r in rows] == ["ok", "ok"]  # two mask draws, each checked and timed
    assert calls == ["naive"]
