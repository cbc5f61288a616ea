"""The kernelpro tables in a log (stdout not a terminal, as in every CI job): never cut.

pytester's in-process runs write to a captured stream, not a terminal, exactly as a CI log
is written. COLUMNS=60 is the attack: a width pytest would otherwise hand the table, at
which rich cropped the verdict column to `verdi` / `passe` and dropped the roofline time.
"""

from __future__ import annotations

import re

import pytest
from conftest import SLOWDOWN_ENV

from pytest_kernelpro.review.cli import main as kernelpro_main

LONG = "a_kernel_with_a_long_descriptive_name_that_a_log_must_keep_whole"

KERNELS = f"""
import pytest, torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def {LONG}(x):
    return -x

@pytest.mark.kernelpro(reference=torch.abs, inputs=inp)
def absolute(x):
    return x.abs()
"""


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "= kernelpro =" in line)
    end = next(i for i in range(start + 1, len(lines)) if "kernel(s)" in lines[i])
    return lines[start + 1 : end + 1]


def test_a_log_gets_the_whole_table_whatever_columns_says(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    kp_project.makepyfile(test_k=KERNELS)
    result = kp_project.runpytest("--kernelpro-save-baseline")
    result.assert_outcomes(passed=2)
    table = _table(result.stdout.str())
    header = table[0].split()
    assert header[-1] == "verdict"
    assert "roofline" in header  # the roofline time column, left out only on narrow terminals
    rows = {line.split()[0]: line for line in table[2:-1]}
    assert set(rows) == {LONG, "absolute"}  # the long name whole, on its own line
    assert all(line.split()[-1] == "passed" for line in rows.values())
    assert max(len(line) for line in table) > 60  # wider than COLUMNS: nothing was cut


def test_a_log_gets_the_whole_verdict_and_change(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    kp_project.makepyfile(test_k=KERNELS)
    kp_project.runpytest("--kernelpro-save-baseline").assert_outcomes(passed=2)
    monkeypatch.setenv(SLOWDOWN_ENV, "1.5")
    result = kp_project.runpytest("--kernelpro-check")
    result.assert_outcomes(failed=2)
    table = _table(result.stdout.str())
    rows = [line for line in table if line.startswith((LONG, "absolute"))]
    assert len(rows) == 2
    for line in rows:
        assert re.search(r"REGRESSED \+\d+\.\d%$", line.rstrip()), line


def test_kernelpro_compare_into_a_pipe_is_whole(
    kp_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    kp_project.makepyfile(test_k=KERNELS)
    kp_project.runpytest().assert_outcomes(passed=2)
    monkeypatch.setenv(SLOWDOWN_ENV, "1.5")
    kp_project.runpytest().assert_outcomes(passed=2)
    capsys.readouterr()
    monkeypatch.chdir(kp_project.path)
    assert kernelpro_main(["compare"]) == 1  # the regressed rows fail it
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith(LONG))
    assert re.search(r"REGRESSED \+\d+\.\d%$", line.rstrip()), line
    assert out.splitlines()[2].split()[-1] == "verdict"
