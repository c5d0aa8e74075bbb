"""FlexAttention on its FA4 backend (`flex_fa4`) and cuDNN's interval-mask attention (`cudnn_flex`,
`cudnn_flex_varlen`): capabilities as data, the forms they are handed, and planning. On the CPU
their cells are rows `unsupported` with the reason; with CUDA and the packages, every static mask
is checked against the float32 reference, forward and gradients (run on the H200)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from longca.kernels import registry
from longca.kernels.base import choose_form
from longca.masks.forms import forms_of
from longca.masks.registry import PATTERNS, build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error
from longca.run.cell import run_cell
from longca.run.serving import planned_unsupported, runtime_unsupported
from longca.spec.cells import expand
from longca.spec.load import load_spec

STATIC = sorted(n for n, p in PATTERNS.items() if p.family != "dynamic")


def _spec(
    device: str, kernels: list[str], masks: str = "[causal, causal_document, share_question]", head_dims: str = "[64]"
):
    return load_spec(
        text=f"""
name: t
device: {device}
kernels: {kernels}
masks: {masks}
seqlens: [256]
heads: ["4:2"]
head_dims: {head_dims}
dtypes: [bfloat16]
passes: [fwd, bwd]
check: {{max_seqlen: 256}}
sweeps: [{{name: s}}]
"""
    )


def test_capabilities_are_declared_as_data():
    flash = registry.get("flex_fa4").caps
    assert (flash.devices, flash.dtypes, flash.min_compute_capability, flash.package) == (
        frozenset({"cuda"}),
        frozenset({"float16", "bfloat16"}),
        (9, 0),
        "flash_attn.cute",
    )
    assert flash.mask_forms == frozenset({"blockmask"}) and flash.backward and flash.cp is None
    # FA4's sm90 tiles at head dim 256 are 80 keys wide, which no 128-block BlockMask divides
    assert flash.head_dims == frozenset({64, 128})
    cudnn = registry.get("cudnn_flex").caps
    assert cudnn.mask_forms == frozenset({"intervals"}) and cudnn.package == "cudnn.flex_attention"
    varlen = registry.get("cudnn_flex_varlen").caps
    assert varlen.masks is None and varlen.mask_forms == {"document_intervals"}


def test_each_kernel_is_handed_its_own_form():
    for name in STATIC:
        assert choose_form(registry.get("cudnn_flex").caps, forms_of(name)) == "intervals"
        assert choose_form(registry.get("flex_fa4").caps, forms_of(name)) == "blockmask"
    for name in ("full_document", "causal_document", "prefix_lm_document", "block_causal_document"):
        assert choose_form(registry.get("cudnn_flex_varlen").caps, forms_of(name)) == "document_intervals"


def test_planning_marks_what_the_kernels_cannot_serve():
    cells = expand(
        _spec(
            "cuda",
            ["cudnn_flex", "cudnn_flex_varlen", "flex_fa4"],
            "[causal, causal_document, prefix_lm_document, share_question, {name: block_sparse, block: 128}]",
        )
    )
    reasons = {(c.kernel, c.mask): planned_unsupported(c) for c in cells}
    assert reasons[("cudnn_flex", "causal")] is None and reasons[("cudnn_flex", "causal_document")] is None
    assert "offers forms" in reasons[("cudnn_flex", "block_sparse")]  # block lists have no interval form
    assert reasons[("cudnn_flex_varlen", "causal_document")] is None
    assert reasons[("cudnn_flex_varlen", "prefix_lm_document")] is None
    # no documents, or documents that see each other (answers see the question): no packed form
    assert "offers forms" in reasons[("cudnn_flex_varlen", "causal")]
    assert "offers forms" in reasons[("cudnn_flex_varlen", "share_question")]
    assert reasons[("flex_fa4", "block_sparse")] is None  # a BlockMask from the kept blocks


def test_planning_marks_flex_fa4_at_head_dim_256():
    cells = expand(_spec("cuda", ["flex_fa4", "cudnn_flex"], head_dims="[64, 256]"))
    reasons = {(c.kernel, c.head_dim): planned_unsupported(c) for c in cells}
    assert "head dim 256" in reasons[("flex_fa4", 256)]
    assert reasons[("flex_fa4", 64)] is None and reasons[("cudnn_flex", 256)] is None


def test_on_the_cpu_every_cell_is_an_unsupported_row_with_the_reason():
    rows = [r for c in expand(_spec("cpu", ["flex_fa4", "cudnn_flex", "cudnn_flex_varlen"])) for r in run_cell(c)]
    assert {r["status"] for r in rows} == {"unsupported"}
    assert {r["reason"] for r in rows} >= {"kernel runs on ['cuda'], not cpu"}


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ImportError:  # its parent package is absent
        return False


@pytest.mark.skipif(_installed("cudnn.flex_attention"), reason="checks the reason given where the package is absent")
def test_without_the_package_a_gpu_cell_says_so():
    cell = next(c for c in expand(_spec("cuda", ["cudnn_flex"])) if c.pass_ == "fwd")
    if torch.cuda.is_available():
        assert runtime_unsupported(cell, torch.device("cuda")) == "cudnn.flex_attention not installed"
    else:
        assert runtime_unsupported(cell, torch.device("cuda")) in (
            "cudnn.flex_attention not installed",
            "CUDA is not available on this machine",
        )


def _ready(name: str) -> bool:
    kernel = registry.get(name)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < kernel.caps.min_compute_capability:
        return False
    return _installed(kernel.caps.package)


DOCUMENT_LOCAL = ["full_document", "causal_document", "prefix_lm_document", "block_causal_document"]


@pytest.mark.parametrize(
    "kernel, mask_name",
    [(k, m) for k in ("flex_fa4", "cudnn_flex") for m in STATIC] + [("cudnn_flex_varlen", m) for m in DOCUMENT_LOCAL],
)
def test_every_static_mask_matches_the_reference_on_a_gpu(kernel, mask_name):
    if not _ready(kernel):
        pytest.skip(f"{kernel} needs CUDA (sm90+) and its package")
    torch.manual_seed(0)
    device, s, hq, hkv, d = torch.device("cuda"), 1024, 4, 2, 128
    params = {"window": 100} if "window" in {p.name for p in PATTERNS[mask_name].params} else {}
    params |= {"block": 128} if mask_name == "block_causal_document" else {}  # several documents at 1K
    mask = build_mask(mask_name, s, params, seed=0)
    k_ = registry.get(kernel)
    form = choose_form(k_.caps, forms_of(mask_name))
    prep = k_.prepare(
        mask, batch=1, heads_q=hq, heads_kv=hkv, head_dim=d, dtype=torch.bfloat16, device=device, form=form, grad=True
    )
    q, kk, v, do = (torch.randn(1, s, h, d, device=device) for h in (hq, hkv, hkv, hq))
    ref_in = [x.clone().requires_grad_(True) for x in (q, kk, v)]
    ref = reference_attention(*ref_in, dense_mask_tensor(mask, device))
    ref.backward(do)
    to = (lambda x: x.transpose(1, 2).contiguous()) if k_.layout == "bhsd" else (lambda x: x.contiguous())
    mine = [to(x).to(torch.bfloat16).requires_grad_(True) for x in (q, kk, v)]
    out = prep.call(*mine)
    out.backward(to(do).to(torch.bfloat16))
    back = (lambda x: x.transpose(1, 2)) if k_.layout == "bhsd" else (lambda x: x)
    assert relative_error(back(out), ref) < 3e-2
    for a, b in zip(mine, ref_in):
        assert relative_error(back(a.grad), b.grad) < 9e-2


@pytest.mark.parametrize("kernel", ["flex_fa4", "cudnn_flex", "cudnn_flex_varlen"])
def test_a_long_backward_cell_agrees_with_fa4_on_output_and_gradients_on_a_gpu(kernel):
    """The full-length agreement on real kernels (run on the H200): a backward cell beyond the check
    length compares its timed calls' output and dQ, dK, dV with FA4's on the same draw."""
    if not (_ready(kernel) and _ready("fa4")):
        pytest.skip(f"{kernel} and fa4 need CUDA (sm90+) and their packages")
    spec = load_spec(
        text=f"""
name: t
device: cuda
repeat: {{warmup: 1, iters: 3, min_iters: 3, budget_s: 1.0}}
kernels: [{kernel}]
masks: [causal_document]
mask_samples: {{multi_document: 1, single: 1}}
seqlens: [4096]
heads: ["8:2"]
head_dims: [128]
dtypes: [bfloat16]
passes: [bwd]
check: {{max_seqlen: 1024, agree_with: [fa4, cudnn_flex]}}
sweeps: [{{name: s}}]
"""
    )
    (cell,) = expand(spec)
    assert cell.check_dict["agree_gradients"] is True
    (row,) = run_cell(cell)
    assert row["status"] == "ok", row["reason"]
    assert row["agree_kernel"] == "fa4" and row["check_seqlen"] == 1024
    for name in ("agree_rel_diff", "agree_rel_diff_dq", "agree_rel_diff_dk", "agree_rel_diff_dv"):
        assert 0 <= row[name] < 2e-2, (name, row[name])  # two bf16 kernels on one problem
