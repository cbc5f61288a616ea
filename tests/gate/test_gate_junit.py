"""JUnit properties: written by pytest's --junitxml, read back with junitparser."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_factories import make_record

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.confirmation import confirm
from pytest_kernelpro.gate.junit import junit_properties
from pytest_kernelpro.gate.report import build_report
from pytest_kernelpro.gate.verdict import decide_verdict
from pytest_kernelpro.record import VerdictPart, part_of, record_builtins
from pytest_kernelpro.review.comment import render_comment
from pytest_kernelpro.review.junit_read import read_junit_records

# The plugin's way of attaching properties: item.user_properties, filled before the report.
CONFTEST = """
import json
import pytest
import msgspec
from pytest_kernelpro.gate.junit import junit_properties
from pytest_kernelpro.record import KernelRecord

with open("records.json", encoding="utf-8") as handle:
    RECORDS = {r["name"]: msgspec.convert(r, KernelRecord) for r in json.load(handle)}

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    record = RECORDS.get(item.callspec.params.get("name")) if hasattr(item, "callspec") else None
    if record is not None:
        item.user_properties.extend(junit_properties(record))
"""

TESTS = """
import pytest

@pytest.mark.parametrize("name", ["softmax[8192x4096]", "fresh[1]", "wrong[1]"])
def test_kernel(name):
    assert name != "wrong[1]", "output mismatch at [0, 3]"

def test_ordinary():
    pass
"""


def _records() -> list:
    entry = entry_from_record(make_record("softmax[8192x4096]", seed=1))
    slow = make_record("softmax[8192x4096]", median_s=56e-6, seed=2)
    first = decide_verdict(slow, entry)
    slow.gate = part_of(
        VerdictPart,
        confirm(first, make_record("softmax[8192x4096]", median_s=56e-6, seed=3), entry),
    )
    slow.guidance = "### Automated Bottleneck Analysis\n- L2 hit rate 12% & falling <check>"
    fresh = make_record("fresh[1]", seed=4, bound="compute")
    fresh.gate = part_of(VerdictPart, decide_verdict(fresh, None))
    wrong = make_record("wrong[1]", timed=False, outcome="failed")
    return [slow, fresh, wrong]


def test_round_trip_through_pytest_junitxml(pytester: pytest.Pytester) -> None:
    records = _records()
    (pytester.path / "records.json").write_text(
        json.dumps([record_builtins(r) for r in records]), encoding="utf-8"
    )
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_kernels=TESTS)
    xml = pytester.path / "junit.xml"
    result = pytester.runpytest(
        "-p",
        "no:kernelpro",
        "-p",
        "no:benchmark",  # an installed pytest-benchmark warns under xdist
        f"--junitxml={xml}",
        "-W",
        "error",  # default junit_family
    )
    result.assert_outcomes(passed=3, failed=1)
    back = {r.name: r for r in read_junit_records(xml)}
    assert set(back) == {"softmax[8192x4096]", "fresh[1]", "wrong[1]"}  # ordinary test ignored
    slow, orig = back["softmax[8192x4096]"], records[0]
    assert slow.outcome == "passed"
    assert slow.nodeid == orig.nodeid
    assert slow.kernel == "softmax"
    assert slow.shape == "8192x4096"
    assert slow.device == "NVIDIA H200"
    assert slow.device_kind == "cuda"
    assert slow.language == "triton"
    assert slow.median_s == orig.median_s  # repr() keeps every bit of a float
    assert slow.timing.stats.n == 400
    assert slow.efficiency == orig.efficiency
    assert slow.roofline.bound == "memory"
    assert slow.roofline.roofline_time_s == orig.roofline.roofline_time_s
    assert slow.gate == orig.gate  # all of it
    assert slow.gate.status == "regressed"
    assert slow.gate.confirmed is True
    assert slow.guidance == orig.guidance
    assert back["fresh[1]"].gate.status == "new"
    wrong = back["wrong[1]"]
    assert wrong.outcome == "failed"
    assert "output mismatch at [0, 3]" in (wrong.message or "")
    # Enough for the comment: same rows as from the JSON report.
    body = render_comment(build_report(list(back.values()), meta={}))
    assert "| `softmax[8192x4096]` | 50.0 µs | 56.0 µs |" in body
    assert "🔴 regressed" in body
    assert "🆕 new" in body
    assert "❌ failed" in body


def test_properties_are_strings_and_skip_missing_values() -> None:
    props = dict(junit_properties(make_record("k[1]", seed=1)))
    assert all(isinstance(v, str) for v in props.values())
    assert props["kernelpro.name"] == "k[1]"
    assert float(props["kernelpro.median_s"]) > 0
    assert "kernelpro.gate" not in props  # no verdict: nothing to say
    assert "kernelpro.min_roofline" not in props


def test_unreadable_junit_files(tmp_path: Path) -> None:
    with pytest.raises(KernelproError, match="does not exist"):
        read_junit_records(tmp_path / "none.xml")
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites><testsuite", encoding="utf-8")
    with pytest.raises(KernelproError, match="cannot be parsed"):
        read_junit_records(bad)
