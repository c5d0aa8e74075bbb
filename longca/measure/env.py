"""Environment provenance: a chosen list of facts, never the process environment.

Rows are public: only the facts named here are recorded (GPU, driver, versions, host and its CPU
model, commit).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import torch

# Packages whose versions matter to attention results.
PACKAGES = (
    "torch",
    "triton",
    "flash-attn",
    "flash-attn-4",
    "flash_attn_3",
    "flash-linear-attention",
    "nvidia-cutlass-dsl",
    "numpy",
    "snakemake",
    "longca",
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """The commit of the longca checkout in use (LONGCA_GIT_COMMIT overrides, for copies without .git)."""
    if os.environ.get("LONGCA_GIT_COMMIT"):
        return os.environ["LONGCA_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0:
            dirty = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def _driver() -> str | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        pass
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The host's CPU model: Linux's /proc/cpuinfo `model name`, else what `platform` knows."""
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or None


@functools.cache
def environment(device_type: str) -> dict[str, Any]:
    """Row columns describing where a number was measured."""
    facts: dict[str, Any] = {
        "device": device_type,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "host": socket.gethostname(),
        "host_cpu": cpu_model(),
        "git_commit": git_commit(),
        "longca_version": _version("longca"),
        "packages": json.dumps({p: v for p in PACKAGES if (v := _version(p))}, sort_keys=True),
    }
    if device_type == "cuda" and torch.cuda.is_available():
        idx = torch.cuda.current_device()
        cc = torch.cuda.get_device_capability(idx)
        facts.update(
            {
                "device_name": torch.cuda.get_device_name(idx),
                "device_count": torch.cuda.device_count(),
                "compute_capability": f"{cc[0]}.{cc[1]}",
                "driver": _driver(),
                "cuda": torch.version.cuda,
                "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else None,
            }
        )
    else:
        facts.update(
            {
                "device_name": f"cpu: {platform.processor() or platform.machine()}",
                "device_count": os.cpu_count(),
                "compute_capability": None,
                "driver": None,
                "cuda": None,
                "cudnn": None,
            }
        )
    facts["env_id"] = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return facts


@functools.cache
def _nvml_handle(index: int):
    """NVML initialised once per process (nvmlInit costs tens of milliseconds per call)."""
    import pynvml

    pynvml.nvmlInit()
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def gpu_clock_state() -> dict[str, Any]:
    """SM clock (MHz) and active throttle reasons, where NVML is available."""
    try:
        import pynvml

        h = _nvml_handle(torch.cuda.current_device())
        clock = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        return {"clock_mhz": int(clock), "throttle": hex(int(reasons))}
    except Exception:
        return {}


def card_set(device_name: str) -> str:
    """The result set a device's rows belong to, from its name: the GPU model in lower case
    ("NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA H200" -> "h200", "NVIDIA A100-SXM4-80GB" -> "a100"),
    else the name as a slug ("NVIDIA GeForce RTX 4090" -> "geforce-rtx-4090"), "cpu" for a CPU.
    Sets are by card, so rows of two cards never share one."""
    if device_name.startswith("cpu"):
        return "cpu"
    found = re.search(r"\b([A-Z]{1,3}[0-9]{2,4}[A-Za-z]?)\b", device_name.replace("NVIDIA", " "))
    if found:
        return found.group(1).lower()
    return re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-")


def this_card_set(device_type: str) -> str:
    """`card_set` of this machine's first device of `device_type` ("cuda" or "cpu"); a ValueError
    for "cuda" on a machine without one (no card, so no card's set)."""
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError("results/{card}: this machine has no CUDA GPU, so its rows belong to no card's set")
    return card_set(environment(device_type)["device_name"])
