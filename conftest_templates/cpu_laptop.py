"""conftest.py for a laptop without a GPU (copy to the root of your kernel tests).

On the CPU only the PyTorch kernels run; Triton and CUDA kernels are skipped with the
reason, so `pytest` stays green and fast while you edit. Timings on a laptop are noisy
(frequency scaling, other programs), so the budget is short and the gate is loose: use the
laptop to see the table and % of roofline, and the GPU runner to gate.

Precedence stays pytest-kernelpro's: marker > command line > KERNELPRO_* environment >
ini file > these defaults.
"""

from __future__ import annotations

import os
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


def set_kernelpro_default(config: pytest.Config, name: str, value: Any) -> None:
    """Give setting `name` a default unless the command line, its KERNELPRO_<NAME>
    environment variable or the ini file already sets it."""
    dest = f"kernelpro_{name}"
    if getattr(config.option, dest, None) is not None:
        return
    if os.environ.get(f"KERNELPRO_{name.upper()}"):
        return
    if config.getini(f"kernelpro_{name}"):
        return
    setattr(config.option, dest, value)


@pytest.hookimpl(tryfirst=True)  # before pytest-kernelpro reads its settings
def pytest_configure(config: pytest.Config) -> None:
    """Apply the laptop defaults; keep BLAS from fighting pytest-xdist for cores."""
    for name, value in CPU_LAPTOP_DEFAULTS.items():
        set_kernelpro_default(config, name, value)
    if hasattr(config, "workerinput"):  # under `pytest -n N` every worker gets one thread
        import torch

        torch.set_num_threads(1)
