"""`--help`, the JSON report and the README state the same CPU threshold and the same least
CPU tolerance: the numbers the gate uses (gate/verdict.py, gate/verdict_basis.py), not copies
that drift from them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from pytest_kernelpro.config import SETTINGS_BY_NAME
from pytest_kernelpro.gate.verdict import DEFAULT_CPU_THRESHOLD, DEFAULT_GPU_THRESHOLD
from pytest_kernelpro.gate.verdict_basis import (
    BUSY_MEMORY_TOLERANCE,
    BUSY_TOLERANCE,
    PROCESS_TOLERANCE,
)
from pytest_kernelpro.run.session import KernelproSession

README = Path(__file__).resolve().parents[2] / "README.md"


def _percent(value: float) -> str:
    return f"{value:.0%}"


def test_help_names_the_threshold_and_the_least_cpu_tolerance() -> None:
    text = SETTINGS_BY_NAME["threshold"].help
    assert f"{_percent(DEFAULT_GPU_THRESHOLD)} for kernels timed on a CUDA GPU" in text
    assert f"{_percent(DEFAULT_CPU_THRESHOLD)} on the CPU" in text
    assert f"at least {_percent(PROCESS_TOLERANCE)}" in text
    assert f"{_percent(BUSY_TOLERANCE)} on a busy machine" in text
    assert f"{_percent(BUSY_MEMORY_TOLERANCE)} there for a kernel read against" in text


def test_the_json_report_carries_the_same_numbers(tmp_path: Path) -> None:
    settings = SimpleNamespace(
        profile_timeout_s=60.0,
        auto_profiles=0,
        auto_profile_time_s=0.0,
        records_path=tmp_path / "records.jsonl",
        artifacts_dir=tmp_path,
        budget_for=lambda kind: 1.0,
        check=False,
        correctness_only=False,
        threshold=None,
        baseline_path=tmp_path / "baseline.yaml",
        rootpath=tmp_path,
        profile=False,
        save_baseline=None,
    )
    config = SimpleNamespace(option=SimpleNamespace(verbose=0))
    meta = KernelproSession(settings=settings, config=config).report_meta()  # type: ignore[arg-type]
    assert meta["default_thresholds"] == {
        "cuda": DEFAULT_GPU_THRESHOLD,
        "cpu": DEFAULT_CPU_THRESHOLD,
    }
    assert meta["cpu_tolerance_floor"] == {
        "quiet": PROCESS_TOLERANCE,
        "busy": BUSY_TOLERANCE,
        "busy_memory_anchored": BUSY_MEMORY_TOLERANCE,
    }


def test_the_readme_states_the_same_numbers() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert (
        f"the threshold: {_percent(DEFAULT_GPU_THRESHOLD)} on a GPU, "
        f"{_percent(DEFAULT_CPU_THRESHOLD)} on the CPU, where the tolerance is at least "
        f"{_percent(PROCESS_TOLERANCE)}, {_percent(BUSY_TOLERANCE)} on a busy machine"
    ) in text
    assert f"The threshold is {_percent(DEFAULT_CPU_THRESHOLD)}" in text
    assert f"the tolerance is at least {_percent(PROCESS_TOLERANCE)} whatever the threshold" in text
    assert f"{_percent(BUSY_TOLERANCE)} on a busy machine" in text
    assert f"{_percent(BUSY_MEMORY_TOLERANCE)} there for a kernel that is not compute-bound" in text
