"""The versions that change the code a kernel runs: torch, Triton, the CUDA runtime torch was
built with, cuDNN, the CUDA compiler (nvcc, for extensions built in the session) and the
NVIDIA driver (it compiles PTX to machine code).

Each is read once per process (nvcc is a subprocess) and left out when this process has no
such thing (a CPU-only torch has no CUDA runtime; triton is read only when installed). The
record keeps them (`KernelRecord.environment`), the baseline keeps them per entry, and
`gate/environment.py` names the ones that differ when a kernel regressed.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
from pathlib import Path

NVCC_TIMEOUT_S = 20.0


@functools.cache
def _torch_versions() -> dict[str, str]:
    try:
        import torch
    except ImportError:
        return {}
    out = {"torch": str(torch.__version__)}
    if torch.version.cuda:
        out["cuda_runtime"] = str(torch.version.cuda)
    hip = getattr(torch.version, "hip", None)
    if hip:
        out["hip_runtime"] = str(hip)
    try:
        cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        cudnn = None
    if cudnn:
        out["cudnn"] = str(cudnn)
    return out


@functools.cache
def _triton_version() -> str | None:
    try:
        return importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        return None


def _find_nvcc() -> str | None:
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
def _nvcc_version() -> str | None:
    """nvcc's release ("13.0.88" from "Cuda compilation tools, release 13.0, V13.0.88")."""
    nvcc = _find_nvcc()
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
def _driver_version() -> str | None:
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


def code_versions(device_kind: str) -> dict[str, str]:
    """The versions that change the code an item runs on `device_kind` ("cuda"/"cpu"):
    torch and Triton always (when present); the CUDA runtime, cuDNN, nvcc and the driver on
    a CUDA device."""
    torch_versions = _torch_versions()
    out = {"torch": torch_versions["torch"]} if "torch" in torch_versions else {}
    triton = _triton_version()
    if triton:
        out["triton"] = triton
    if device_kind == "cuda":
        for name in ("cuda_runtime", "hip_runtime", "cudnn"):
            if name in torch_versions:
                out[name] = torch_versions[name]
        nvcc = _nvcc_version()
        if nvcc:
            out["nvcc"] = nvcc
        driver = _driver_version()
        if driver:
            out["driver"] = driver
    return out
