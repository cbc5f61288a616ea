"""The CUDA toolchain's versions outside torch: nvcc's (for extensions built in the session)
and the NVIDIA driver's, read once per process; imported by `environment.code_versions` for a
CUDA item only (a CPU session never starts nvcc nor loads NVML).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

NVCC_TIMEOUT_S = 20.0


def find_nvcc() -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


@functools.cache
def nvcc_version() -> str | None:
    """nvcc's release ("13.0.88" from "Cuda compilation tools, release 13.0, V13.0.88")."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    try:
        out = subprocess.run(
            [nvcc, "--version"],
            capture_output=True,
            text=True,
            timeout=NVCC_TIMEOUT_S,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\bV(\d+(?:\.\d+)+)", out) or re.search(r"release (\d+(?:\.\d+)*)", out)
    return match.group(1) if match else None


@functools.cache
def driver_version() -> str | None:
    """The NVIDIA driver's version: NVML, else /proc/driver/nvidia/version."""
    try:
        import pynvml as nvml

        nvml.nvmlInit()
        try:
            version = nvml.nvmlSystemGetDriverVersion()
        finally:
            nvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else None
