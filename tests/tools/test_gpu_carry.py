"""tools/gpu-carry.sh, run against a local package folder (pip's find-links, no network): it makes
every folder a GPU-host call carries, at the pins of pyproject.toml's `gpu` extra and the versions
installed here, for the host's Python; a second run keeps what exists; a name the extra does not
pin stops it."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOST_DEPENDENCIES = ("jsonschema", "jsonschema-specifications", "referencing", "rpds-py")


def _gpu_pin(name: str) -> str:
    gpu = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    return next(r.split("==", 1)[1] for r in gpu if re.split(r"[\[=<>]", r, maxsplit=1)[0] == name)


def _wheel(index: Path, name: str, version: str, tag: str = "py3-none-any") -> None:
    """A minimal valid wheel of `name` with one module, as pip finds it in a find-links folder."""
    dist = name.replace("-", "_")
    module = "cudnn" if name == "nvidia-cudnn-frontend" else dist
    with zipfile.ZipFile(index / f"{dist}-{version}-{tag}.whl", "w") as whl:
        whl.writestr(f"{module}/__init__.py", f"NAME = {name!r}\n")
        info = f"{dist}-{version}.dist-info"
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        whl.writestr(f"{info}/WHEEL", f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: {tag}\n")
        whl.writestr(f"{info}/RECORD", "")


def _tree(tmp_path: Path, gpu_extra_edit: tuple[str, str] | None = None) -> tuple[Path, dict[str, str]]:
    """A work tree with the script and pyproject.toml, and an environment whose pip finds only a
    local folder holding the wheels the script should pick (and a wrong version of each)."""
    work, index = tmp_path / "tree", tmp_path / "index"
    (work / "tools").mkdir(parents=True)
    index.mkdir()
    shutil.copy(ROOT / "tools" / "gpu-carry.sh", work / "tools")
    pyproject = (ROOT / "pyproject.toml").read_text()
    if gpu_extra_edit:
        assert gpu_extra_edit[0] in pyproject
        pyproject = pyproject.replace(*gpu_extra_edit)
    (work / "pyproject.toml").write_text(pyproject)
    for name in HOST_DEPENDENCIES:
        tag = "cp312-cp312-manylinux_2_17_x86_64" if name == "rpds-py" else "py3-none-any"
        _wheel(index, name, importlib.metadata.version(name), tag)
    _wheel(index, "fla-core", _gpu_pin("fla-core"))
    _wheel(index, "fla-core", "999.0")  # newer than the pin: must not be taken
    _wheel(index, "nvidia-cudnn-frontend", _gpu_pin("nvidia-cudnn-frontend"), "cp312-cp312-manylinux_2_28_x86_64")
    _wheel(index, "nvidia-cudnn-frontend", "1.0.0", "cp311-cp311-manylinux_2_28_x86_64")  # not the host's Python
    packer = tmp_path / "pack-fa4.sh"  # the shared packer downloads 55 MiB: a stand-in that records its calls
    packer.write_text(f'echo "$1" >> {tmp_path / "packer.log"}\necho packed > "$1"\n')
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(index),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    return work, env


def _run(work: Path, env: dict[str, str], packer: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(work / "tools" / "gpu-carry.sh"), str(packer)],
        cwd=work, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_it_makes_every_carried_folder_and_a_second_run_keeps_them(tmp_path: Path) -> None:
    work, env = _tree(tmp_path)
    packer = tmp_path / "pack-fa4.sh"
    done = _run(work, env, packer)
    assert done.returncode == 0, done.stderr
    wheels = sorted(p.name for p in (work / ".whl").iterdir())
    assert wheels == sorted(
        f"{n.replace('-', '_')}-{importlib.metadata.version(n)}-"
        f"{'cp312-cp312-manylinux_2_17_x86_64' if n == 'rpds-py' else 'py3-none-any'}.whl"
        for n in HOST_DEPENDENCIES
    )
    assert [p.name for p in (work / ".whl-linear").iterdir()] == [f"fla_core-{_gpu_pin('fla-core')}-py3-none-any.whl"]
    # the frontend unzipped: its package at the top, as gpu-host.sh puts the folder on PYTHONPATH
    with tarfile.open(work / ".bundles" / "cudnn-frontend.tar.xz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
        module = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("cudnn/__init__.py")))
        assert module is not None and module.read() == b"NAME = 'nvidia-cudnn-frontend'\n"
    assert "cudnn/__init__.py" in names
    assert f"nvidia_cudnn_frontend-{_gpu_pin('nvidia-cudnn-frontend')}.dist-info/METADATA" in names
    assert (work / ".bundles" / "fa4.tar.xz").read_text() == "packed\n"
    assert not list(work.rglob("*.part"))

    stamps = {p: p.stat().st_mtime_ns for p in work.rglob("*") if p.is_file() and "tools" not in p.parts}
    again = _run(work, env, packer)
    assert again.returncode == 0, again.stderr
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert (tmp_path / "packer.log").read_text().splitlines() == [".bundles/fa4.tar.xz"]


def test_a_package_the_gpu_extra_does_not_pin_stops_it(tmp_path: Path) -> None:
    work, env = _tree(tmp_path, gpu_extra_edit=('  "fla-core==0.6.0",\n  "einops",\n  "triton', '  "triton'))
    done = _run(work, env, tmp_path / "pack-fa4.sh")
    assert done.returncode != 0
    assert "gpu-carry: pyproject.toml's gpu extra pins no fla-core" in done.stderr
    assert not (work / ".whl-linear").exists()


def test_a_missing_fa4_packer_is_named(tmp_path: Path) -> None:
    work, env = _tree(tmp_path)
    done = _run(work, env, tmp_path / "no-such-packer.sh")
    assert done.returncode == 2
    assert f"no FlashAttention-4 packer at {tmp_path / 'no-such-packer.sh'}" in done.stderr
    assert (work / ".bundles" / "cudnn-frontend.tar.xz").is_file()  # what could be made was
