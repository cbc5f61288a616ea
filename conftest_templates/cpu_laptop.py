"""conftest.py for a laptop without a GPU (copy to the root of your kernel tests).

On the CPU only the PyTorch kernels run; Triton and CUDA kernels are skipped with the
reason, so `pytest` stays green and fast while you edit. Timings on a laptop are noisy
(frequency scaling, other programs), so the budget is short and the gate is loose: use the
laptop to see the table and % of roofline, and the GPU runner to gate.

Precedence stays pytest-kernelpro's: marker > command line > KERNELPRO_* environment >
ini file > these defaults.
"""

from __future__ import annotations

from typing import Any

import pytest

CPU_LAPTOP_DEFAULTS: dict[str, Any] = {
    "device": "cpu",
    "time_budget": 0.5,  # seconds per kernel: quick feedback over precision
    "target_rel_ci": 0.01,  # +-1% is as good as a busy laptop gets
    "warmup_ms": 10.0,
    "trials": 2,  # correctness trials with fresh inputs
    "threshold": 0.15,  # laptop noise: only large changes are worth a look
    "baseline": ".kernelpro/laptop-baseline.yaml",  # never the CI baseline
}


def pytest_kernelpro_defaults(config: pytest.Config) -> dict[str, Any]:
    """This file's defaults; the command line, KERNELPRO_* variables and the ini file win."""
    return CPU_LAPTOP_DEFAULTS


@pytest.hookimpl(tryfirst=True)  # before pytest-kernelpro reads its settings
def pytest_configure(config: pytest.Config) -> None:
    """Apply the laptop defaults; keep BLAS from fighting pytest-xdist for cores."""
    if hasattr(config, "workerinput"):  # under `pytest -n N` every worker gets one thread
        import torch

        torch.set_num_threads(1)
