"""The "flex" adapter (compiled FlexAttention + BlockMask from slices) against a float64 reference.

Every mask the registry has is checked (parametrised over PATTERNS, so new masks are included) at
S = 256, D = 16, GQA 4:2, through the adapter's own prepare() and call. On CPU FlexAttention has no
backward and no float64, so CPU checks the forward (float32); with a GPU the gradients are checked
too. One process compiles flex once per distinct shape / interval layer count (a few, not one per
mask): the mask_mod reads tensors, so masks of one shape share the compiled kernel.
"""

from __future__ import annotations

import pytest
import torch

from longca.kernels import registry
from longca.kernels.base import Unsupported
from longca.masks.registry import PATTERNS, build_mask
from longca.measure.reference import dense_mask_tensor, reference_attention, relative_error

S, D, HQ, HKV, B = 256, 16, 4, 2, 1
ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
DTYPE = torch.float32
# float32 on CPU is exact enough for 1e-4; on a GPU leave room for TF32-class matmul precision.
TOL_OUT, TOL_GRAD = (2e-3, 5e-3) if ON_GPU else (1e-4, 1e-3)

# Parameters scaled to S = 256 so every mask is non-trivial (defaults target long sequences).
SMALL_PARAMS = {
    "window": 24,
    "global_tokens": 8,
    "prefix": 70,
    "block": 32,
    "min_block": 16,
    "mean_block": 40,
    "density": 0.4,
}


def small_params(name: str) -> dict:
    return {p.name: SMALL_PARAMS[p.name] for p in PATTERNS[name].params if p.name in SMALL_PARAMS}


def inputs(seed: int = 0):
    """bshd float64 q, k, v (the reference's layout)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, HQ, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, S, HKV, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, S, HKV, D, generator=gen, dtype=torch.float64)
    return q, k, v


@pytest.fixture(scope="module")
def flex():
    return registry.get("flex")


def test_declares_blockmask_form_and_layout(flex):
    assert flex.layout == "bhsd"
    assert flex.caps.mask_forms == frozenset({"blockmask"})
    assert flex.caps.gqa and flex.caps.backward
    assert "cpu" in flex.caps.devices and "cuda" in flex.caps.devices


def test_every_mask_offers_blockmask():
    # The planner can send every static and block-sparse mask to flex.
    missing = [n for n, p in PATTERNS.items() if "blockmask" not in p.forms]
    assert not missing


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_matches_float64_reference(flex, name):
    mask = build_mask(name, S, small_params(name), seed=3, heads_kv=HKV)
    assert 0 < mask.density <= 1
    q, k, v = inputs()
    prepared = flex.prepare(
        mask, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype=DTYPE, device=DEVICE, form="blockmask"
    )
    assert prepared.layout == "bhsd"
    assert prepared.build_s > 0 and prepared.compile_s >= 0
    # The BlockMask skips what the mask skips: no more kv blocks visited than a full mask has.
    visited = prepared.info["blocks_partial"] + prepared.info["blocks_full"]
    n_blocks = -(-S // prepared.info["block_size"])
    heads = HQ if mask.per_head else 1
    assert 0 < visited <= heads * n_blocks * n_blocks

    dense = dense_mask_tensor(mask, torch.device("cpu"))
    qr, kr, vr = (t.clone().requires_grad_(ON_GPU) for t in (q, k, v))
    ref = reference_attention(qr, kr, vr, dense)

    qd, kd, vd = (t.to(DEVICE, DTYPE).transpose(1, 2).contiguous().requires_grad_(ON_GPU) for t in (q, k, v))
    out = prepared.call(qd, kd, vd)
    assert out.shape == (B, HQ, S, D)
    err = relative_error(out.transpose(1, 2).cpu(), ref)
    assert err < TOL_OUT, f"{name}: forward relative error {err:.2e}"

    if ON_GPU:
        dout = torch.randn_like(ref)
        ref.backward(dout)
        out.backward(dout.to(DEVICE, DTYPE).transpose(1, 2))
        for got, want, label in ((qd, qr, "dq"), (kd, kr, "dk"), (vd, vr, "dv")):
            gerr = relative_error(got.grad.transpose(1, 2).cpu(), want.grad)
            assert gerr < TOL_GRAD, f"{name}: {label} relative error {gerr:.2e}"


def test_wrong_mask_is_detected(flex):
    """The check above can fail: flex under the causal mask differs from the full reference."""
    mask = build_mask("causal", S)
    q, k, v = inputs(1)
    prepared = flex.prepare(
        mask, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype=DTYPE, device=DEVICE, form="blockmask"
    )
    out = prepared.call(*(t.to(DEVICE, DTYPE).transpose(1, 2).contiguous() for t in (q, k, v)))
    full = reference_attention(q, k, v, torch.ones(1, S, S, dtype=torch.bool))
    assert relative_error(out.transpose(1, 2).cpu(), full) > 0.1


def test_other_form_is_unsupported(flex):
    mask = build_mask("causal", S)
    with pytest.raises(Unsupported):
        flex.prepare(mask, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype=DTYPE, device=DEVICE, form="causal")


@pytest.mark.skipif(ON_GPU, reason="CPU-only behaviour")
def test_cpu_backward_is_unsupported(flex):
    """torch has no CPU FlexAttention backward: the call says so as Unsupported (an `unsupported`
    row, not an error), while a no-grad forward still runs."""
    mask = build_mask("causal", S)
    prepared = flex.prepare(
        mask, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype=DTYPE, device=DEVICE, form="blockmask"
    )
    q = torch.randn(B, HQ, S, D, requires_grad=True)
    k = torch.randn(B, HKV, S, D, requires_grad=True)
    with pytest.raises(Unsupported, match="backward"):
        prepared.call(q, k, k)
    with torch.no_grad():
        assert prepared.call(q, k, k).shape == (B, HQ, S, D)


@pytest.mark.parametrize("block, grid", [(128, 128), (256, 128), (64, 64), (96, 32), (48, 16), (40, 128)])
def test_uniform_block_layouts_get_a_blockmask_of_their_own_block(block, grid):
    from longca.kernels.adapters.flex import block_size_for, kernel_options_for

    mask = build_mask("block_sparse", 1024, {"block": block, "density": 0.5}, seed=1, heads_kv=HKV)
    assert block_size_for(mask) == grid
    options = kernel_options_for(grid)
    if grid == 128:
        assert options is None
    else:  # every forward tile divides the BlockMask block, as torch requires; the backward keeps its defaults
        assert options == {"fwd_BLOCK_M": grid, "fwd_BLOCK_N": grid}


def _as_sm90(monkeypatch):
    """torch's Flex config table as it reads on an H100/H200 (it asks the current device's capability)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))


def test_torch_sm90_backward_defaults_need_block_128_at_head_dim_128(monkeypatch):
    # The H200's NoValidChoicesError (sparse_long, call 25): torch keeps a backward config only if its
    # default tiles divide the BlockMask block, and on sm90 at D=128 the one default is 128-wide.
    from longca.kernels.adapters.flex import backward_runs_at, backward_tile_configs

    _as_sm90(monkeypatch)
    cuda = torch.device("cuda")
    assert backward_tile_configs(128, torch.bfloat16) == [(64, 128, 128, 64)]
    assert backward_runs_at(128, 128, torch.bfloat16, cuda)
    assert not backward_runs_at(64, 128, torch.bfloat16, cuda)
    assert backward_runs_at(64, 32, torch.bfloat16, cuda)  # below head dim 64 the default tiles are 64
    assert backward_runs_at(64, 128, torch.bfloat16, torch.device("cpu"))  # no Flex backward on CPU to refuse


def test_backward_cells_get_the_128_grid_where_torch_has_no_backward_config(monkeypatch):
    from longca.kernels.adapters.flex import block_size_for

    _as_sm90(monkeypatch)
    mask = build_mask("block_sparse", 1024, {"block": 64, "density": 0.5}, seed=1, heads_kv=HKV)
    flex = registry.get("flex")
    for head_dim, grad_grid in ((128, 128), (32, 64)):
        assert block_size_for(mask, False, head_dim, torch.bfloat16, "cuda") == 64
        assert block_size_for(mask, True, head_dim, torch.bfloat16, "cuda") == grad_grid
        assert flex.grad_changes_form(mask, head_dim=head_dim, dtype=torch.bfloat16, device=torch.device("cuda")) is (
            grad_grid != 64
        )
    # Block 128 layouts and CPU runs never split.
    assert not flex.grad_changes_form(
        build_mask("block_sparse", 1024, {"block": 128, "density": 0.5}, seed=1, heads_kv=HKV),
        head_dim=128,
        dtype=torch.bfloat16,
        device=torch.device("cuda"),
    )
    assert not flex.grad_changes_form(mask, head_dim=128, dtype=torch.bfloat16, device=torch.device("cpu"))


def test_variable_blocks_and_static_masks_keep_block_128():
    from longca.kernels.adapters.flex import block_size_for

    assert (
        block_size_for(
            build_mask("variable_block_sparse", 1024, {"min_block": 16, "mean_block": 40}, seed=1, heads_kv=HKV)
        )
        == 128
    )
    assert block_size_for(build_mask("causal", 1024)) == 128


def test_a_forward_only_form_builds_no_backward_index_tensors_and_stays_correct(flex, monkeypatch):
    # Flex at block 64 on sm90 (forward cells only): the q-direction tensors would be dead weight
    # (32 GiB of the 91 GiB peak at 512K in call 27). Simulated here by a backward without a config.
    from longca.kernels.adapters import flex as flex_mod
    from longca.masks import flex as masks_flex

    built = []
    real = masks_flex.to_block_mask
    monkeypatch.setattr(masks_flex, "to_block_mask", lambda *a, **kw: built.append(real(*a, **kw)) or built[-1])
    monkeypatch.setattr(flex_mod, "backward_runs_at", lambda *a, **kw: False)
    mask = build_mask("block_sparse", S, {"block": 64, "density": 0.5}, seed=3, heads_kv=HKV)
    q, k, v = inputs()
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    for grad in (False, True):
        prepared = flex.prepare(
            mask, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype=DTYPE, device=DEVICE, form="blockmask", grad=grad
        )
        assert prepared.info["forward_only"] is (not grad)
        assert (built[-1].q_indices is None) is (not grad)
        with torch.no_grad():
            out = prepared.call(*(t.to(DEVICE, DTYPE).transpose(1, 2).contiguous() for t in (q, k, v)))
        assert relative_error(out.transpose(1, 2).cpu(), ref) < TOL_OUT


def test_block_64_layout_runs_on_full_blocks_only_and_names_its_tiles(flex):
    mask = build_mask("block_sparse", S, {"block": 64, "density": 0.5}, seed=3, heads_kv=HKV)
    prepared = flex.prepare(
        mask, batch=B, heads_q=HQ, heads_kv=HKV, head_dim=D, dtype=DTYPE, device=DEVICE, form="blockmask"
    )
    # On the 128 grid most blocks would be partial (mask_mod per element); on its own grid none are.
    assert prepared.info["block_size"] == 64 and prepared.info["blocks_partial"] == 0
    assert prepared.info["blocks_full"] == int(mask.blocks.kept.sum()) * (HQ // HKV)
    assert prepared.info["backend"].startswith("flex blockmask 64 tiles fwd_BLOCK_M=64")
    q, k, v = inputs()
    ref = reference_attention(q, k, v, dense_mask_tensor(mask, torch.device("cpu")))
    out = prepared.call(*(t.to(DEVICE, DTYPE).transpose(1, 2).contiguous() for t in (q, k, v)))
    assert relative_error(out.transpose(1, 2).cpu(), ref) < TOL_OUT


def test_fp8_is_a_forward_only_dtype(flex):
    """fp8 (e4m3) cells: the forward plans to run, the backward is planned `unsupported` with why."""
    from longca.kernels.base import static_unsupported_reason
    from longca.masks.forms import forms_of

    def reason(pass_):
        return static_unsupported_reason(
            flex.caps,
            mask_name="causal",
            mask_forms=forms_of("causal"),
            dtype="float8_e4m3fn",
            head_dim=128,
            heads_q=8,
            heads_kv=1,
            pass_=pass_,
            device="cuda",
        )

    assert reason("fwd") is None
    assert reason("bwd") == "no backward in float8_e4m3fn (backward dtypes: ['bfloat16', 'float16', 'float32'])"
    assert reason("fwd_bwd") == reason("bwd")


def test_fp8_on_cpu_is_refused_at_prepare(flex):
    """torch's CPU Flex lowering takes no fp8: the cell says so (an `unsupported` row) before any call."""
    mask = build_mask("causal", S)
    with pytest.raises(Unsupported, match="FlexAttention on CPU takes .* not torch.float8_e4m3fn"):
        flex.prepare(
            mask,
            batch=B,
            heads_q=HQ,
            heads_kv=HKV,
            head_dim=D,
            dtype=torch.float8_e4m3fn,
            device=torch.device("cpu"),
            form="blockmask",
        )


@pytest.mark.skipif(not ON_GPU, reason="fp8 Flex runs on CUDA only")
@pytest.mark.parametrize("name", ["causal", "causal_document", "prefix_lm_causal"])
def test_fp8_forward_matches_the_reference_on_its_rounded_inputs(flex, name):
    """e4m3 q, k, v and output: within the fp8 tolerance (8%) of the float32 reference on the same
    rounded inputs, and the mask ignored is far outside it. Head dim 64: an fp8 tensor-core product
    takes at least 32 along its inner dimension."""
    d = 64
    mask = build_mask(name, S, small_params(name))
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, S, h, d, generator=gen).to(DEVICE, torch.float8_e4m3fn) for h in (HQ, HKV, HKV))
    prepared = flex.prepare(
        mask,
        batch=B,
        heads_q=HQ,
        heads_kv=HKV,
        head_dim=d,
        dtype=torch.float8_e4m3fn,
        device=DEVICE,
        form="blockmask",
        grad=False,
    )
    with torch.no_grad():
        out = prepared.call(*(x.transpose(1, 2).contiguous() for x in (q, k, v)))
    assert out.dtype == torch.float8_e4m3fn
    ref = reference_attention(q.float(), k.float(), v.float(), dense_mask_tensor(mask, DEVICE))
    assert relative_error(out.transpose(1, 2), ref) < 8e-2
    unmasked = reference_attention(q.float(), k.float(), v.float(), torch.ones_like(dense_mask_tensor(mask, DEVICE)))
    assert relative_error(out.transpose(1, 2), unmasked) > 0.5
