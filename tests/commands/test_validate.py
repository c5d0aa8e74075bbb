"""`longca validate --gpu`: the spec's `gpu_model` checked against this machine's GPUs, as `longca
run` checks it before its first cell (tools/gpu-host.sh calls it before its set-up)."""

from __future__ import annotations

from pathlib import Path

import longca.run.chunk as chunk
from longca.cli import main

SPEC = Path("specs/default.yaml").read_text().replace("\ndevice: cpu\n", "\ndevice: cuda\ngpu_model: H200\n", 1)


def test_validate_gpu_checks_the_model_only_when_asked(tmp_path: Path, capsys, monkeypatch) -> None:
    path = tmp_path / "cuda.yaml"
    path.write_text(SPEC)
    monkeypatch.setattr(chunk, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"])
    assert main(["validate", str(path)]) == 0  # the spec itself is valid
    assert main(["validate", "--gpu", str(path)]) == 2
    err = capsys.readouterr().err
    assert "spec field 'gpu_model': 'H200' is not in this machine's GPU name(s) ['NVIDIA H100 80GB HBM3']" in err
    monkeypatch.setattr(chunk, "gpu_names", lambda: ["NVIDIA H200"])
    assert main(["validate", "--gpu", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith("cells) for this machine's GPUs")
