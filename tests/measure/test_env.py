"""longca.measure.env: the chosen environment facts a row records."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from longca.measure.env import cpu_model, environment
from longca.store.schema import COLUMNS


def test_the_cpu_model_is_the_first_model_name_of_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n"
    )
    assert cpu_model(info) == "Intel(R) Xeon(R) Platinum 8480C"
    # no model name (some ARM kernels) or no such file: what `platform` knows, else nothing
    info.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")
    assert cpu_model(info) == (platform.processor() or None)
    assert cpu_model(tmp_path / "missing") == (platform.processor() or None)


def test_every_recorded_fact_is_a_result_column_and_the_host_cpu_is_one() -> None:
    facts = environment("cpu")
    assert set(facts) <= set(COLUMNS)  # a chosen list: nothing beside the schema's columns
    assert facts["host_cpu"] == cpu_model()
    assert facts["device"] == "cpu" and facts["env_id"]


@pytest.mark.parametrize(
    "name, card",
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
        ("cpu: x86_64", "cpu"),
    ],
)
def test_rows_of_a_card_go_to_its_set(name, card):
    from longca.measure.env import card_set

    assert card_set(name) == card
