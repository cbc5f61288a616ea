"""A kernel timed faster than its roofline allows, end to end on the CPU: the record says
so (peak_used), the terminal row and the item section name it, the efficiency stays above
100% (no faster path exists for CPU work), and the JUnit file carries it."""

from __future__ import annotations

import json

import pytest
from conftest import FIXED_CEILINGS, records_by_name

# 1e13 FLOPs in the ~1 ms the injected timer hands out is 1e16 FLOP/s, against the fixed
# 1 TFLOP/s fp32 ceiling: no unit of this "device" runs that fast.
TOO_FAST = """
import pytest, torch
@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.randn(1000, device=device),),
                       flops=1e13, bytes=8000)
def neg(x):
    return -x
"""


def test_a_rate_above_every_ceiling_is_named_not_hidden(
    kp_project: pytest.Pytester, injected_timing: list[float]
) -> None:
    # Changed with the impossible-time rule (measure/roofline.py): a time beyond every
    # *trusted* ceiling now fails the item. The shared fixture's device "test-cpu" does not
    # start with "cpu", so `Ceilings.device_type` reads it as a GPU and trusts it. This test
    # is about the untrusted case (the rate is named, not hidden, and the item passes), so it
    # uses CPU ceilings of one probe, which are never trusted.
    untrusted = {**FIXED_CEILINGS, "device": "cpu (test, one probe)", "details": {}}
    (kp_project.path / "ceilings.json").write_text(json.dumps(untrusted))
    kp_project.makepyfile(test_k=TOO_FAST)
    result = kp_project.runpytest("-rA", "--junitxml=junit.xml")
    result.assert_outcomes(passed=1)
    record = records_by_name(kp_project)["neg"]
    assert record["extra"]["ceilings_trusted"] is False
    used = record["peak_used"]
    assert used["problem"] == "flops"
    assert used["inferred"] is False
    assert used["measured_flops_per_s"] == pytest.approx(1e13 / injected_timing[0])
    assert "exceeds the CPU FP32 (torch.matmul rate)" in used["note"]
    assert (
        "on the reference's FLOP count (marker): does less arithmetic than the reference"
        in (used["note"])
    )
    assert record["efficiency"] == pytest.approx(10.0 / injected_timing[0])  # still > 100%
    result.stdout.fnmatch_lines(["*neg*compute (fewer FLOPs than the reference)*"])
    result.stdout.fnmatch_lines(["*peak used for this kernel: *measured exceeds*"])
    from pytest_kernelpro.review.junit_read import read_junit_records

    (from_junit,) = read_junit_records(kp_project.path / "junit.xml")
    assert from_junit.peak_used == used
