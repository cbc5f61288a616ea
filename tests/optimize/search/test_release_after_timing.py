"""The worker gives back what its timing freed before the call after timing
(`harness._Pipeline.time`): on a GPU torch's cached blocks would otherwise sit under that
call's own allocations (its inputs, both outputs, the early copy). The CUDA case reads the
allocator's own counts at the "timed" phase; the CPU stand-in runs the same pipeline and
sees the release come between the timing and that phase."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_kernelpro.optimize.sandbox import handles, harness

torch = pytest.importorskip("torch")

REFERENCE = (
    "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return torch.softmax(x, dim=-1)\n\n\n"
    "def get_inputs():\n    return [torch.randn(256, 4096)]\n\n\n"
    "def get_init_inputs():\n    return []\n"
)
CANDIDATE = (
    "import torch\nfrom torch import nn\n\n\nclass ModelNew(nn.Module):\n"
    "    def forward(self, x):\n        return torch.nn.functional.softmax(x, dim=-1)\n"
)
QUICK = {"warmup_ms": 1.0, "max_time_s": 0.01, "min_samples": 2, "max_samples": 3}


def run(device: str, progress: Any, shape: str = "256, 4096") -> dict[str, Any]:
    import sys

    reference = REFERENCE.replace("256, 4096", shape)
    task = {"reference": reference, "candidate": CANDIDATE, "device": device,
            "timing": dict(QUICK), "cpu_threads": 1}  # fmt: skip
    try:
        return harness.run_task(task, progress)
    finally:
        for name in ("kernelpro_candidate", "kernelpro_reference"):
            sys.modules.pop(name, None)


def test_the_timings_freed_memory_goes_back_before_the_call_after_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events: list[str] = []
    release = handles.release_freed_heap

    def recorded() -> None:
        events.append("release")
        release()

    monkeypatch.setattr(harness, "release_freed_heap", recorded)  # the name it calls
    result = run("cpu", events.append)
    assert result["status"] == "correct", result.get("reason")
    timing = events.index("timing")
    assert events[timing + 1 : timing + 3] == ["release", "timed"], events


@pytest.mark.gpu
def test_the_timings_cached_cuda_blocks_are_given_back_before_the_call_after_timing() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    held: dict[str, int] = {}

    def progress(phase: str) -> None:
        if phase == "timed":
            torch.cuda.synchronize()
            held["timed"] = torch.cuda.memory_reserved()
            held["peak"] = torch.cuda.max_memory_reserved()

    # 64 MiB inputs and outputs: the timing holds at least four of them (its fresh content and
    # a checked call's outputs). Left cached, what torch reserves at the call after timing is
    # its peak; given back, at least two of them less.
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    result = run("cuda", progress, shape="2048, 8192")
    assert result["status"] == "correct", result.get("reason")
    assert held["timed"] <= held["peak"] - 2 * 64 * 1024 * 1024, held
