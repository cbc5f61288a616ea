"""What the kernelpro summary says and the run modes: oversubscribed CPUs, the CPU flush
switch, correctness-only runs, counts that match pytest's, names that are not markup, the
run history, `kernelpro compare` / `history` / `--version`, and `--kernelpro-sort`."""

from __future__ import annotations

import json
import re

import pytest
from conftest import BUSY_ENV, SLOWDOWN_ENV, load_report, records_by_name

from pytest_kernelpro.review.cli import main as kernelpro_main

TWO = """
import pytest, torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def neg(x):
    return -x

@pytest.mark.kernelpro(reference=torch.abs, inputs=inp)
def absolute(x):
    return x.abs()
"""


def test_oversubscribed_cpu_is_said_and_a_slowdown_there_is_suspect_not_failed(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    kp_project.makepyfile(test_k=TWO)
    kp_project.runpytest("--kernelpro-save-baseline").assert_outcomes(passed=2)
    monkeypatch.setenv(SLOWDOWN_ENV, "5")
    monkeypatch.setenv(BUSY_ENV, "1")
    result = kp_project.runpytest("--kernelpro-check")
    result.assert_outcomes(passed=2)
    # One short line by default; the whole text in the JSON report (and under -v).
    result.stdout.fnmatch_lines(
        [
            "kernelpro: 2 CPU timing(s) on a busy CPU (others used 1.5 of 2 cores); re-run on a "
            "quiet machine"
        ]
    )
    (full,) = [n for n in load_report(kp_project)["meta"]["notes"] if "oversubscribed" in n]
    assert full.startswith("2 CPU timing(s) taken on an oversubscribed CPU (")
    assert ("other processes used 1.5 of 2 core(s) while 1 thread(s) were timed; load average "
            "3.5 on 2 CPU(s)") in full  # fmt: skip
    assert "Treat them as suspect" in full
    gate = records_by_name(kp_project)["neg"]["gate"]
    assert gate["status"] == "suspect"
    assert "the CPU was oversubscribed while it was timed" in gate["reason"]
    assert gate["change"] == pytest.approx(4.0, rel=0.05)


def test_quiet_cpu_has_no_oversubscription_line(
    kp_project: pytest.Pytester, injected_timing: list[float]
) -> None:
    kp_project.makepyfile(test_k=TWO)
    result = kp_project.runpytest()
    result.assert_outcomes(passed=2)
    assert "oversubscribed" not in result.stdout.str()


def test_another_cpu_in_the_baseline_is_information_unless_gated(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, injected_timing: list[float]
) -> None:
    kp_project.makepyfile(test_k=TWO)
    kp_project.runpytest("--kernelpro-save-baseline").assert_outcomes(passed=2)
    baseline = kp_project.path / "kernelpro-baseline.yaml"
    baseline.write_text(baseline.read_text().replace("cpu (injected", "cpu (another model"))
    monkeypatch.setenv(SLOWDOWN_ENV, "5")
    result = kp_project.runpytest("--kernelpro-check")
    result.assert_outcomes(passed=2)
    gate = records_by_name(kp_project)["neg"]["gate"]
    assert gate["status"] == "incomparable"
    assert "reported as information only" in gate["reason"]
    assert gate["change"] == pytest.approx(4.0, rel=0.05)
    gated = kp_project.runpytest("--kernelpro-check", "--kernelpro-cpu-cross-device=gate")
    gated.assert_outcomes(failed=2)
    assert records_by_name(kp_project)["neg"]["gate"]["status"] == "regressed"


def _neg_timing_with_setting(
    kp_project: pytest.Pytester, how: str, setting: str, value: str
) -> dict:
    """The `neg` kernel's timing record after a run with `--kernelpro-SETTING=value` given on
    the command line (`how` "cli"), as the ini key (`"ini"`), or not at all (`"default"`)."""
    kp_project.makepyfile(test_k=TWO.split("@pytest.mark.kernelpro(reference=torch.abs")[0])
    args = []
    if how == "cli":
        args.append(f"--kernelpro-{setting}={value}")
    elif how == "ini":
        ini = (kp_project.path / "tox.ini").read_text()
        key = "kernelpro_" + setting.replace("-", "_")
        kp_project.makeini(ini.rstrip("\n") + f"\n{key} = {value}\n")
    kp_project.runpytest(*args).assert_outcomes(passed=1)
    return records_by_name(kp_project)["neg"]["timing"]


@pytest.mark.parametrize(
    ("how", "mode", "flushed", "reason"),
    [
        ("cli", "off", False, "off"),
        ("cli", "on", True, "on"),
        ("ini", "off", False, "off"),
        ("default", "auto", True, "auto: the inputs fit in the cache"),
    ],
)
def test_cpu_flush_switch(
    kp_project: pytest.Pytester, how: str, mode: str, flushed: bool, reason: str
) -> None:
    from pytest_kernelpro.measure.timing.cpu import cpu_flush_cap_note

    timing = _neg_timing_with_setting(kp_project, how, "cpu-flush", mode)
    assert timing["flushed_l2"] is flushed
    # A flush on a machine whose last-level cache is above the cap says so (this machine's).
    assert timing["flush_reason"] == reason + (cpu_flush_cap_note() if flushed else "")
    assert timing["budget"]["cpu_flush"] == mode
    assert (timing["flush_bytes"] > 0) is flushed


def test_bad_cpu_flush_value_is_a_usage_error(kp_project: pytest.Pytester) -> None:
    result = kp_project.runpytest("--kernelpro-cpu-flush=sometimes")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*'sometimes' is not a valid CPU flush mode; use one of auto, on, off*"]
    )


@pytest.mark.parametrize(("how", "mode"), [("cli", "off"), ("ini", "off"), ("default", "on")])
def test_clock_anchor_setting_reaches_the_timing_budget(
    kp_project: pytest.Pytester, how: str, mode: str
) -> None:
    timing = _neg_timing_with_setting(kp_project, how, "clock-anchor", mode)
    assert timing["budget"]["clock_anchor"] == mode
    # On the CPU, "on" pairs every sample with the CPU anchor (measure/timing/cpu.py).
    if mode == "on":
        assert timing["anchor"]["layout"] == "cpu-pairs"
        assert timing["anchor"]["pairs"] == len(timing["samples_s"])
    else:
        assert timing["anchor"] is None


def test_bad_clock_anchor_value_is_a_usage_error(kp_project: pytest.Pytester) -> None:
    result = kp_project.runpytest("--kernelpro-clock-anchor=always")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'always' is not a valid clock anchor mode; use one of off, on*"])


def test_correctness_only_checks_and_times_nothing(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k=TWO
        + """
@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def wrong(x):
    return x
"""
    )
    result = kp_project.runpytest("--kernelpro-correctness-only", "--kernelpro-check")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*wrong is wrong*",
            "kernelpro: correctness only: 2 kernel(s) checked, nothing timed or gated",
        ]
    )
    records = records_by_name(kp_project)
    for name in ("neg", "absolute"):
        assert records[name]["outcome"] == "passed"
        assert records[name]["correctness"]["passed"] is True
        assert records[name]["timing"] is None
        assert records[name]["gate"] is None
    assert records["wrong"]["outcome"] == "failed"


def test_counts_match_pytest_and_names_are_not_markup(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
import pytest, torch

def inp(device, shape):
    return (torch.randn(64, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, shapes=["/bold"])
def k(x):
    return -x

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, bogus=1)
def bad(x):
    return -x
"""
    )
    result = kp_project.runpytest("--kernelpro-profile")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert re.search(r"^k\[/bold\] ", out, re.MULTILINE)  # the name, printed as it is
    result.stdout.fnmatch_lines(
        [
            "2 kernel(s)*: 1 failed, 1 passed",
            "kernelpro: --kernelpro-profile: 1 kernel(s) not profiled: no CUDA GPU here",
            "kernelpro: 1 kernel(s) with an invalid marker failed (bad); see each failure",
        ]
    )
    assert load_report(kp_project)["summary"]["kernels"] == 2


def test_sort_by_name(kp_project: pytest.Pytester, injected_timing: list[float]) -> None:
    kp_project.makepyfile(test_k=TWO)
    result = kp_project.runpytest("--kernelpro-sort=name")
    lines = [line.split()[0] for line in result.stdout.lines if line.startswith(("neg", "abs"))]
    assert lines == ["absolute", "neg"]


def test_history_and_compare_over_two_runs(
    kp_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    kp_project.makepyfile(test_k=TWO)
    kp_project.runpytest().assert_outcomes(passed=2)
    monkeypatch.setenv(SLOWDOWN_ENV, "2")
    result = kp_project.runpytest()
    result.stdout.fnmatch_lines(["kernelpro: run kept as *"])
    history = kp_project.path / ".kernelpro" / "history"
    runs = sorted(history.glob("*.json"))
    assert len(runs) == 2
    first = json.loads(runs[0].read_text())
    assert first["kind"] == "kernelpro-report"
    commit = str(first["meta"]["commit"] or "nocommit")[:12]
    assert commit in runs[0].name
    assert first["meta"]["machine"] in runs[0].name.lower() or first["meta"]["machine"]

    monkeypatch.chdir(kp_project.path)
    assert kernelpro_main(["history"]) == 0
    listing = capsys.readouterr().out
    assert runs[0].stem in listing
    assert "-2" in listing

    assert kernelpro_main(["compare"]) == 1  # the last two runs: a regressed row fails
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("kernel"))
    assert header.split() == ["kernel", "baseline", "head", "speedup", "verdict"]
    row = next(line for line in out.splitlines() if line.startswith("neg"))
    speedup = injected_timing[0] / injected_timing[2]  # first run's neg / second run's neg
    assert f"{speedup:.2f}×" in row
    assert "REGRESSED" in row
    assert kernelpro_main(["compare", runs[0].stem, "-1", "--fail"]) == 1
    capsys.readouterr()
    assert kernelpro_main(["compare", "-3", "-1"]) == 2
    assert "holds 2 timed run(s)" in capsys.readouterr().err


def test_history_can_be_turned_off(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(test_k=TWO.split("@pytest.mark.kernelpro(reference=torch.abs")[0])
    kp_project.runpytest("--kernelpro-history=off").assert_outcomes(passed=1)
    assert not (kp_project.path / ".kernelpro" / "history").exists()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from pytest_kernelpro import __version__

    assert kernelpro_main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kernelpro (pytest-kernelpro) {__version__}"


def test_a_kernel_whose_floor_needs_more_than_the_budget_takes_it_without_a_note(
    kp_project: pytest.Pytester,
) -> None:
    """A 200 ms kernel under a 0.02 s budget: the floor of 5 samples alone takes 1 s. That
    is the kernel's own need (a slow kernel is no condition of the machine to warn about):
    the floor is taken and no overrun line is printed, by default or under -v. What the timer
    adds past that need is named (tests/measure/test_timing_budget.py, on a simulated clock;
    the summary's line for it: tests/gate/test_quiet_and_loud.py). A kernel this slow leaves
    the timer's own part of a sample (tens of ms under heavy load) inside the tolerance."""
    kp_project.makepyfile(
        test_k="""
import time, pytest, torch

def inp(device):
    return (torch.ones(4, device=device),)

def slow(x):
    time.sleep(0.2)
    return x.clone()

@pytest.mark.kernelpro(reference=lambda x: x.clone(), inputs=inp)
def copy(x):
    return slow(x)
"""
    )
    args = ("--kernelpro-time-budget=0.02", "--kernelpro-cpu-flush=off")
    for extra in ((), ("-v",)):
        result = kp_project.runpytest(*args, *extra)
        result.assert_outcomes(passed=1)
        assert "overran the time budget" not in result.stdout.str()
    timing = records_by_name(kp_project)["copy"]["timing"]
    assert timing["stats"]["n"] == 5
    assert not timing["budget_note"]
