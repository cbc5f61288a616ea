"""`ProfileReport.to_dict` and `from_dict` are inverses on real H200 records (the form a JSON
record's `profile` and the candidate profiler's answer take)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kernelpro.profile.model import ProfileReport

RECORDS = (
    Path(__file__).resolve().parent.parent
    / "data"
    / "tools"
    / "h200-example-repo"
    / "profile_records.json"
)


@pytest.mark.parametrize("name", ["softmax_rows", "triton_softmax", "cuda_row_rms"])
def test_round_trip(name: str) -> None:
    record = next(
        r for r in json.loads(RECORDS.read_text(encoding="utf-8"))["records"] if r["name"] == name
    )
    report = ProfileReport.from_dict(record["profile"])
    assert report.kernels
    again = ProfileReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again == report
    assert json.loads(json.dumps(again.to_dict())) == json.loads(json.dumps(report.to_dict()))
