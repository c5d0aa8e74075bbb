"""longca.report.cp_local: one CP rank's local work (benchmarks/cp_rank_local.py) tabled on the CP page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from longca.report import cp_local


def _runs(tmp_path: Path) -> Path:
    rows = [
        # a forward row as the script writes it (ranks with "ms")
        {
            "rel_err_out": 0.0028,
            "check_seqlen": 4096,
            "mask": "causal",
            "world": 2,
            "tokens_per_gpu": 32768,
            "seqlen": 65536,
            "heads": "64:8",
            "head_dim": 128,
            "mechanism": "ring_p2p",
            "balance": "zigzag",
            "kernel": "sdpa_cudnn",
            "native_gqa": True,
            "ranks": [{"ms": 60.49, "area": 1, "timed_iters": 20}, {"ms": 60.16, "area": 1, "timed_iters": 20}],
            "cp_per_gpu_tflops": 581.7,
            "single_kernel": "sdpa_cudnn",
            "single_tflops": 591.8,
            "ratio": 0.983,
            "status": "ok",
        },
        # a backward row with the autograd figure beside; a mask name to escape
        {
            "rel_err_out": 0.002,
            "rel_err_dq": 0.0025,
            "rel_err_dk": 0.0026,
            "rel_err_dv": 0.0023,
            "mask": "<doc>",
            "world": 2,
            "tokens_per_gpu": 32768,
            "heads": "64:8",
            "mechanism": "ring_p2p",
            "balance": "document",
            "pass": "bwd",
            "kernel": "flex",
            "ranks": [
                {"area": 1, "direct_ms": 54.7, "autograd_ms": 85.2},
                {"area": 1, "direct_ms": 58.2, "autograd_ms": 89.9},
            ],
            "cp_per_gpu_tflops": 330.1,
            "cp_per_gpu_tflops_autograd": 213.9,
            "single_kernel": "flex",
            "single_tflops": 284.5,
            "ratio": 1.16,
            "status": "ok",
        },
        # a configuration that failed its check: no figure
        {"mask": "full", "heads": "64:64", "tokens_per_gpu": 32768, "rel_err_out": 0.5, "status": "incorrect"},
    ]
    path = tmp_path / "cp_local.json"
    path.write_text(json.dumps(rows))
    return path


def test_rows_keep_ranks_figures_and_errors(tmp_path: Path) -> None:
    fwd, bwd, bad = cp_local.load([_runs(tmp_path)], {}).to_dicts()
    assert (fwd["pass"], fwd["rank_ms"], fwd["cp_per_gpu_tflops_autograd"]) == ("fwd", "60.49, 60.16", None)
    assert (bwd["pass"], bwd["rank_ms"], bwd["cp_per_gpu_tflops_autograd"]) == ("bwd", "54.70, 58.20", 213.9)
    assert bwd["max_rel_err"] == 0.0026
    assert (bad["status"], bad["rank_ms"], bad["cp_per_gpu_tflops"], bad["max_rel_err"]) == (
        "incorrect",
        None,
        None,
        0.5,
    )


def test_the_cp_page_tables_the_runs_escaped_and_the_command_names_the_files(tmp_path: Path) -> None:
    from report_rows import write_one_row

    from longca.report import build_report

    write_one_row(tmp_path / "rows.parquet")
    build_report([tmp_path / "rows.parquet"], tmp_path / "site", png=False, cp_local_runs=[_runs(tmp_path)])
    page = (tmp_path / "site" / "cp.html").read_text()
    section = page.split("local work on one GPU</h2>")[1]
    assert "&lt;doc&gt;" in section and "<doc>" not in page
    assert "213.9" in section and "54.70, 58.20" in section and "incorrect" in section
    assert "--cp-local" in (tmp_path / "site" / "environment.html").read_text()
    build_report([tmp_path / "rows.parquet"], tmp_path / "bare", png=False)
    assert "local work on one GPU" not in (tmp_path / "bare" / "cp.html").read_text()  # no runs, no section


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        cp_local.load([tmp_path / "none.json"])
