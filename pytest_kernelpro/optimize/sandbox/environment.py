"""The environment a sandboxed process gets: an allow-list of variable names, minus every
name that looks like a credential (a candidate must see no secret of the session)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding pytest_kernelpro/

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
_SECRET_WORDS = re.compile(
    r"API_?KEY|TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|AUTH|SESSION|COOKIE|ACCESS_?KEY",
    re.IGNORECASE,
)
_SECRET_PREFIXES = (
    "ANTHROPIC_",
    "OPENAI_",
    "AWS_",
    "AZURE_",
    "GOOGLE_",
    "GCP_",
    "GH_",
    "GITHUB_",
    "GITLAB_",
    "HF_",
    "HUGGING",
    "WANDB_",
    "SSH_",
    "GPG_",
    "NPM_",
    "PYPI_",
    "TWINE_",
    "DOCKER_",
    "SLACK_",
    "CI_JOB_",
)


def is_secret_name(name: str) -> bool:
    """True for a variable name that may hold a credential (never passed to a worker)."""
    upper = name.upper()
    return bool(_SECRET_WORDS.search(upper)) or upper.startswith(_SECRET_PREFIXES)


def scrub_environment(env: Mapping[str, str], keep: Sequence[str] = ()) -> dict[str, str]:
    """The worker's environment: allow-listed names (plus `keep`), minus anything secret."""
    kept = set(keep)
    return {
        name: value
        for name, value in env.items()
        if (name in SAFE_NAMES or name.startswith(SAFE_PREFIXES) or name in kept)
        and not is_secret_name(name)
    }
