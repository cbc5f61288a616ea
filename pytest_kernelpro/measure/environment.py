"""What changes the code a kernel runs besides its source: the toolchain's versions
(`code_versions`), the process's library algorithm settings (`library_choices`), and the
autotuners the process has loaded (`autotuner_classes`; what they choose is recorded, and
the baseline's choices pinned, by `measure/autotune_capture.py`).

The versions (torch, Triton, the CUDA runtime torch was built with, cuDNN, and nvcc's and
the driver's from `cuda_versions.py`) are read once per process, each left out where this
process has no such thing; the record and the baseline keep them, and
`gate/verdict.py` names the ones that differ when a kernel regressed. The settings
are those that change results or speed: cuDNN's benchmark mode, deterministic algorithms,
TF32 and reduced-precision reductions, the float32 matmul precision, the preferred BLAS.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import math
import operator
import sys
import warnings
from collections.abc import Iterable
from typing import Any


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
        from pytest_kernelpro.measure.cuda_versions import driver_version, nvcc_version

        for name, version in (("nvcc", nvcc_version()), ("driver", driver_version())):
            if version:
                out[name] = version
    return out


# ----- the autotuners this process has loaded -----

# Autotuner classes found by module and class name when their module is loaded (a kernel
# that launches Triton has imported it).
KNOWN_AUTOTUNERS = (("triton.runtime.autotuner", "Autotuner"),)


def json_value(value: Any) -> Any:
    """A key element or config value as JSON: numbers, strings, booleans and None as they
    are (non-finite floats as text), anything else as its `str` (a dtype: "torch.float16")."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value)


def autotuner_classes(extra: Iterable[type] = ()) -> list[type]:
    """The autotuner classes to watch: Triton's when its module is loaded, then `extra`."""
    found: list[type] = []
    for module_name, class_name in KNOWN_AUTOTUNERS:
        module = sys.modules.get(module_name)
        cls = getattr(module, class_name, None) if module is not None else None
        if isinstance(cls, type):
            found.append(cls)
    for cls in extra:
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return found


def load_triton_if_used(language: str) -> None:
    """Import Triton's autotuner for a Triton item that has not imported it yet (a kernel
    that imports triton lazily, at its first call); nothing when triton is not installed."""
    if language != "triton" or "triton.runtime.autotuner" in sys.modules:
        return
    with contextlib.suppress(Exception):
        importlib.import_module("triton.runtime.autotuner")


def library_choices() -> dict[str, Any]:
    """The library settings that choose algorithms (and so results and speed) in this
    process; a setting this torch does not have is left out."""
    try:
        import torch
    except ImportError:
        return {}
    out: dict[str, Any] = {}
    # torch's attribute paths ("()": called), read by `operator.attrgetter` (C, no frames).
    readers = {
        "cudnn.benchmark": "backends.cudnn.benchmark",
        "cudnn.deterministic": "backends.cudnn.deterministic",
        "cudnn.allow_tf32": "backends.cudnn.allow_tf32",
        "cuda.matmul.allow_tf32": "backends.cuda.matmul.allow_tf32",
        "cuda.matmul.allow_fp16_reduced_precision_reduction": (
            "backends.cuda.matmul.allow_fp16_reduced_precision_reduction"
        ),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": (
            "backends.cuda.matmul.allow_bf16_reduced_precision_reduction"
        ),
        "float32_matmul_precision": "get_float32_matmul_precision()",
        "deterministic_algorithms": "are_deterministic_algorithms_enabled()",
        "preferred_blas_library": "backends.cuda.preferred_blas_library()",
    }
    for name, path in readers.items():
        # Some of these accessors are deprecated in newer torch: reading one must not warn.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                value = operator.attrgetter(path.removesuffix("()"))(torch)
                if path.endswith("()"):
                    value = value()
            except Exception:
                continue
        value = getattr(value, "name", value)  # an enum by its name
        # Flags and names are JSON as they are (most readings); the rest via `json_value`.
        out[name] = value if type(value) in (bool, str) else json_value(value)
    return out
