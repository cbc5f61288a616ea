"""The gate and autotuning, end to end through pytester (CPU, a stand-in autotuner).

The project below launches one kernel through `tests/measure/standin_autotuner.py`, which
behaves like Triton 3.6's `Autotuner`. Its project conftest replaces the timer with
deterministic samples whose scale is the kernel's cost in this process: the config the
autotuner ran (num_warps=4 is 30% slower than 8), a code slowdown (`KP_CODE_SLOWER`) and a
slowdown that lives in one process only (the first process that finds `slow_process.flag`
claims it). The autotuner's own timings favor the config named by `KP_FAVOR_WARPS`, which
is how one process picks differently from another. The fresh process of a confirmation is a
real subprocess (pytest on the item), loading the same conftest.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import records_by_name

STANDIN = Path(__file__).resolve().parents[1] / "measure" / "standin_autotuner.py"

KSTATE = '''
import os

LAST = {"num_warps": None}


def cost():
    """The kernel's time per call in this process, relative: num_warps=4 is 30% slower than
    8; KP_CODE_SLOWER multiplies it (a code regression)."""
    base = 1.3 if LAST["num_warps"] == 4 else 1.0
    return base * float(os.environ.get("KP_CODE_SLOWER", "1"))
'''

PROJECT_CONFTEST = '''
import itertools
import os

import numpy as np

import kstate
import standin_autotuner
from pytest_kernelpro.measure import timing
from pytest_kernelpro.measure.timing.budget import summarize

_original = []
_calls = itertools.count()
_slow_process = []


def _this_process_is_slow():
    """The first process that finds the flag claims it: its slowdown is its own."""
    if not _slow_process:
        try:
            os.rename("slow_process.flag", f"claimed-{os.getpid()}")
            _slow_process.append(True)
        except FileNotFoundError:
            _slow_process.append(False)
    return _slow_process[0]


def fake_time_kernel(fn, *, device, budget=None, fresh=None):
    fn()
    factor = kstate.cost() * (1.4 if _this_process_is_slow() else 1.0)
    rng = np.random.default_rng([os.getpid(), next(_calls)])
    samples = tuple(float(v) for v in 1e-3 * factor * rng.lognormal(0.0, 0.01, 200))
    return timing.TimingResult(
        samples_s=samples, stats=summarize(samples), method="cpu-perf-counter",
        device="cpu (injected)", stop_reason="max-samples", wall_s=0.0, warmup_runs=0,
        throttled_samples=0, clocks=None, flushed_l2=False, threads=1,
    )


def pytest_configure(config):
    _original.append(timing.time_kernel)
    timing.time_kernel = fake_time_kernel


def pytest_unconfigure(config):
    timing.time_kernel = _original.pop()


def pytest_kernelpro_autotuners():
    return [standin_autotuner.Autotuner]
'''

KERNEL = '''
import os

import pytest
import torch

import kstate
import standin_autotuner as sa


def bench(kernel_call, quantiles):
    """The autotuner's timing of one config: this process favors KP_FAVOR_WARPS."""
    kernel_call()
    favored = int(os.environ.get("KP_FAVOR_WARPS", "8"))
    return [1.0 if kstate.LAST["num_warps"] == favored else 2.0] * 3


@sa.autotune(
    configs=[sa.Config({"BLOCK": 64}, num_warps=4), sa.Config({"BLOCK": 128}, num_warps=8)],
    key=["n"],
    do_bench=bench,
)
@sa.jit
def scale_kernel(x, out, n, BLOCK, num_warps):
    kstate.LAST["num_warps"] = num_warps
    out.copy_(x * 2)


def inp(device):
    return (torch.randn(4096, device=device),)


def twice(x):
    return x * 2


@pytest.mark.kernelpro(reference=twice, inputs=inp)
def scale(x):
    out = torch.empty_like(x)
    scale_kernel[(1,)](x, out, x.numel())
    return out
'''


@pytest.fixture
def tuned_project(kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    kp_project.makepyfile(
        standin_autotuner=STANDIN.read_text(encoding="utf-8"),
        kstate=KSTATE,
        conftest=PROJECT_CONFTEST,
        test_k=KERNEL,
    )
    for name in ("KP_FAVOR_WARPS", "KP_CODE_SLOWER", "KERNELPRO_CONFIRM_PROCESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KP_FAVOR_WARPS", "8")
    kp_project.runpytest("--kernelpro-save-baseline").assert_outcomes(passed=1)
    return kp_project


def _entry(project: pytest.Pytester) -> dict:
    data = yaml.safe_load((project.path / "kernelpro-baseline.yaml").read_text())
    (entry,) = data["kernels"].values()
    return entry


def test_the_choice_is_kept_and_the_same_pick_passes_without_a_note(
    tuned_project: pytest.Pytester,
) -> None:
    (choice,) = _entry(tuned_project)["autotune"]
    assert choice["kernel"] == "test_k.scale_kernel"
    assert choice["key"] == [4096, "torch.float32", "torch.float32"]
    assert choice["config"] == {"BLOCK": 128, "num_warps": 8, "num_ctas": 1, "num_stages": 3}
    assert choice["source"] == "tuned"
    torch_version = __import__("torch").__version__
    assert _entry(tuned_project)["environment"]["torch"] == torch_version
    assert "cudnn.benchmark" in _entry(tuned_project)["library"]
    record = records_by_name(tuned_project)["scale"]
    assert record["autotune"]["choices"][0]["config"]["num_warps"] == 8
    assert record["environment"]["torch"] == torch_version

    tuned_project.runpytest("--kernelpro-check").assert_outcomes(passed=1)
    gate = records_by_name(tuned_project)["scale"]["gate"]
    assert gate["status"] == "ok"
    assert gate.get("autotune_note") is None


def test_a_different_pick_is_said_in_words_and_the_setting_decides(
    tuned_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's process picks num_warps=4 (30% slower); the fresh process pins the
    baseline's num_warps=8 and is not slower: the slowdown is the pick, not the code. pin
    passes it, warn reports it as suspect, fail fails it."""
    monkeypatch.setenv("KP_FAVOR_WARPS", "4")
    for action, outcome, status in (
        ("pin", "passed", "ok"),
        ("warn", "passed", "suspect"),
        ("fail", "failed", "regressed"),
    ):
        result = tuned_project.runpytest(
            "--kernelpro-check", f"--kernelpro-autotune-mismatch={action}", "--junitxml=junit.xml"
        )
        result.assert_outcomes(**{outcome: 1})
        gate = records_by_name(tuned_project)["scale"]["gate"]
        assert gate["status"] == status, action
        assert gate["autotune"]["action"] == action
        note = gate["autotune_note"]
        assert "autotune picked BLOCK=64, num_warps=4 for scale_kernel (key 4096, " in note
        assert "the baseline BLOCK=128, num_warps=8" in note
        assert "the slowdown is the different pick, not the code" in gate["reason"]
        assert gate["autotune"]["decided"] == "pick"
        remeasured = gate["autotune"]["remeasurement"]
        assert remeasured["fresh_process"] is True
        assert remeasured["pins_applied"] == 1
        assert gate["confirmation"]["reproduced"] is False
        assert abs(gate["confirmation"]["change"]) < 0.05  # at the baseline's pick: unchanged
        result.stdout.fnmatch_lines(["*scale: autotune picked BLOCK=64, num_warps=4*"])
        junit = (tuned_project.path / "junit.xml").read_text()
        assert 'name="kernelpro.autotune_note"' in junit


def test_a_code_regression_fails_at_the_baseline_pick_too(
    tuned_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KP_FAVOR_WARPS", "4")
    monkeypatch.setenv("KP_CODE_SLOWER", "1.5")
    result = tuned_project.runpytest("--kernelpro-check")
    result.assert_outcomes(failed=1)
    gate = records_by_name(tuned_project)["scale"]["gate"]
    assert gate["status"] == "regressed"
    assert gate["confirmed"] is True
    assert gate["autotune"]["decided"] == "code"
    # 1.5x at the baseline's pick (the first measurement: 1.3 x 1.5 with the head's own pick)
    still = re.search(r"pinned in a fresh process it is still \+(\d+\.\d)%", gate["reason"])
    assert still is not None
    assert 45.0 < float(still.group(1)) < 55.0
    assert "a code regression, not the pick" in gate["reason"]


def test_a_slowdown_that_lives_in_one_process_does_not_confirm_itself(
    tuned_project: pytest.Pytester,
) -> None:
    """The check's process is 40% slower (it claimed the flag); the fresh process is not:
    not confirmed, so the kernel is suspect, not failed. Confirmed in the same process, the
    slowdown confirms itself."""
    (tuned_project.path / "slow_process.flag").write_text("")
    result = tuned_project.runpytest("--kernelpro-check")
    result.assert_outcomes(passed=1)
    gate = records_by_name(tuned_project)["scale"]["gate"]
    assert gate["change"] > 0.3
    assert gate["status"] == "suspect"
    assert (
        "the re-measurement in a fresh process with the baseline's autotune picks pinned"
        in (gate["reason"])
    )
    assert gate["confirmation"]["reproduced"] is False
    assert gate["autotune"]["remeasurement"]["wall_s"] > 0

    (tuned_project.path / "slow_process.flag").write_text("")
    same = tuned_project.runpytest("--kernelpro-check", "--kernelpro-confirm-process=same")
    same.assert_outcomes(failed=1)
    gate = records_by_name(tuned_project)["scale"]["gate"]
    assert gate["status"] == "regressed"
    assert "confirmed by a re-measurement (" in gate["reason"]


def test_a_changed_environment_and_an_unpinnable_config_are_named(
    tuned_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The baseline ran another torch, and its config was since removed from the kernel's
    configs (a code change): the regression names the torch change, and says the pick could
    not be pinned (the re-measurement ran with its own pick and reproduced the slowdown)."""
    path = tuned_project.path / "kernelpro-baseline.yaml"
    data = yaml.safe_load(path.read_text())
    (entry,) = data["kernels"].values()
    entry["environment"]["torch"] = "2.10.0"
    entry["autotune"][0]["config"]["BLOCK"] = 256
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setenv("KP_CODE_SLOWER", "1.5")
    result = tuned_project.runpytest("--kernelpro-check")
    result.assert_outcomes(failed=1)
    gate = records_by_name(tuned_project)["scale"]["gate"]
    torch_now = __import__("torch").__version__
    assert f"torch 2.10.0 -> {torch_now}" in gate["reason"]
    assert gate["environment_change"] == {"torch": {"baseline": "2.10.0", "now": torch_now}}
    result.stdout.fnmatch_lines(["*environment changed since the baseline: torch 2.10.0 -> *"])
    assert "could not be pinned" in gate["reason"]
    assert "BLOCK=256" in gate["reason"]
    assert "is not among the kernel's configs now" in gate["reason"]
    report = json.loads((tuned_project.path / ".kernelpro" / "kernelpro-report.json").read_text())
    assert report["records"][0]["gate"]["autotune"]["decided"] == "unpinned"
