"""Full-length agreement (check.agree_with): cells longer than the check length compare each draw's
output with a second kernel's at their own length; a disagreement makes the row incorrect."""

import pytest
import torch

from longca.measure.reference import error_ratio, error_sums, relative_error
from longca.run.cell import run_cell
from longca.spec.cells import expand
from longca.spec.load import SpecError, load_spec
from longca.store.schema import COLUMNS


def spec(
    kernels,
    agree="[naive, sdpa_math]",
    seqlens="[64, 192]",
    masks="[full]",
    dtypes="[float32]",
    passes="[fwd]",
    heads='["2:1"]',
):
    agree_line = f", agree_with: {agree}" if agree else ""
    return load_spec(
        text=f"""
name: t
device: cpu
repeat: {{warmup: 1, iters: 3, min_iters: 1, budget_s: 0.2, l2_flush: false}}
check: {{max_seqlen: 128{agree_line}}}
mask_samples: {{multi_document: 2, single: 1}}
kernels: {kernels}
masks: {masks}
seqlens: {seqlens}
heads: {heads}
head_dims: [16]
dtypes: {dtypes}
passes: {passes}
sweeps: [{{name: s}}]
"""
    )


def _cell(s, kernel, seqlen, pass_="fwd"):
    return next(c for c in expand(s) if c.kernel == kernel and c.seqlen == seqlen and c.pass_ == pass_)


def test_a_long_cell_is_compared_with_the_first_other_listed_kernel():
    s = spec("[sdpa_math, naive]")
    math_rows = run_cell(_cell(s, "sdpa_math", 192))
    naive_rows = run_cell(_cell(s, "naive", 192))
    assert [r["status"] for r in math_rows + naive_rows] == ["ok", "ok"]
    assert math_rows[0]["agree_kernel"] == "naive"  # the first listed that is not itself
    assert naive_rows[0]["agree_kernel"] == "sdpa_math"
    for r in math_rows + naive_rows:
        assert 0 <= r["agree_rel_diff"] < 1e-5
        assert r["check_seqlen"] == 128


def test_cells_within_the_check_length_carry_no_agreement_and_keep_their_digest():
    with_agree = _cell(spec("[sdpa_math]"), "sdpa_math", 64)
    without = _cell(spec("[sdpa_math]", agree=None), "sdpa_math", 64)
    assert with_agree.digest == without.digest  # asking for agreement re-measures only long cells
    assert (
        _cell(spec("[sdpa_math]"), "sdpa_math", 192).digest
        != _cell(spec("[sdpa_math]", agree=None), "sdpa_math", 192).digest
    )
    (row,) = run_cell(with_agree)
    assert row["status"] == "ok" and row.get("agree_kernel") is None and row.get("agree_reason") is None


def test_a_kernel_wrong_only_beyond_the_check_length_is_incorrect(plugin_env):
    s = spec("[test_wrong_long]")
    short, long_ = _cell(s, "test_wrong_long", 64), _cell(s, "test_wrong_long", 192)
    assert run_cell(short)[0]["status"] == "ok"
    (row,) = run_cell(long_)
    assert row["status"] == "incorrect"
    assert row["rel_err_out"] < 1e-5  # the check at 128 tokens passed: only agreement saw it
    assert row["agree_kernel"] == "naive" and row["agree_rel_diff"] == pytest.approx(0.05, rel=1e-3)
    assert "disagrees with naive at the full length S=192" in row["reason"]
    assert row.get("median_ms") is None and row.get("tflops") is None  # a wrong result is never a speed
    assert set(row) <= set(COLUMNS) | {"_kernel_s"}  # every key a result column
    # without agreement the same cell passes: what the check alone misses
    (unchecked,) = run_cell(_cell(spec("[test_wrong_long]", agree=None), "test_wrong_long", 192))
    assert unchecked["status"] == "ok"


def test_a_backward_cell_compares_the_gradients_too():
    s = spec("[sdpa_math, naive]", passes="[fwd, bwd]")
    (fwd,) = run_cell(_cell(s, "sdpa_math", 192))
    (bwd,) = run_cell(_cell(s, "sdpa_math", 192, "bwd"))
    assert fwd["status"] == bwd["status"] == "ok" and fwd["agree_kernel"] == bwd["agree_kernel"] == "naive"
    assert all(fwd.get(f"agree_rel_diff_{g}") is None for g in ("dq", "dk", "dv"))  # a forward times no gradients
    for g in ("dq", "dk", "dv"):
        assert 0 <= bwd[f"agree_rel_diff_{g}"] < 1e-5
    assert 0 <= bwd["agree_rel_diff"] < 1e-5


def test_a_kernel_whose_gradients_are_wrong_only_beyond_the_check_length_is_incorrect(plugin_env):
    s = spec("[test_wrong_grad_long]", passes="[fwd, bwd]")
    assert run_cell(_cell(s, "test_wrong_grad_long", 64, "bwd"))[0]["status"] == "ok"  # right where checked
    (fwd,) = run_cell(_cell(s, "test_wrong_grad_long", 192))
    assert fwd["status"] == "ok" and fwd["agree_rel_diff"] < 1e-5  # its output is right at every length
    (row,) = run_cell(_cell(s, "test_wrong_grad_long", 192, "bwd"))
    assert row["status"] == "incorrect"
    assert row["rel_err_dq"] < 1e-5  # the check at 128 tokens passed: only agreement saw it
    assert row["agree_kernel"] == "naive" and row["agree_rel_diff"] < 1e-5
    assert row["agree_rel_diff_dq"] == pytest.approx(0.05, rel=1e-3)  # ||1.05 g - g|| / ||g||
    assert row["agree_rel_diff_dk"] < 1e-5 and row["agree_rel_diff_dv"] < 1e-5
    assert "disagrees with naive at the full length S=192" in row["reason"] and "dq=" in row["reason"]
    assert row.get("median_ms") is None and row.get("tflops") is None  # a wrong result is never a speed
    assert set(row) <= set(COLUMNS) | {"_kernel_s"}  # every key a result column


def test_only_backward_cells_beyond_the_check_length_change_digest_for_gradient_agreement():
    s = spec("[sdpa_math]", passes="[fwd, bwd]")
    assert _cell(s, "sdpa_math", 192, "bwd").check_dict["agree_gradients"] is True
    assert "agree_gradients" not in _cell(s, "sdpa_math", 192).check_dict  # forward cells keep their digests
    assert "agree_gradients" not in _cell(s, "sdpa_math", 64, "bwd").check_dict  # no agreement within
    assert (
        "agree_gradients"
        not in _cell(spec("[sdpa_math]", agree=None, passes="[bwd]"), "sdpa_math", 192, "bwd").check_dict
    )


def test_long_cells_share_the_check_of_their_shape(plugin_env):
    from longca.run.cell import CellCaches

    s = spec("[sdpa_math]", seqlens="[128, 192]", passes="[fwd, bwd]")
    caches = CellCaches()
    (bwd,) = run_cell(_cell(s, "sdpa_math", 192, "bwd"), caches)
    (fwd,) = run_cell(_cell(s, "sdpa_math", 192), caches)
    (within,) = run_cell(_cell(s, "sdpa_math", 128, "bwd"), caches)  # no agreement keys, the same check
    assert bwd["check_s"] > 0 and fwd["check_s"] == within["check_s"] == 0.0
    assert fwd["rel_err_out"] == bwd["rel_err_out"] == within["rel_err_out"]


def test_a_failing_comparator_is_passed_over_for_the_next(plugin_env):
    (row,) = run_cell(_cell(spec("[sdpa_math]", agree="[test_raise, naive]"), "sdpa_math", 192))
    assert row["status"] == "ok" and row["agree_kernel"] == "naive"


def test_no_serving_comparator_leaves_the_reason(plugin_env):
    (row,) = run_cell(_cell(spec("[sdpa_math]", agree="[test_raise]"), "sdpa_math", 192))
    assert row["status"] == "ok" and row.get("agree_kernel") is None
    assert "test_raise: RuntimeError: deliberate failure inside the kernel" in row["agree_reason"]
    (row,) = run_cell(_cell(spec("[sdpa_math]", agree="[sdpa_math]"), "sdpa_math", 192))
    assert row["agree_reason"] == "no second kernel serves this cell: none listed"
    (row,) = run_cell(_cell(spec("[sdpa_math]", agree="[fa4]"), "sdpa_math", 192))
    assert row["agree_reason"].startswith("no second kernel serves this cell: fa4: kernel runs on ['cuda']")


@pytest.mark.parametrize("heads", ["8:4", "8:8"])
def test_a_comparator_out_of_memory_runs_over_head_groups_to_the_same_differences(plugin_env, heads, capfd):
    # test_oom_wide is naive but runs out of memory with more than 2 heads a call: it serves over
    # 4 (8:4) or 8 (8:8) head groups, and the differences are those of naive on all heads at once.
    # float64, so that the two sums of the same numbers agree to rounding.
    s = spec("[sdpa_math]", agree="[test_oom_wide, naive]", passes="[bwd]", dtypes="[float64]", heads=f'["{heads}"]')
    s_naive = spec("[sdpa_math]", agree="[naive]", passes="[bwd]", dtypes="[float64]", heads=f'["{heads}"]')
    (row,) = run_cell(_cell(s, "sdpa_math", 192, "bwd"))
    (whole,) = run_cell(_cell(s_naive, "sdpa_math", 192, "bwd"))
    groups = {"8:4": 4, "8:8": 4}[heads]  # 2 query heads a call
    assert f"test_oom_wide compared over {groups} head groups (fewer ran out of memory)" in capfd.readouterr().err
    assert row["status"] == whole["status"] == "ok" and row["agree_kernel"] == "test_oom_wide"
    for name in ("agree_rel_diff", "agree_rel_diff_dq", "agree_rel_diff_dk", "agree_rel_diff_dv"):
        assert 0 < row[name] < 1e-5 and row[name] == pytest.approx(whole[name], rel=1e-9), name


def test_a_comparator_out_of_memory_at_every_grouping_is_passed_over(plugin_env):
    s = spec("[sdpa_math]", agree="[test_oom, naive]", heads='["4:2"]')
    (row,) = run_cell(_cell(s, "sdpa_math", 192))
    assert row["status"] == "ok" and row["agree_kernel"] == "naive"
    (row,) = run_cell(_cell(spec("[sdpa_math]", agree="[test_oom]", heads='["4:2"]'), "sdpa_math", 192))
    assert "test_oom: OutOfMemoryError: CUDA out of memory" in row["agree_reason"]


def test_head_groups_keep_each_query_head_with_its_kv_head():
    from longca.masks.registry import build_mask
    from longca.run.agreement import head_groups

    cell = _cell(spec("[sdpa_math]", heads='["8:4"]'), "sdpa_math", 192)
    assert head_groups(cell, build_mask("full", 192)) == [1, 2, 4]
    per_head = build_mask("block_sparse", 256, heads_kv=4)
    assert per_head.per_head and head_groups(cell, per_head) == [1]  # a layout per KV head runs whole


LINEAR_AGREE = "[naive, fla_gla_recurrent, test_simple_gla_recurrent, test_simple_gla_chunk]"


def test_a_linear_cell_keeps_only_the_comparators_of_its_own_function(plugin_env):
    """A softmax kernel cannot check simple GLA, nor can GLA's recurrent kernel: the cell's check keeps
    only the listed kernels that compute simple GLA, and a softmax cell only the softmax ones, so
    listing comparators of another function changes no cell's digest."""
    s = spec("[test_simple_gla_chunk, naive]", agree=LINEAR_AGREE, masks="[causal]", passes="[fwd, bwd]")
    linear = _cell(s, "test_simple_gla_chunk", 192, "bwd")
    assert linear.check_dict["agree_with"] == ["test_simple_gla_recurrent", "test_simple_gla_chunk"]
    assert linear.check_dict["agree_gradients"] is True
    softmax = _cell(s, "naive", 192)
    assert softmax.check_dict["agree_with"] == ["naive"]
    alone = spec("[naive]", agree="[naive]", masks="[causal]", passes="[fwd, bwd]")
    assert softmax.digest == _cell(alone, "naive", 192).digest
    # no comparator of its function listed: no agreement, the digest of a spec that asks for none
    unlisted = _cell(spec("[test_simple_gla_chunk]", agree="[naive]", masks="[causal]"), "test_simple_gla_chunk", 192)
    assert "agree_with" not in unlisted.check_dict
    assert (
        unlisted.digest
        == _cell(spec("[test_simple_gla_chunk]", agree=None, masks="[causal]"), "test_simple_gla_chunk", 192).digest
    )


def test_a_linear_cell_is_compared_with_its_recurrent_form(plugin_env):
    """fla's chunked kernel (here its CPU stand-in, through the real adapter) against the recurrent one
    of its family, with the same gates: output and gradients at the full length."""
    s = spec("[test_simple_gla_chunk]", agree=LINEAR_AGREE, masks="[causal]", passes="[fwd, bwd]")
    for pass_ in ("fwd", "bwd"):
        (row,) = run_cell(_cell(s, "test_simple_gla_chunk", 192, pass_))
        assert row["status"] == "ok", row.get("reason")
        assert row["agree_kernel"] == "test_simple_gla_recurrent" and row["kernel_family"] == "linear"
        assert row["check_seqlen"] == 128 and 0 <= row["agree_rel_diff"] < 1e-5
        for g in ("dq", "dk", "dv"):
            assert (row.get(f"agree_rel_diff_{g}") is None) == (pass_ == "fwd")
            assert pass_ == "fwd" or 0 <= row[f"agree_rel_diff_{g}"] < 1e-5


def test_a_linear_kernel_wrong_only_beyond_the_check_length_is_incorrect(plugin_env):
    s = spec("[test_simple_gla_wrong_long]", agree=LINEAR_AGREE, masks="[causal]")
    assert run_cell(_cell(s, "test_simple_gla_wrong_long", 64))[0]["status"] == "ok"
    (row,) = run_cell(_cell(s, "test_simple_gla_wrong_long", 192))
    assert row["status"] == "incorrect" and row["rel_err_out"] < 1e-5  # the check at 128 tokens passed
    assert row["agree_kernel"] == "test_simple_gla_recurrent"
    assert row["agree_rel_diff"] == pytest.approx(0.05, rel=1e-3)


def test_a_hand_made_cell_names_the_comparators_of_another_function(plugin_env):
    import dataclasses
    import json

    from longca.run.agreement import candidates

    cell = _cell(spec("[test_simple_gla_chunk]", agree=LINEAR_AGREE, masks="[causal]"), "test_simple_gla_chunk", 192)
    check = {**cell.check_dict, "agree_with": ["naive", "fla_gla_recurrent", "test_simple_gla_recurrent"]}
    usable, why = candidates(dataclasses.replace(cell, check=json.dumps(check)), torch.device("cpu"))
    assert [c.kernel for c in usable] == ["test_simple_gla_recurrent"]
    assert why == ["naive: computes softmax, not simple_gla", "fla_gla_recurrent: computes gla, not simple_gla"]


def test_unknown_agreement_kernel_is_named_before_anything_runs():
    with pytest.raises(SpecError) as e:
        spec("[sdpa_math]", agree="[naive, fa5]")
    assert "check.agree_with.1" in str(e.value) and "'fa5'" in str(e.value) and "allowed:" in str(e.value)


def test_relative_error_in_slices_equals_the_whole():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 100, 3, 8, generator=g, dtype=torch.float64)
    ref = x + 1e-3 * torch.randn(2, 100, 3, 8, generator=g, dtype=torch.float64)
    whole = (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()
    for chunk in (1, 24, 1000, 1 << 24):
        assert relative_error(x, ref, chunk_elems=chunk) == pytest.approx(whole, rel=1e-12)
    x[1, 99, 2, 7] = float("nan")
    assert relative_error(x, ref, chunk_elems=24) == float("inf")
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(x, ref[:, :50])


def test_error_sums_of_head_groups_add_up_to_the_whole():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 50, 8, 4, generator=g, dtype=torch.float64)
    ref = x + 1e-3 * torch.randn(2, 50, 8, 4, generator=g, dtype=torch.float64)
    parts = [error_sums(x[:, :, h : h + 2], ref[:, :, h : h + 2], chunk_elems=16) for h in range(0, 8, 2)]
    summed = error_ratio(sum(p[0] for p in parts), sum(p[1] for p in parts))
    assert summed == pytest.approx(relative_error(x, ref), rel=1e-12)
    x[0, 0, 5, 0] = float("inf")
    parts = [error_sums(x[:, :, h : h + 2], ref[:, :, h : h + 2]) for h in range(0, 8, 2)]
    assert error_ratio(sum(p[0] for p in parts), sum(p[1] for p in parts)) == float("inf")
    assert error_ratio(0.0, 0.0) == 0.0 and error_ratio(4.0, 0.0) == 2.0  # a zero reference: the norm


def _counting_differences(monkeypatch):
    """Which comparators actually ran (longca.run.agreement._differences), in order."""
    import longca.run.agreement as agreement

    ran: list[str] = []
    real = agreement._differences

    def counted(cell, other, *args, **kwargs):
        ran.append(other.kernel)
        return real(cell, other, *args, **kwargs)

    monkeypatch.setattr(agreement, "_differences", counted)
    return ran


@pytest.mark.parametrize("pass_", ["fwd", "bwd"])
def test_one_comparator_run_serves_every_kernel_of_a_problem_and_draw(monkeypatch, pass_):
    from longca.run.cell import CellCaches

    ran = _counting_differences(monkeypatch)
    s = spec("[sdpa_flash, sdpa_math, naive]", passes=f"[{pass_}]")
    alone = {k: run_cell(_cell(s, k, 192, pass_))[0] for k in ("sdpa_flash", "sdpa_math", "naive")}
    assert ran == ["naive", "naive", "sdpa_math"]  # each cell on its own runs its comparator
    ran.clear()
    caches = CellCaches()
    shared = {k: run_cell(_cell(s, k, 192, pass_), caches)[0] for k in ("sdpa_flash", "sdpa_math", "naive")}
    # sdpa_flash runs naive; sdpa_math takes that run's results; naive takes sdpa_math's own
    # results, kept because sdpa_math is a listed comparator whose results agreed with naive's
    assert ran == ["naive"]
    names = ["agree_rel_diff"] + ([f"agree_rel_diff_{g}" for g in ("dq", "dk", "dv")] if pass_ == "bwd" else [])
    for k, row in shared.items():
        assert row["status"] == "ok" and row["agree_kernel"] == alone[k]["agree_kernel"]
        for name in names:
            assert row[name] == pytest.approx(alone[k][name], rel=1e-6, abs=1e-12), (k, name)


def test_kept_results_are_per_draw_and_a_backward_cell_does_not_take_outputs_alone(monkeypatch):
    from longca.run.cell import CellCaches

    ran = _counting_differences(monkeypatch)
    s = spec("[sdpa_flash, sdpa_math]", agree="[naive]", masks="[causal_document]", passes="[fwd, bwd]")
    caches = CellCaches()
    rows = [
        r for k in ("sdpa_math", "sdpa_flash") for p in ("fwd", "bwd") for r in run_cell(_cell(s, k, 192, p), caches)
    ]
    assert [r["status"] for r in rows].count("unsupported") == 2  # sdpa_flash takes no document mask
    # sdpa_math: two draws forward (outputs), then two backward (outputs kept lack gradients)
    assert ran == ["naive", "naive", "naive", "naive"]


def test_a_disagreeing_kernel_leaves_no_results_for_others(plugin_env):
    from longca.run.agreement import results_key
    from longca.run.cell import CellCaches

    s = spec("[test_wrong_long]", agree="[test_wrong_long, naive]")
    cell = _cell(s, "test_wrong_long", 192)
    caches = CellCaches()
    assert run_cell(cell, caches)[0]["status"] == "incorrect"
    device = torch.device("cpu")
    assert caches.agreements.host(results_key(cell, "naive", cell.dtype, 0, device), False) is not None
    assert caches.agreements.host(results_key(cell, "test_wrong_long", cell.dtype, 0, device), False) is None


@pytest.mark.parametrize("seqlen, warmups", [(64, 1), (192, 0)])
def test_the_agreement_call_is_the_warm_up(monkeypatch, seqlen, warmups):
    """A cell with a full-length agreement has just run its call at its shape: the timer adds no
    warm-up (at 512K one is a 40 s call); the row still counts that one call as its warm-up."""
    import longca.run.cell as cell_mod

    asked: list[int] = []
    real = cell_mod.time_under

    def spy(timer, fn, repeat, before=None):
        asked.append(repeat["warmup"])
        return real(timer, fn, repeat, before)

    monkeypatch.setattr(cell_mod, "time_under", spy)
    s = spec("[sdpa_math]", passes="[bwd]")
    (row,) = run_cell(_cell(s, "sdpa_math", seqlen, "bwd"))
    assert row["status"] == "ok" and asked == [warmups]
    assert row["warmup_iters"] == 1 and row["warmup_s"] > 0
