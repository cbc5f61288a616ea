"""conftest.py for a directory of KernelBench problems (copy next to the `level1/` ...).

KernelBench problem files (`class Model`, `get_inputs()`, `get_init_inputs()`, optional
`ModelNew`) are collected as kernel items from the `problems` directory: `ModelNew` is the
kernel under test when present, else `Model` is timed against itself. Only kernel items
run (`--kernelpro-only`), and the op-cost hook prices an op the built-in formulas do not
know, so its roofline is right.

Precedence stays pytest-kernelpro's: marker > command line > KERNELPRO_* environment >
ini file > these defaults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent

KERNELBENCH_DEFAULTS: dict[str, Any] = {
    "problems": str(HERE),  # this directory and below
    "trials": 5,  # KernelBench checks five random inputs
    "time_budget": 2.0,
    "baseline": str(HERE / "kernelpro-baseline.yaml"),
}


def pytest_kernelpro_defaults(config: pytest.Config) -> dict[str, Any]:
    """This file's defaults; the command line, KERNELPRO_* variables and the ini file win."""
    return KERNELBENCH_DEFAULTS


@pytest.hookimpl(tryfirst=True)  # before pytest-kernelpro reads its settings
def pytest_configure(config: pytest.Config) -> None:
    """Collect the problems here, and nothing but kernel items."""
    config.option.kernelpro_only = True


def pytest_kernelpro_op_cost(op: str, args: tuple, kwargs: dict, out: Any) -> Any:
    """Price ops the built-in formulas do not know; return None to keep the built-in price.

    Example: a custom op `torch.ops.mylib.fused_rope` (rotary embedding): 6 FLOPs per output
    element, the input read once and the output written once.
    """
    if op.startswith("mylib.fused_rope") and hasattr(out, "numel"):
        from pytest_kernelpro.measure.flops import OpCost

        n = out.numel()
        return OpCost(
            op=op,
            category="elementwise",
            flops=6.0 * n,
            bytes_unfused=2.0 * n * out.element_size(),
            dtype=str(out.dtype).removeprefix("torch."),
            peak_key="fp32",
        )
    return None
