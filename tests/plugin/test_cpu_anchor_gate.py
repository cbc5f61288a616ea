"""The CPU gate end to end with real timing (no injected timer): a kernel made 2x slower by
doing its work twice fails `--kernelpro-check`, relative to the CPU anchor and confirmed by a
re-measurement, and an unchanged kernel beside it passes, on whatever load the machine has.
Nothing here reads a wall-clock threshold: the effect (2x) is far beyond the tolerance a busy
machine gets (gate/cpu_anchor.BUSY_TOLERANCE), and both verdicts are paired comparisons."""

from __future__ import annotations

import pytest
from conftest import records_by_name

KERNELS = """
import os, pytest, torch

def inp(device):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(256, 256, generator=g), torch.randn(256, 256, generator=g))

@pytest.mark.kernelpro(reference=torch.mm, inputs=inp)
def doubled(a, b):
    out = torch.mm(a, b)
    for _ in range(int(os.environ.get("KP_WORK", "1")) - 1):
        out = torch.mm(a, b)  # the same product again: twice the work, a real 2x
    return out

@pytest.mark.kernelpro(reference=torch.mm, inputs=inp)
def unchanged(a, b):
    return torch.mm(a, b)
"""


def test_a_2x_slower_kernel_fails_and_an_unchanged_one_passes(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    kp_project.makepyfile(test_k=KERNELS)
    budget = "--kernelpro-time-budget=2.5"  # more pairs: robust at load 20 beside two hogs
    kp_project.runpytest(budget, "--kernelpro-save-baseline").assert_outcomes(passed=2)
    monkeypatch.setenv("KP_WORK", "2")
    result = kp_project.runpytest(budget, "--kernelpro-check")
    records = records_by_name(kp_project)
    doubled, unchanged = records["doubled"]["gate"], records["unchanged"]["gate"]
    assert (doubled["failed"], unchanged["failed"]) == (True, False), (doubled, unchanged)
    result.assert_outcomes(passed=1, failed=1)
    assert doubled["status"] == "regressed", doubled["reason"]
    assert doubled["confirmed"] is True
    assert doubled["basis"].startswith("on-CPU time checked against the CPU anchor")
    assert doubled["anchor"].startswith("cpu anchor: fp32 matmul")
    assert unchanged["failed"] is False, unchanged["reason"]
    assert unchanged["status"] == "ok", unchanged["reason"]
    result.stdout.fnmatch_lines(["*doubled*slower by*relative to the CPU anchor*"])
