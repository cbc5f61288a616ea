"""The environment a sandboxed process gets: an allow-list of variable names, minus every
name that looks like a credential (a candidate must see no secret of the session)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_kernelpro.text_safety import is_secret_name

__all__ = ["PACKAGE_ROOT", "SAFE_NAMES", "SAFE_PREFIXES", "is_secret_name", "scrub_environment"]

PACKAGE_ROOT = Path(__file__).resolve().parents[3]  # the directory holding pytest_kernelpro/

# Variables a build and a kernel need. Everything else is dropped, and these too when the
# name looks like a secret.
SAFE_NAMES = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "TMPDIR",
        "TMP",
        "TEMP",
        "PYTHONPATH",
        "PYTHONHASHSEED",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "LD_LIBRARY_PATH",
        "LIBRARY_PATH",
        "CPATH",
        "C_INCLUDE_PATH",
        "CPLUS_INCLUDE_PATH",
        "CC",
        "CXX",
        "CUDAHOSTCXX",
        "MAX_JOBS",
        "CUTLASS_PATH",
        "MALLOC_ARENA_MAX",
        "OPENBLAS_NUM_THREADS",
    }
)
SAFE_PREFIXES = (
    "CUDA_",
    "CUDNN_",
    "NVIDIA_",
    "NCCL_",
    "NVCC_",
    "TORCH_",
    "PYTORCH_",
    "TRITON_",
    "LC_",
    "OMP_",
    "MKL_",
    "KMP_",
    "XDG_",
    "KERNELPRO_",
)


def scrub_environment(env: Mapping[str, str], keep: Sequence[str] = ()) -> dict[str, str]:
    """The worker's environment: allow-listed names (plus `keep`), minus anything secret."""
    kept = set(keep)
    return {
        name: value
        for name, value in env.items()
        if (name in SAFE_NAMES or name.startswith(SAFE_PREFIXES) or name in kept)
        and not is_secret_name(name)
    }
