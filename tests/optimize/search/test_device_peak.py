"""The GPU memory sampler of a CUDA problem's evaluation (`sandbox/device_peak.py`), on the CPU
with a stand-in count of used bytes, and its use by the evaluator: a CPU problem gets none."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox.device_peak import DevicePeak

GiB = 2**30


class _UsedBytes:
    """A device whose used memory goes through `levels`, one per read, then stays at the last;
    `seen` is set once every level was read."""

    def __init__(self, levels: list[int]) -> None:
        self.levels = levels
        self.reads = 0
        self.seen = threading.Event()

    def __call__(self) -> int:
        level = self.levels[min(self.reads, len(self.levels) - 1)]
        self.reads += 1
        if self.reads >= len(self.levels):
            self.seen.set()
        return level


def test_the_peak_is_the_largest_use_above_the_start_even_when_it_was_brief() -> None:
    used = _UsedBytes([10 * GiB, 11 * GiB, 16 * GiB, 12 * GiB, 10 * GiB])
    sampler = DevicePeak(used, where=lambda: f"at read {used.reads}", interval_s=0.001)
    assert used.seen.wait(30), "the sampler never read the later levels"
    assert sampler.stop() == 6 * GiB  # 16 GiB at its peak, 10 GiB at the start
    assert sampler.at == "at read 3"  # where the processes were when it was read
    assert sampler.stop() == 6 * GiB  # a second stop changes nothing
    reads = used.reads
    assert sampler.stop() == 6 * GiB
    assert used.reads == reads  # and reads nothing more


def test_a_use_seen_only_at_the_stop_counts() -> None:
    used = _UsedBytes([2 * GiB])
    sampler = DevicePeak(used, interval_s=3600)  # no sample between the start and the stop
    used.levels = [2 * GiB, 5 * GiB]
    assert sampler.stop() == 3 * GiB


def test_memory_given_back_below_the_start_is_no_negative_peak() -> None:
    used = _UsedBytes([8 * GiB, 4 * GiB])
    sampler = DevicePeak(used, where=lambda: "never a peak", interval_s=0.001)
    assert used.seen.wait(30)
    assert sampler.stop() == 0
    assert sampler.at is None


def test_a_cpu_problem_gets_no_sampler() -> None:
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from pytest_kernelpro.optimize.sandbox.evaluator import SandboxEvaluator

    evaluator = SimpleNamespace(task=SimpleNamespace(device="cpu"))
    assert SandboxEvaluator._device_peak(evaluator, Path("unused")) is None  # type: ignore[arg-type]
