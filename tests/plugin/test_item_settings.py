"""One resolution of a kernel item's settings: marker > command line > KERNELPRO_* environment >
ini > conftest defaults > built-in, each value with its source (`run.context.ItemSettings`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from conftest import records_by_name

from pytest_kernelpro.problem import Problem
from pytest_kernelpro.run.context import TOLERANCE_BY_DTYPE, ItemSettings


def _problem(**marker: Any) -> Problem:
    return Problem(
        name="k",
        kernel_factory=lambda device: abs,
        reference_factory=lambda device: abs,
        input_factory=lambda device: (1,),
        kind="function",
        source_file="test_k.py",
        **marker,
    )


def _session(**values: Any) -> Any:
    """The session-wide part of the chain as `KernelproConfig` holds it (values + sources)."""
    settings = {"threshold": None, "trials": 3, "device": "auto"}
    sources = {"threshold": "default", "trials": "default", "device": "default"}
    for name, (value, source) in values.items():
        settings[name], sources[name] = value, source
    return SimpleNamespace(**settings, sources=sources)


def test_the_marker_wins_over_the_session_for_every_setting() -> None:
    problem = _problem(
        threshold=0.3, trials=7, rtol=1e-3, atol=1e-4, min_roofline=0.5, device_given="cpu"
    )
    session = _session(
        threshold=(0.1, "command line --kernelpro-threshold"),
        trials=(2, "ini key kernelpro_trials"),
        device=("cpu", "environment variable KERNELPRO_DEVICE"),
    )
    got = ItemSettings.resolve(problem, session, "cpu")
    assert (got.threshold.value, got.trials.value) == (0.3, 7)
    assert (got.rtol.value, got.atol.value, got.min_roofline.value) == (1e-3, 1e-4, 0.5)
    assert got.device.value == "cpu"
    assert {name: entry["source"] for name, entry in got.to_dict().items()} == {
        "threshold": "marker threshold=",
        "trials": "marker trials=",
        "rtol": "marker rtol=",
        "atol": "marker atol=",
        "min_roofline": "marker min_roofline=",
        "device": "marker device=",
    }


def test_without_a_marker_value_the_session_value_keeps_its_source() -> None:
    session = _session(
        threshold=(0.1, "command line --kernelpro-threshold"),
        trials=(5, "conftest pytest_kernelpro_defaults"),
        device=("cuda:1", "environment variable KERNELPRO_DEVICE"),
    )
    got = ItemSettings.resolve(_problem(), session, "cuda:1")
    assert got.threshold == type(got.threshold)(0.1, "command line --kernelpro-threshold")
    assert (got.trials.value, got.trials.source) == (5, "conftest pytest_kernelpro_defaults")
    assert (got.device.value, got.device.source) == (
        "cuda:1",
        "environment variable KERNELPRO_DEVICE",
    )


@pytest.mark.parametrize(("device", "threshold"), [("cuda", 0.02), ("cuda:0", 0.02), ("cpu", 0.05)])
def test_built_in_values(device: str, threshold: float) -> None:
    got = ItemSettings.resolve(_problem(), _session(), device)
    kind = device.partition(":")[0]
    assert (got.threshold.value, got.threshold.source) == (
        threshold,
        f"built-in for a {kind} kernel",
    )
    assert (got.trials.value, got.trials.source) == (3, "default")
    assert (got.rtol.value, got.rtol.source) == (None, TOLERANCE_BY_DTYPE)
    assert (got.atol.value, got.atol.source) == (None, TOLERANCE_BY_DTYPE)
    assert got.min_roofline.value is None
    assert got.device.source == f"default (auto: {kind})"


KERNELS = """
import pytest, torch

def inp(device):
    return (torch.ones(64, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def plain(x):
    return -x

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp, threshold=0.3, trials=2)
def marked(x):
    return -x
"""


# The sources the report names for threshold and trials, by the top layer set.
LAYER_SOURCES = {
    (): ("built-in for a cpu kernel", "default"),
    ("conftest",): ("conftest pytest_kernelpro_defaults", "conftest pytest_kernelpro_defaults"),
    ("ini",): ("ini key kernelpro_threshold", "ini key kernelpro_trials"),
    ("env",): ("environment variable KERNELPRO_THRESHOLD", "environment variable KERNELPRO_TRIALS"),
    ("cli",): ("command line --kernelpro-threshold", "command line --kernelpro-trials"),
}


@pytest.mark.parametrize(
    ("layers", "threshold", "trials"),
    [
        ((), 0.05, 3),  # built-in (CPU) and default
        (("conftest",), 0.25, 4),
        (("conftest", "ini"), 0.2, 5),
        (("conftest", "ini", "env"), 0.15, 6),
        (("conftest", "ini", "env", "cli"), 0.1, 7),
    ],
)
def test_precedence_through_a_pytest_run(
    kp_project: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
    layers: tuple[str, ...],
    threshold: float,
    trials: int,
) -> None:
    """Each layer overrides the ones below it; the marker overrides them all."""
    kp_project.makepyfile(test_k=KERNELS)
    if "conftest" in layers:
        kp_project.makeconftest(
            """
            def pytest_kernelpro_defaults(config):
                return {"threshold": 0.25, "trials": 4}
            """
        )
    if "ini" in layers:
        ini = (kp_project.path / "tox.ini").read_text()
        kp_project.makeini(ini.rstrip() + "\nkernelpro_threshold = 0.2\nkernelpro_trials = 5\n")
    if "env" in layers:
        monkeypatch.setenv("KERNELPRO_THRESHOLD", "0.15")
        monkeypatch.setenv("KERNELPRO_TRIALS", "6")
    args = ["--kernelpro-device=cpu"]
    if "cli" in layers:
        args += ["--kernelpro-threshold=0.1", "--kernelpro-trials=7"]
    kp_project.runpytest(*args).assert_outcomes(passed=2)
    records = records_by_name(kp_project)
    assert records["plain"]["threshold"] == pytest.approx(threshold)
    assert records["plain"]["correctness"]["trials"] == trials
    assert records["marked"]["threshold"] == pytest.approx(0.3)
    assert records["marked"]["correctness"]["trials"] == 2
    # The JSON report names each resolved setting's value and where it came from.
    plain, marked = records["plain"]["settings"], records["marked"]["settings"]
    assert set(plain) == {"threshold", "trials", "rtol", "atol", "min_roofline", "device"}
    assert plain["threshold"]["value"] == pytest.approx(threshold)
    assert plain["trials"]["value"] == trials
    assert (plain["threshold"]["source"], plain["trials"]["source"]) == LAYER_SOURCES[layers[-1:]]
    assert marked["threshold"] == {"value": 0.3, "source": "marker threshold="}
    assert marked["trials"] == {"value": 2, "source": "marker trials="}
    for name in ("rtol", "atol"):
        assert plain[name] == {"value": None, "source": TOLERANCE_BY_DTYPE}
    assert plain["min_roofline"] == {"value": None, "source": "built-in: no floor"}
    assert plain["device"] == {"value": "cpu", "source": "command line --kernelpro-device"}


@pytest.mark.parametrize("mode", [[], ["--kernelpro-check", "--kernelpro-save-baseline"]])
def test_one_min_roofline_rule_in_both_modes(
    kp_project: pytest.Pytester, injected_timing: list[float], mode: list[str]
) -> None:
    """Outside check mode the item applies the floor, in check mode the verdict does: the
    same rule (`gate.verdict.roofline_floor`), the same reason."""
    kp_project.makepyfile(
        test_k="""
        import pytest, torch
        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(64),),
                               min_roofline=0.99)
        def far_below(x):
            return -x

        @pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.ones(64),))
        def no_floor(x):  # so the bootstrapping check run has a baseline to save
            return -x
        """
    )
    result = kp_project.runpytest("--kernelpro-device=cpu", *mode)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*far_below*reaches *% of its roofline, below min_roofline=99%*"])
    record = records_by_name(kp_project)["far_below"]
    assert record["min_roofline"] == 0.99
    assert record["efficiency"] < 0.99
