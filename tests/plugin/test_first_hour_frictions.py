"""What a new user runs into in the first hour, each as that user meets it: a parametrized
kernel, `--co` and deselection, a correctness-only run in the history, the CPU cache flush
said under the table, and the wording of a failed check."""

from __future__ import annotations

import json

import pytest
from conftest import SLOWDOWN_ENV

from pytest_kernelpro.review.cli import main as kernelpro_main

NEG = """
import pytest, torch

def inp(device):
    return (torch.randn(4096, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def neg(x):
    return -x

def test_plain():
    pass
"""


def test_parametrize_on_a_kernel_fails_that_kernel_pointing_to_shapes(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(
        test_k=NEG
        + """
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.kernelpro(reference=torch.softmax, inputs=inp)
def softmax(x, dim):
    return torch.softmax(x, dim)
"""
    )
    result = kp_project.runpytest()
    result.assert_outcomes(passed=2, failed=1)  # neg and test_plain still run
    result.stdout.fnmatch_lines(
        [
            "*kernel 'softmax': @pytest.mark.parametrize('dim', ...) does not apply to a "
            "kernelpro kernel*give the marker shapes=[[]...[]]*the inputs factory gets shape=*"
        ]
    )
    assert "TypeError" not in result.stdout.str()


@pytest.mark.parametrize(
    "args",
    [("--co",), ("--co", "--kernelpro-check"), ("-m", "not kernelpro"), ("-k", "plain")],
    ids=["co", "co-check", "m-not-kernelpro", "k-deselects"],
)
def test_no_kernelpro_output_when_no_kernel_ran(
    kp_project: pytest.Pytester, args: tuple[str, ...]
) -> None:
    kp_project.makepyfile(test_k=NEG)
    result = kp_project.runpytest(*args)
    assert result.ret == 0
    out = result.stdout.str()
    assert " kernelpro " not in out  # the table's section line
    assert not [line for line in out.splitlines() if line.startswith("kernelpro:")]
    assert "left no record" not in out
    assert not (kp_project.path / ".kernelpro").exists()  # no report, log or history written


def test_correctness_only_runs_are_marked_and_compare_passes_them_over(
    kp_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    kp_project.makepyfile(test_k=NEG)
    kp_project.runpytest().assert_outcomes(passed=2)
    kp_project.runpytest("--kernelpro-correctness-only").assert_outcomes(passed=2)
    monkeypatch.chdir(kp_project.path)
    assert kernelpro_main(["compare"]) == 2  # one timed run: nothing to compare it with
    err = capsys.readouterr().err
    assert "holds 1 timed run(s) (1 run(s) that timed nothing, such as correctness-only" in err

    monkeypatch.setenv(SLOWDOWN_ENV, "1.5")
    kp_project.runpytest().assert_outcomes(passed=2)
    kp_project.runpytest("--kernelpro-correctness-only").assert_outcomes(passed=2)
    runs = sorted((kp_project.path / ".kernelpro" / "history").glob("*.json"))
    assert [json.loads(r.read_text())["meta"]["correctness_only"] for r in runs] == [
        False,
        True,
        False,
        True,
    ]
    capsys.readouterr()
    assert kernelpro_main(["history"]) == 0
    listing = capsys.readouterr().out.splitlines()
    marked = [line for line in listing if "correctness only" in line]
    assert [line.split()[0] for line in marked] == [runs[1].stem, runs[3].stem]  # no -N ref
    assert "-1" in next(line for line in listing if runs[2].stem in line)

    assert kernelpro_main(["compare"]) == 1  # the two timed runs: 1.5x slower, regressed
    out = capsys.readouterr().out
    history = ".kernelpro/history"
    assert out.splitlines()[:2] == [
        f"base {history}/{runs[0].name}",
        f"head {history}/{runs[2].name}",
    ]
    row = next(line for line in out.splitlines() if line.startswith("neg"))
    assert "not timed" not in row
    assert "0.67×" in row  # 1.5x slower: the head of the timed pair


def test_the_cpu_cache_flush_is_said_under_the_table(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(test_k=NEG)
    quiet = kp_project.runpytest()
    quiet.assert_outcomes(passed=2)
    # The default flush is the normal state: said under -v, not on every run.
    assert "CPU timings:" not in quiet.stdout.str()
    flushed = kp_project.runpytest("-v")
    flushed.assert_outcomes(passed=2)
    flushed.stdout.fnmatch_lines(
        [
            "1 kernel(s) on *",
            "CPU timings: cache (* MiB) flushed before every sample of 1 of 1 kernel(s) "
            "(--kernelpro-cpu-flush=auto, the default: flush when the inputs fit in the cache)"
            "*pytest-benchmark*--kernelpro-cpu-flush=off times warm",
        ]
    )
    warm = kp_project.runpytest("--kernelpro-cpu-flush=off")
    warm.assert_outcomes(passed=2)
    warm.stdout.fnmatch_lines(
        ["CPU timings: warm cache, no flush before the samples (--kernelpro-cpu-flush=off)"]
    )


def test_a_nan_output_over_one_trial_reads_right(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(
        test_k="""
import pytest, torch

def inp(device):
    return (torch.randn(64, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, trials=1)
def nan_out(x):
    return torch.full_like(x, float("nan"))
"""
    )
    result = kp_project.runpytest("-rA")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    result.stdout.fnmatch_lines(
        ["correctness: FAILED over 1 trial (rtol *NaN where the reference*"]
    )
    assert "1 trials" not in out
    assert "max abs err 0" not in out
