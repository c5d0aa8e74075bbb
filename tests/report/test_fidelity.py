"""longca.report.fidelity: timer fidelity checks tabled on the Status page, misses included."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longca.report import fidelity

DENSE = {
    "backward": "retained_graph",
    "budget_s": 2.0,
    "iters": 1000,
    "l2_flush": True,
    "min_iters": 10,
    "warmup": 3,
    "warmup_s": 0.05,
}


def _checks(tmp_path: Path) -> Path:
    cases = [
        # an early check: one round, no protocol recorded (the fixed 5 + 20 calls)
        {
            "kernel": "sdpa_cudnn",
            "mask": "causal",
            "heads": "64:8",
            "seqlen": 32768,
            "longca_median_ms": 28.7,
            "do_bench_median_ms": 29.7,
            "ratio": 0.9665,
        },
        # three rounds under a sweep's protocol, with the matched loop; a kernel name to escape
        {
            "kernel": "<fa4>",
            "mask": "full",
            "heads": "32:32",
            "seqlen": 32768,
            "device": "NVIDIA H200",
            "longca_median_ms": 26.0,
            "do_bench_median_ms": 26.0,
            "ratio": 1.0,
            "ratios": [0.9899, 1.0005, 1.0],
            "matched_ratio": 1.0,
            "protocol": DENSE,
        },
        {"kernel": "fa4", "mask": "causal", "error": "flash_attn.cute not installed"},
    ]
    path = tmp_path / "fidelity.json"
    path.write_text(json.dumps(cases))
    return path


def test_protocol_labels_name_how_longcas_timer_ran() -> None:
    assert fidelity.protocol_label(None) == "fixed: 5 warm-up, 20 timed calls"
    assert fidelity.protocol_label(DENSE) == "warm-up cut at 50 ms, 10-1000 timed calls in 2 s"


def test_cases_become_rows_with_the_goal_judged_on_the_median_ratio(tmp_path: Path) -> None:
    rows = fidelity.load_checks([_checks(tmp_path)], {}).to_dicts()
    early, swept, failed = rows
    assert (early["rounds"], early["worst_round"], early["within_goal"]) == (1, 0.9665, "no")  # 3.35% off
    assert (swept["rounds"], swept["worst_round"], swept["within_goal"]) == (3, 0.9899, "yes")
    assert swept["protocol"].startswith("warm-up cut at 50 ms") and swept["device"] == "NVIDIA H200"
    assert (failed["ratio"], failed["within_goal"], failed["error"]) == (None, None, "flash_attn.cute not installed")
    assert fidelity.summary(fidelity.load_checks([_checks(tmp_path)], {})).endswith(
        "1 of 2 cases within 2% (ratios 0.9665-1.0000, median 0.9832)."
    )


def test_the_status_page_lists_every_check_escaped_and_the_command_names_the_files(tmp_path: Path) -> None:
    from report_rows import write_one_row

    from longca.report import build_report

    write_one_row(tmp_path / "rows.parquet")
    checks = _checks(tmp_path)
    build_report([tmp_path / "rows.parquet"], tmp_path / "site", png=False, fidelity_checks=[checks])
    status = (tmp_path / "site" / "status.html").read_text()
    section = status.split("Timer fidelity")[1]
    assert "&lt;fa4&gt;" in section and "<fa4>" not in status
    assert "0.9665" in section and ">no<" in section and "flash_attn.cute not installed" in section
    assert "--fidelity" in (tmp_path / "site" / "environment.html").read_text()
    build_report([tmp_path / "rows.parquet"], tmp_path / "bare", png=False)
    assert "Timer fidelity" not in (tmp_path / "bare" / "status.html").read_text()  # no checks, no section


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        fidelity.load_checks([tmp_path / "none.json"])


def test_a_parquet_table_of_forward_and_backward_cases_loads_beside_json(tmp_path: Path) -> None:
    import polars as pl

    path = tmp_path / "2026-12-04-abc-fidelity.parquet"
    pl.DataFrame(
        [
            {"kernel": "fa4", "mask": "causal", "heads": "64:8", "seqlen": 1024, "pass": "bwd",
             "longca_median_ms": 0.5, "do_bench_median_ms": 0.49, "ratio": 1.0204, "ratios": [1.0204],
             "protocol": json.dumps(DENSE), "error": None},
            {"kernel": "flex", "mask": "full", "heads": "32:32", "seqlen": 4096, "pass": "fwd",
             "longca_median_ms": None, "do_bench_median_ms": None, "ratio": None, "ratios": None,
             "protocol": None, "error": "RuntimeError: no GPU"},
        ]
    ).write_parquet(path)  # fmt: skip
    rows = fidelity.load_checks([path, _checks(tmp_path)], {}).to_dicts()
    assert [(r["kernel"], r["pass"], r["within_goal"]) for r in rows[:2]] == [
        ("fa4", "bwd", "no"),
        ("flex", "fwd", None),
    ]
    assert rows[0]["protocol"].startswith("warm-up cut at 50 ms") and rows[1]["error"] == "RuntimeError: no GPU"
    assert {r["pass"] for r in rows[2:]} == {"fwd"}  # the earlier JSON checks timed forwards only
