"""Helpers for pytester runs of small kernel projects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# Round numbers so roofline results can be checked by hand: 100 GB/s, 1 TFLOP/s (fp32),
# 0.5 TFLOP/s (fp64).
FIXED_CEILINGS = {
    "device": "test-cpu",
    "bandwidth_Bps": 100e9,
    "flops": {"fp32": 1e12, "fp64": 0.5e12, "bf16": 1e12},
    "source": "test",
    "measured_at": "2026-11-30T00:00:00",
    "torch_version": "test",
    "details": {},
}


@pytest.fixture
def kp_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester project with fixed ceilings and a short timing budget."""
    ceilings = pytester.path / "ceilings.json"
    ceilings.write_text(json.dumps(FIXED_CEILINGS))
    pytester.makeini(
        f"""
        [pytest]
        kernelpro_ceilings = {ceilings}
        kernelpro_time_budget = 0.2
        kernelpro_warmup_ms = 1
        """
    )
    return pytester


def load_report(pytester: pytest.Pytester) -> dict:
    path = Path(pytester.path) / ".kernelpro" / "kernelpro-report.json"
    return json.loads(path.read_text())


def records_by_name(pytester: pytest.Pytester) -> dict[str, dict]:
    return {r["name"]: r for r in load_report(pytester)["records"]}
