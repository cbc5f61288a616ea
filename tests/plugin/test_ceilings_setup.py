"""The machine's ceilings are set-up, not an item's work (measure/ceilings.py,
run/item_runner.py `_device_model`): measured once per machine and user in a cache
outside the project, before the first item's time limit starts, and a session stopped during
the probe keeps nothing half-measured."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import records_by_name

from pytest_kernelpro.measure import ceiling_probe as probe_module
from pytest_kernelpro.measure.ceilings import (
    CACHE_DIR_ENV,
    CACHE_SCHEMA,
    Ceilings,
    cache_path,
    default_cache_dir,
    machine_identity,
    resolve_device,
)
from pytest_kernelpro.run import item_runner

KERNEL = """
import pytest, torch
@pytest.mark.kernelpro(reference=torch.neg, inputs=lambda device: (torch.randn(1000, device=device),))
def neg(x):
    return -x
"""

INI = """
[pytest]
kernelpro_device = cpu
kernelpro_time_budget = 0.2
kernelpro_warmup_ms = 1
"""


def _ceilings() -> Ceilings:
    return Ceilings(
        device=resolve_device("cpu")[1],
        bandwidth_Bps=10e9,
        flops={"fp32": 1e13, "fp64": 5e12, "bf16": 1e13},
        source="measured",
        measured_at="2026-12-05T00:00:00+00:00",
        torch_version=torch.__version__,
        details={"probe_passes": 3, "threads": 1},
    )


@pytest.fixture
def own_cache(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ceilings cache of this test's own, and a CPU project beside it."""
    folder = pytester.path / "user-cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(folder))
    pytester.makeini(INI)
    pytester.makepyfile(test_k=KERNEL)
    return folder


PROBE_S = 1000.0  # the stand-in probe's time on the item runner's clock


class _ShiftedClock:
    """`time` as the item runner sees it: perf_counter ahead of the real one by `shift`."""

    def __init__(self) -> None:
        self.shift = 0.0

    def perf_counter(self) -> float:
        return time.perf_counter() + self.shift

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_a_probe_longer_than_the_item_time_limit_does_not_fail_the_item(
    own_cache: Path,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
) -> None:
    # No wall-clock race (a loaded machine once spent the item's 1 s limit starting the item):
    # the probe takes PROBE_S on the item runner's clock, far past any item limit, without
    # sleeping, and looks whether an item's limit (its ITIMER_REAL alarm) is armed while it
    # runs. The limit is generous, so only a probe inside it could make the item fail.
    clock = _ShiftedClock()
    monkeypatch.setattr(item_runner, "time", clock)
    armed: list[tuple[float, float]] = []

    def slow_probe(device: str, **kw: object) -> Ceilings:
        armed.append(signal.getitimer(signal.ITIMER_REAL))
        clock.shift += PROBE_S
        return _ceilings()

    monkeypatch.setattr(probe_module, "measure_ceilings", slow_probe)
    result = pytester.runpytest(f"--kernelpro-item-timeout={PROBE_S / 2:.0f}")
    result.assert_outcomes(passed=1)
    assert armed == [(0.0, 0.0)]  # probed once, with no item's limit running
    record = records_by_name(pytester)["neg"]
    assert record["outcome"] == "passed"
    # The record's time is the item's own: the probe is kept apart, not added to it.
    assert record["extra"]["machine_setup_s"] >= PROBE_S
    assert record["wall_s"] < PROBE_S
    assert _files(own_cache) == [cache_path(own_cache, _ceilings().device, torch.__version__,
                                            False, 1).name]  # fmt: skip


def test_a_kernel_that_overruns_the_limit_still_fails_when_the_probe_is_outside_it(
    own_cache: Path,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The attack on the change: moving the probe out of the limit must not lift the limit
    # off the kernel's own work.
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, **kw: _ceilings())
    pytester.makepyfile(test_k=KERNEL.replace("return -x", "import time; time.sleep(3); return -x"))
    result = pytester.runpytest("--kernelpro-item-timeout=1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*neg*time limit of 1 s*"])


def test_a_session_stopped_during_the_probe_keeps_nothing_and_the_next_starts_clean(
    own_cache: Path,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
) -> None:
    def interrupted(device: str, **kw: object) -> Ceilings:
        raise KeyboardInterrupt  # Ctrl-C (or CI's cancel) in the middle of the probe

    monkeypatch.setattr(probe_module, "measure_ceilings", interrupted)
    with pytest.raises(KeyboardInterrupt):  # in-process pytester hands the interrupt on
        pytester.runpytest()
    assert _files(own_cache) == []  # nothing half-measured, no temporary file either

    probes: list[str] = []
    monkeypatch.setattr(
        probe_module,
        "measure_ceilings",
        lambda device, **kw: probes.append(device) or _ceilings(),
    )
    pytester.runpytest().assert_outcomes(passed=1)
    assert probes == ["cpu"]


def test_an_interrupt_while_the_cache_is_written_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from pytest_kernelpro import fileio

    def stopped_in_fsync(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, **kw: _ceilings())
    monkeypatch.setattr(fileio.os, "fsync", stopped_in_fsync)
    torch.set_num_threads(1)
    with pytest.raises(KeyboardInterrupt):
        probe_module.load_or_measure_ceilings("cpu", tmp_path)
    assert os.listdir(tmp_path) == []


def test_a_second_checkout_reads_the_cache_and_never_probes(
    own_cache: Path,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
) -> None:
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, **kw: _ceilings())
    pytester.runpytest().assert_outcomes(passed=1)
    assert not (pytester.path / ".kernelpro" / "cache").exists()  # nothing in the project

    other = pytester.mkdir("second-checkout")
    (other / "pytest.ini").write_text(INI)
    (other / "test_k.py").write_text(KERNEL)
    monkeypatch.chdir(other)
    monkeypatch.setattr(probe_module, "measure_ceilings", pytest.fail)  # no second probe
    result = pytester.runpytest(str(other))
    result.assert_outcomes(passed=1)
    record = json.loads((other / ".kernelpro" / "kernelpro-report.json").read_text())["records"]
    assert record[0]["outcome"] == "passed"


def test_a_corrupt_cache_file_is_measured_again_and_replaced(
    own_cache: Path,
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    injected_timing: list[float],
) -> None:
    path = cache_path(own_cache, _ceilings().device, torch.__version__, False, 1)
    path.parent.mkdir(parents=True)
    path.write_text('{"schema": ' + str(CACHE_SCHEMA) + ', "ceilings": {"dev')  # cut short
    monkeypatch.setattr(probe_module, "measure_ceilings", lambda device, **kw: _ceilings())
    result = pytester.runpytest("-W", "ignore::pytest_kernelpro.errors.KernelproWarning")
    result.assert_outcomes(passed=1)
    assert json.loads(path.read_text())["ceilings"]["bandwidth_Bps"] == 10e9


def test_the_default_cache_is_per_user_and_machine_outside_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert default_cache_dir({CACHE_DIR_ENV: str(tmp_path / "mine")}) == tmp_path / "mine"
    xdg = default_cache_dir({"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert xdg == tmp_path / "xdg" / "pytest-kernelpro" / machine_identity()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = default_cache_dir({})
    assert home == tmp_path / "home" / ".cache" / "pytest-kernelpro" / machine_identity()
    # A relative XDG_CACHE_HOME is invalid (XDG spec): it would move with the working folder.
    assert default_cache_dir({"XDG_CACHE_HOME": "relative/cache"}) == home
    assert machine_identity() == machine_identity()  # stable within a machine


def test_the_machine_identity_changes_with_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    here = machine_identity()
    monkeypatch.setattr(probe_module.os, "cpu_count", lambda: 512)
    assert machine_identity() != here  # other hardware: another cache
