"""A new mask is one file: a plugin's pattern (tests/plugins/anti_causal_mask.py) is built, given to
kernels in its forms, accepted in a spec and measured against the reference like the built-in ones."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from longca.masks.forms import convert, forms_of
from longca.masks.registry import PATTERNS, build_mask
from longca.run.cell import run_cell
from longca.spec.cells import expand
from longca.spec.load import load_spec


@pytest.fixture
def anti_causal(monkeypatch):
    monkeypatch.setenv("LONGCA_PLUGINS", "anti_causal_mask")
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "plugins"))
    import anti_causal_mask  # noqa: F401  registers on import

    yield PATTERNS["anti_causal"]
    del PATTERNS["anti_causal"]
    sys.modules.pop("anti_causal_mask", None)


def test_a_plugin_mask_is_built_and_given_in_its_forms(anti_causal):
    mask = build_mask("anti_causal", 16)
    assert np.array_equal(mask.dense(), np.triu(np.ones((16, 16), dtype=bool)))
    assert mask.area == 16 * 17 // 2
    assert forms_of("anti_causal") == anti_causal.forms
    intervals = convert(mask, "intervals")
    assert intervals.shape[-1] == 16
    assert list(PATTERNS)[-1] == "anti_causal"  # after the built-in ones


def test_a_plugin_mask_runs_in_a_spec_against_the_reference(anti_causal):
    spec = load_spec(
        text="""
name: plugin
device: cpu
repeat: {warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false}
masks: [anti_causal]
seqlens: [64]
heads: ["2:1"]
head_dims: [16]
dtypes: [float32]
passes: [fwd, bwd]
sweeps: [{name: s, kernels: [naive, flex]}]
"""
    )
    rows = {(c.kernel, c.pass_): run_cell(c)[0] for c in expand(spec)}
    # Flex's backward needs a GPU (the CPU's torch raises NotImplementedError): its refusal says so
    assert rows.pop(("flex", "bwd"))["status"] == "unsupported"
    assert [r["status"] for r in rows.values()] == ["ok"] * 3
    assert all(r["rel_err_out"] < 1e-5 for r in rows.values())
    assert rows[("naive", "bwd")]["rel_err_dq"] < 1e-5
    rows = list(rows.values())
    assert {r["mask_family"] for r in rows} == {"regular"}


def test_a_name_is_registered_once(anti_causal):
    from longca.masks.registry import register

    with pytest.raises(ValueError, match="'anti_causal' registered twice"):
        register(anti_causal)
