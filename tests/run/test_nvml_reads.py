"""What the run reads from NVML (run/workers.py, run/isolate.py), against a stand-in `pynvml`:
the GPUs a worker may use, and which processes of a killed child still hold a GPU context.
A missing NVML, a driver that does not start, or an NVML error part-way says "none known",
never raises into the session."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from pytest_kernelpro.run import isolate
from pytest_kernelpro.run.workers import visible_gpu_ids


def fake_nvml(
    monkeypatch: pytest.MonkeyPatch,
    per_gpu: list[list[int]],
    *,
    init_fails: bool = False,
    fails_at_gpu: int | None = None,
    shutdown_fails: bool = False,
) -> list[str]:
    """Install a stand-in `pynvml` whose GPUs run the processes `per_gpu`; returns its calls."""
    calls: list[str] = []
    module: Any = types.ModuleType("pynvml")

    def init() -> None:
        calls.append("init")
        if init_fails:
            raise RuntimeError("NVML_ERROR_DRIVER_NOT_LOADED")

    def handle(index: int) -> int:
        if index == fails_at_gpu:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return index

    def shutdown() -> None:
        calls.append("shutdown")
        if shutdown_fails:
            raise RuntimeError("NVML_ERROR_UNINITIALIZED")

    module.nvmlInit = init
    module.nvmlShutdown = shutdown
    module.nvmlDeviceGetCount = lambda: len(per_gpu)
    module.nvmlDeviceGetHandleByIndex = handle
    module.nvmlDeviceGetComputeRunningProcesses = lambda index: [
        types.SimpleNamespace(pid=pid) for pid in per_gpu[index]
    ]
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return calls


def test_gpu_holders_are_the_asked_pids_on_any_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_nvml(monkeypatch, [[10, 11], [12, 99]], shutdown_fails=True)
    assert isolate._gpu_holders({11, 12, 13}) == {11, 12}  # a failed shutdown changes nothing
    assert calls == ["init", "shutdown"]


def test_an_nvml_error_part_way_keeps_what_was_read(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_nvml(monkeypatch, [[10], [11]], fails_at_gpu=1)
    assert isolate._gpu_holders({10, 11}) == {10}
    assert calls == ["init", "shutdown"]


def test_no_driver_or_no_nvml_knows_no_holder_and_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_nvml(monkeypatch, [[10]], init_fails=True)
    assert isolate._gpu_holders({10}) == set()
    assert visible_gpu_ids({}) == []
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert isolate._gpu_holders({10}) == set()
    assert visible_gpu_ids({}) == []


def test_visible_gpus_come_from_nvml_without_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fake_nvml(monkeypatch, [[], [], []])
    assert visible_gpu_ids({}) == ["0", "1", "2"]
    assert calls == ["init", "shutdown"]
    assert visible_gpu_ids({"CUDA_VISIBLE_DEVICES": "2,-1"}) == ["2"]
