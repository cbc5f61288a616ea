"""An item gets an autotune capture only when there is something to watch or pin
(`run.context.autotune_capture`): no capture is the same record as an empty capture, and
every way an autotuner can be present still gets one."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pytest_kernelpro.measure import environment
from pytest_kernelpro.measure.autotune_capture import AutotuneCapture
from pytest_kernelpro.record import KernelRecord
from pytest_kernelpro.run.context import autotune_capture, record_process_facts, watching


class StandinAutotuner:
    """An autotuner class: the capture patches its `run` while watching."""

    def run(self, *args: Any, **kwargs: Any) -> str:
        return "ran"


def _run(language: str = "pytorch") -> Any:
    record = KernelRecord(nodeid="t.py::k", name="k", kernel="k", device_kind="cpu")
    return SimpleNamespace(problem=SimpleNamespace(language=language), record=record)


@pytest.fixture
def no_known_autotuner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton's autotuner module counts as not loaded, whatever this machine has."""
    monkeypatch.setattr(environment, "KNOWN_AUTOTUNERS", (("kp_absent.autotuner", "Autotuner"),))


def test_nothing_to_watch_or_pin_gets_no_capture_and_the_same_record(
    no_known_autotuner: None,
) -> None:
    run = _run()
    assert autotune_capture(run, None, []) is None
    record_process_facts(run, None)
    without = run.record.autotune
    record_process_facts(run, AutotuneCapture())
    assert without == run.record.autotune  # library settings alone, as an empty capture's
    assert without is not None
    assert without.choices == ()
    assert without.library


def test_no_capture_watches_nothing(no_known_autotuner: None) -> None:
    tuner = StandinAutotuner()
    with watching(None):
        assert tuner.run() == "ran"


def test_an_autotuner_a_conftest_adds_is_watched(no_known_autotuner: None) -> None:
    capture = autotune_capture(_run(), None, [StandinAutotuner])
    assert isinstance(capture, AutotuneCapture)
    original = StandinAutotuner.__dict__["run"]
    with watching(capture):
        assert StandinAutotuner.__dict__["run"] is not original  # patched while watching
    assert StandinAutotuner.__dict__["run"] is original


def test_an_autotuner_module_loaded_while_the_kernel_was_built_is_watched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel whose module imports the autotuner lazily (when the kernel is built, before
    the capture is chosen) still gets a capture: the choice reads `sys.modules` then."""
    module = types.ModuleType("kp_lazy.autotuner")
    module.Autotuner = StandinAutotuner  # type: ignore[attr-defined]
    monkeypatch.setattr(environment, "KNOWN_AUTOTUNERS", (("kp_lazy.autotuner", "Autotuner"),))
    assert autotune_capture(_run(), None, []) is None
    monkeypatch.setitem(sys.modules, "kp_lazy.autotuner", module)
    assert isinstance(autotune_capture(_run(), None, []), AutotuneCapture)


def test_pins_always_get_a_capture(no_known_autotuner: None, tmp_path: Path) -> None:
    """A confirmation's pins must be applied (and their problems said) even where no
    autotuner is loaded yet."""
    pins = tmp_path / "pins.json"
    pins.write_text('[{"kernel": "m.k", "key": null, "config": {"BLOCK": 16}}]')
    capture = autotune_capture(_run(), str(pins), [])
    assert isinstance(capture, AutotuneCapture)
    assert [p.kernel for p in capture.pins] == ["m.k"]
