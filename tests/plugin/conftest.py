"""Helpers for pytester runs of small kernel projects."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# In-process pytester runs drop modules first imported inside them; torch registers
# operator libraries on import and refuses a second registration, so import the heavy
# parts here, once, before any inner run.
import torch

from pytest_kernelpro.measure.ceilings import Ceilings
from pytest_kernelpro.measure.correctness import check_correctness
from pytest_kernelpro.measure.roofline import analyze_reference

# Round numbers so roofline results can be checked by hand: 100 GB/s, 1 TFLOP/s (fp32),
# 0.5 TFLOP/s (fp64).
FIXED_CEILINGS = {
    "device": "test-cpu",
    "bandwidth_Bps": 100e9,
    "flops": {"fp32": 1e12, "fp64": 0.5e12, "bf16": 1e12},
    "source": "measured",
    "measured_at": "2026-11-30T00:00:00",
    "torch_version": "test",
    "details": {},
}


def _warm_up_lazy_imports() -> None:
    check_correctness(torch.neg, torch.neg, lambda seed: (torch.ones(4),), device="cpu", trials=1)
    analyze_reference(
        torch.mm, (torch.ones(4, 4), torch.ones(4, 4)), ceilings=Ceilings.from_dict(FIXED_CEILINGS)
    )


_warm_up_lazy_imports()


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
