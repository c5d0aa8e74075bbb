import os
import shutil
import sys
from pathlib import Path

# Without an NVIDIA GPU, Triton kernels run through Triton's interpreter. The switch is read when
# triton is first imported, and other tests (fla, flex) import it early: set it before anything.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = ROOT / "tests" / "plugins"
sys.path.insert(0, str(ROOT / "tests" / "support"))  # helpers the tests and their spawned ranks import


@pytest.fixture
def plugin_env(monkeypatch):
    """Register the deliberately broken kernels (tests only) in this process and in workers."""
    monkeypatch.setenv("LONGCA_PLUGINS", "faulty_kernels")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")]))
    if str(PLUGINS) not in sys.path:
        sys.path.insert(0, str(PLUGINS))
    import faulty_kernels  # noqa: F401  registers on import

    import longca.kernels.registry as reg

    yield
    for name in list(reg.KERNELS):
        if name.startswith("test_"):
            del reg.KERNELS[name]
    sys.modules.pop("faulty_kernels", None)


@pytest.fixture
def stopped_chunk(tmp_path):
    """run(spec, outputs, results, ready, env=None, settle_s=0): run_chunk in a subprocess, SIGTERM
    it once ready() holds (and settle_s more), and return (its exit code, its stderr)."""
    import signal
    import subprocess
    import time

    def run(spec, outputs, results, ready, env=None, settle_s=0.0, ready_s=90.0):
        code = (
            f"from longca.run.chunk import run_chunk; "
            f"from longca.spec.load import load_spec; "
            f"run_chunk(load_spec({str(spec)!r}), {[str(o) for o in outputs]!r}, {str(results)!r})"
        )
        err_path = tmp_path / "stderr.txt"
        with open(err_path, "w") as err_file:
            proc = subprocess.Popen([sys.executable, "-c", code], env=env or dict(os.environ), stderr=err_file)
        try:
            end = time.monotonic() + ready_s
            while not ready() and time.monotonic() < end and proc.poll() is None:
                time.sleep(0.2)
            assert ready(), proc.poll()
            time.sleep(settle_s)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, err_path.read_text()

    return run


def _copy_workflow(dest: Path) -> Path:
    """The files a README command reads (Snakefile, workflow, profiles, specs) copied into a new
    folder `dest`, so that the command writes there, not into the repository."""
    dest.mkdir(parents=True)
    for name in ("Snakefile", "workflow", "profiles", "specs"):
        src = ROOT / name
        shutil.copytree(src, dest / name) if src.is_dir() else shutil.copy(src, dest / name)
    return dest


@pytest.fixture(scope="session")
def copy_workflow():
    """`_copy_workflow` for test modules (which cannot import this file)."""
    return _copy_workflow


@pytest.fixture(scope="session")
def default_local_run(tmp_path_factory):
    """The README's first command after its installs, `snakemake --cores 2` (the embedded default
    spec), run once per session in a copy of the workflow: (its folder, the finished process).

    The README test checks its rows and report; the SLURM test compares its own run of the same
    spec with these rows. About 85 s of two cores, so it runs once: with the tests on several
    workers (pytest-xdist), its users share the xdist group "default_run", so one worker runs it."""
    import subprocess

    work = _copy_workflow(tmp_path_factory.mktemp("default-run") / "repo")
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2"], cwd=work, capture_output=True, text=True, timeout=1200
    )
    return work, proc


def _live_processes(marker: str, name: str = "longca") -> dict[int, str]:
    """Live processes (not zombies) whose command line names both `marker` (a run's own folder: its
    job files live there) and `name`, by pid, with their command lines (cut to 200 characters)."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = Path("/proc", entry.name, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path("/proc", entry.name, "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and marker in cmd and name in cmd:
            found[int(entry.name)] = cmd[:200]
    return found


@pytest.fixture
def live_processes():
    """`_live_processes(marker, name="longca")`: what of a run is still alive (Linux's /proc)."""
    return _live_processes
