"""The conftest templates load, set their defaults, and leave pytest-kernelpro's precedence
(command line > environment > ini > template default) intact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TEMPLATES = Path(__file__).resolve().parents[2] / "conftest_templates"

# Writes the settings pytest-kernelpro resolved, so the test can read them back.
INSPECT = """
import json
from pathlib import Path

from pytest_kernelpro.run.items import PLUGIN_NAME

def pytest_sessionfinish(session):
    kp = session.config.pluginmanager.get_plugin(PLUGIN_NAME)
    s = kp.settings
    Path("settings.json").write_text(json.dumps({
        "device": s.device, "time_budget_s": s.time_budget_s, "threshold": s.threshold,
        "target_rel_ci": s.target_rel_ci, "baseline": str(s.baseline_path),
        "problems": str(s.problems) if s.problems else None,
        "only": session.config.getoption("kernelpro_only"),
        "sources": s.sources,
    }))
"""


def _settings(pytester: pytest.Pytester, template: str, *args: str) -> dict:
    pytester.makeconftest((TEMPLATES / template).read_text(encoding="utf-8"))
    pytester.makepyfile(inspect_plugin=INSPECT, test_nothing="def test_nothing():\n    pass\n")
    pytester.syspathinsert()
    # Other installed plugins stay out of the inner run (pytest-benchmark warns under xdist).
    result = pytester.runpytest("-p", "inspect_plugin", "-p", "no:benchmark", *args)
    assert result.ret in (0, 5), result.stdout.str()
    return json.loads((pytester.path / "settings.json").read_text(encoding="utf-8"))


def test_gpu_runner_defaults(pytester: pytest.Pytester) -> None:
    s = _settings(pytester, "gpu_runner.py")
    assert s["device"] == "cuda"
    assert s["time_budget_s"] == 3.0
    assert s["target_rel_ci"] == 0.003
    assert s["baseline"].endswith("kernelpro-baseline.yaml")
    assert s["sources"]["time_budget"] == "conftest pytest_kernelpro_defaults"


def test_cli_env_and_ini_still_win(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\nkernelpro_threshold = 0.2\n")
    monkeypatch.setenv("KERNELPRO_TIME_BUDGET", "7")
    s = _settings(pytester, "gpu_runner.py", "--kernelpro-device=cpu")
    assert s["device"] == "cpu"  # command line
    assert s["time_budget_s"] == 7.0  # environment
    assert s["threshold"] == 0.2  # ini
    assert s["target_rel_ci"] == 0.003  # template default for the rest


def test_cpu_laptop_defaults(pytester: pytest.Pytester) -> None:
    s = _settings(pytester, "cpu_laptop.py")
    assert s["device"] == "cpu"
    assert s["threshold"] == 0.15
    assert s["baseline"].endswith("laptop-baseline.yaml")


def test_kernelbench_dir_defaults(pytester: pytest.Pytester) -> None:
    s = _settings(pytester, "kernelbench_dir.py")
    assert s["only"] is True
    assert Path(s["problems"]) == pytester.path
