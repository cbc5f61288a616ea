"""The sandbox on a GPU without nvcc builds: PyTorch and Triton candidates (skipped on CPU)."""

from __future__ import annotations

import pytest

from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

REFERENCE = """
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return a * 2 + b


def get_inputs():
    return [torch.rand(1 << 22), torch.rand(1 << 22)]


def get_init_inputs():
    return []
"""

HEAD = "import torch\nimport torch.nn as nn\n"

CANDIDATES = {
    "correct": HEAD
    + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.addcmul(b, a, torch.full_like(a, 2.0))
""",
    "side_stream": HEAD
    + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, a, b):
        with torch.cuda.stream(self.side):  # not joined back: escapes the timing events
            return torch.addcmul(b, a, torch.full_like(a, 2.0))
""",
    "gpu_oom": HEAD
    + """
class ModelNew(nn.Module):
    def forward(self, a, b):
        return torch.empty(2 * 1024 ** 4 // 4, device=a.device)[: a.numel()] + b  # 2 TB
""",
    "triton_out_of_bounds": HEAD
    + """
import triton
import triton.language as tl


@triton.jit
def far_store(out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs + (1 << 40), tl.zeros([BLOCK], dtype=tl.float32))


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.empty_like(a)
        far_store[(a.numel() // 1024,)](out, BLOCK=1024)
        return out
""",
}


@pytest.fixture(scope="module")
def results() -> dict[str, Evaluation]:
    task = KernelBenchTask(REFERENCE, name="axpy", device="cuda")
    evaluator = SandboxEvaluator(task, SandboxLimits(build_timeout_s=180, run_timeout_s=60))
    names = [*CANDIDATES, "correct_after"]
    sources = [*CANDIDATES.values(), CANDIDATES["correct"]]
    return dict(zip(names, (evaluator.evaluate(Candidate(s)) for s in sources), strict=True))


def test_correct_on_gpu(results: dict[str, Evaluation]) -> None:
    ev = results["correct"]
    assert ev.status == "correct", ev.reason or ev.logs
    assert ev.timing["candidate"]["method"] == "cuda-events"


def test_side_stream_is_a_cheat(results: dict[str, Evaluation]) -> None:
    ev = results["side_stream"]
    assert ev.status == "cheat", ev.reason
    assert "stream" in (ev.reason or "")


def test_gpu_out_of_memory(results: dict[str, Evaluation]) -> None:
    ev = results["gpu_oom"]
    assert ev.status == "run_error", ev.reason
    assert (ev.reason or "").startswith("out of memory"), ev.reason


def test_illegal_address_fails_only_that_candidate(results: dict[str, Evaluation]) -> None:
    ev = results["triton_out_of_bounds"]
    assert ev.status == "run_error", ev.reason
    assert "illegal" in (ev.reason or "").lower() or "worker died" in (ev.reason or ""), ev.reason
    after = results["correct_after"]  # a fresh process: the GPU is usable again
    assert after.status == "correct", after.reason or after.logs


def test_an_honest_gpu_winner_is_confirmed_by_the_same_method(
    results: dict[str, Evaluation],
) -> None:
    """The confirmation re-times with the search's method (the gate's CUDA timer on fresh
    inputs with checked outputs): an honest candidate lands within the GPU's 1.25x (the
    H200 run of the earlier method: 1.0003x and 1.012x,
    bench/results/2026-12-01-optimize-h200.md)."""
    task = KernelBenchTask(REFERENCE, name="axpy", device="cuda")
    evaluator = SandboxEvaluator(task, SandboxLimits(build_timeout_s=180, run_timeout_s=60))
    honest = Candidate(CANDIDATES["correct"])
    confirmed = evaluator.confirm(honest, results["correct"])
    assert confirmed.status == "correct", confirmed.reason
    record = confirmed.timing["confirmed"]
    assert record["method"].startswith("the gate's timer (cuda-events), fresh inputs")
    assert record["tolerance"] == 1.25
    assert record["ratio"] <= 1.25
    assert record["honesty"]["checked_calls"] >= 1
