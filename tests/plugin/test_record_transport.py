"""The record crosses from the item to the session's report as its JSON text on the test
report (`run.session.REPORT_ATTR`): in one process and from pytest-xdist workers, each record
arrives typed and whole, and the report and the records log hold the same records."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.gate.report_read import read_records_log
from pytest_kernelpro.record import CorrectnessPart, TimingPart
from pytest_kernelpro.review.report_load import load_report, records_of

KERNELS = """
import pytest, torch

@pytest.mark.kernelpro(reference=torch.relu, inputs=lambda device: (torch.randn(64, 32, device=device),))
def relu(x):
    return torch.relu(x)

@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.randn(256, device=device),))
def neg(x):
    return -x

@pytest.mark.kernelpro(reference=torch.tanh, inputs=lambda device: (torch.randn(256, device=device),))
def tanh_wrong(x):
    return torch.tanh(x) * 2
"""


@pytest.mark.parametrize("workers", [None, "2"])
def test_each_record_reaches_the_report_typed_and_whole(
    kp_project: pytest.Pytester, workers: str | None
) -> None:
    kp_project.makepyfile(test_k=KERNELS)
    args = ["-p", "no:randomly"] + (["-n", workers] if workers else ["-p", "no:xdist"])
    result = kp_project.runpytest_subprocess(*args)
    result.assert_outcomes(passed=2, failed=1)
    folder = Path(kp_project.path) / ".kernelpro"
    records = {r.name: r for r in records_of(load_report(folder / "kernelpro-report.json"))}
    assert sorted(records) == ["neg", "relu", "tanh_wrong"]
    for name in ("relu", "neg"):
        record = records[name]
        assert record.outcome == "passed"
        assert isinstance(record.timing, TimingPart)
        assert record.timing.samples_s
        assert record.median_s == record.timing.stats.median_s > 0
        assert isinstance(record.correctness, CorrectnessPart)
        assert record.correctness.passed is True
        assert record.settings  # the item's settings came along, untyped as they are
    wrong = records["tanh_wrong"]
    assert wrong.outcome == "failed"
    assert wrong.correctness.passed is False
    logged = read_records_log(folder / "kernelpro-report.jsonl")
    assert {r.name: r for r in logged.records} == records
