"""The item's report section says how a kernel failed before any value was compared.

A kernel that raised, or returned an output of the wrong dtype, used to read
"correctness: FAILED over 1 trials; max abs err 0, max rel err 0": errors of zero, as if
everything it returned matched (found with Liger-Kernel's RMSNorm, whose bf16 output met an
fp32 reference).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.gate.format import item_section  # noqa: E402
from pytest_kernelpro.measure.correctness_check import check_correctness  # noqa: E402
from pytest_kernelpro.record import CorrectnessPart, KernelRecord, part_of  # noqa: E402


def _section(kernel, reference) -> str:
    result = check_correctness(
        kernel, reference, lambda seed: (torch.randn(64, 32),), device="cpu", trials=3
    )
    record = KernelRecord(nodeid="t.py::k", name="k", kernel="k", language="pytorch", device="cpu")
    record.correctness = part_of(CorrectnessPart, result)
    return item_section(record)


def _correctness_line(section: str) -> str:
    return next(line for line in section.splitlines() if line.startswith("correctness:"))


def test_a_kernel_that_raised_is_named_with_its_error_not_with_zero_errors() -> None:
    def kernel(x):
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    line = _correctness_line(_section(kernel, lambda x: x * 2))
    assert line.startswith("correctness: FAILED on trial 1 of 3 before any value was compared:")
    assert "RuntimeError: 0 active drivers" in line
    assert "max abs err" not in line


def test_an_output_of_the_wrong_dtype_is_named_with_both_dtypes() -> None:
    line = _correctness_line(_section(lambda x: (x * 2).to(torch.bfloat16), lambda x: x * 2))
    assert "before any value was compared" in line
    assert "bfloat16" in line
    assert "float32" in line


def test_a_value_mismatch_keeps_its_errors_and_tolerance() -> None:
    line = _correctness_line(_section(lambda x: x * 2 + 1, lambda x: x * 2))
    assert line.startswith("correctness: FAILED over 1 trial; max abs err 1,")
    # Since issue 27 the float64 truth's rule decides (x * 2 is exact: two fp32 roundings,
    # rtol 2 * 2^-24), and the line names it.
    assert "rtol 1.19e-07" in line
    assert "within 8x the reference's own error against its float64 re-run" in line


def test_a_nan_output_is_named_as_nan_not_as_an_error_of_zero() -> None:
    """Every output NaN: the errors over the elements that are numbers on both sides are 0,
    which the section printed as "max abs err 0" beside FAILED."""
    line = _correctness_line(_section(lambda x: torch.full_like(x, float("nan")), torch.neg))
    assert line.startswith("correctness: FAILED over 1 trial (rtol ")
    assert "NaN where the reference is a number" in line
    assert "max abs err" not in line


def test_a_pass_keeps_its_errors_and_tolerance() -> None:
    line = _correctness_line(_section(lambda x: x * 2, lambda x: x + x))
    assert line.startswith("correctness: passed over 3 trials; max abs err 0,")
