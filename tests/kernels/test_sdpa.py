"""The SDPA adapter's refusal probe: a forced backend that cannot take a cell's inputs makes the cell
`unsupported` in prepare (outside timing), with SDPA's own explanation from its warnings."""

import warnings

import pytest
import torch

from longca.kernels import registry
from longca.kernels.adapters import sdpa
from longca.kernels.base import Unsupported
from longca.masks.registry import build_mask


def _prepare(kernel_name: str, form: str, heads_kv: int = 2):
    mask = build_mask("sliding_window" if form == "dense" else "causal", 256, {"window": 32} if form == "dense" else {})
    return registry.get(kernel_name).prepare(
        mask,
        batch=1,
        heads_q=4,
        heads_kv=heads_kv,
        head_dim=64,
        dtype=torch.float32,
        device=torch.device("cpu"),
        form=form,
    )


def test_refusal_reason_keeps_sdpa_warnings_once_and_is_bounded():
    exc = RuntimeError("No available kernel. Aborting execution.\nmore")
    text = sdpa.refusal_reason(
        "efficient", exc, ["Memory efficient kernel not used because:", "  no   GQA  ", "no GQA", ""]
    )
    assert text == (
        "SDPA efficient backend refused the inputs: No available kernel. Aborting execution.; "
        "Memory efficient kernel not used because:; no GQA"
    )
    assert len(sdpa.refusal_reason("math", exc, ["x" * 1000])) == 300


@pytest.mark.parametrize("form", ["dense", "causal"])
def test_probe_refusal_becomes_unsupported_with_the_reason(monkeypatch, form):
    seen = {}

    def refusing(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False):
        seen.update(mask=attn_mask, causal=is_causal, gqa=enable_gqa, shape=tuple(q.shape))
        warnings.warn("Memory efficient kernel not used because: enable_gqa is not supported", stacklevel=1)
        raise RuntimeError("No available kernel. Aborting execution.")

    monkeypatch.setattr(sdpa.F, "scaled_dot_product_attention", refusing)
    with pytest.raises(Unsupported, match="enable_gqa is not supported"):
        _prepare("sdpa_math", form)
    # The probe asks with the cell's own flags: a boolean mask for dense cells, GQA for 4:2 heads.
    assert seen["gqa"] is True and seen["shape"] == (1, 4, sdpa._PROBE_LEN, 64)
    if form == "dense":
        assert seen["mask"].dtype == torch.bool and seen["mask"].shape[-2:] == (sdpa._PROBE_LEN,) * 2
    else:
        assert seen["mask"] is None and seen["causal"] is True


def test_accepting_backend_prepares_a_dense_mask_call():
    prepared = _prepare("sdpa_math", "dense", heads_kv=4)
    q = torch.randn(1, 4, 256, 64)
    out = prepared.call(q, q, q)
    assert out.shape == (1, 4, 256, 64) and torch.isfinite(out).all()
