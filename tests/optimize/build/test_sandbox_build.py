"""The sandboxed evaluator with fast-path candidates on the CPU: the kernels are compiled
ahead, the worker finds them in the (read-only) cache, the build time is recorded, and a
compile error reaches the evaluation trimmed. Worker processes import torch: slow."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildkit import CANDIDATE

from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate
from pytest_kernelpro.optimize.search.trajectory import node_record
from pytest_kernelpro.optimize.search.tree import SearchTree

pytestmark = pytest.mark.slow

REFERENCE = Path(__file__).resolve().parents[2] / "data" / "search" / "cpu" / "reference.py"


@pytest.fixture(scope="module")
def evaluations(tmp_path_factory: pytest.TempPathFactory):
    from buildkit import require_tool

    nvcc = require_tool("nvcc")
    cache_dir = tmp_path_factory.mktemp("build-cache")
    task = KernelBenchTask(REFERENCE.read_text(), name="softmax_linear", device="cpu")
    limits = SandboxLimits(
        build_timeout_s=180.0, run_timeout_s=90.0, memory_limit_mb=2048,
        build_cache_dir=str(cache_dir), build_jobs=2,
    )  # fmt: skip
    broken = CANDIDATE.replace("a[i] + b[i]", "a[i] + missing_name[i]")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNELPRO_CUDA_ARCH", "sm_90a")  # build for the H200 on this CPU machine
        mp.setenv("CUDA_HOME", str(Path(nvcc).resolve().parent.parent))
        evaluator = SandboxEvaluator(task, limits)
        candidates = [Candidate(CANDIDATE), Candidate(broken)]
        evaluator.prepare(candidates)
        try:
            results = [evaluator.evaluate(c) for c in candidates]
        finally:
            evaluator.close()
    return dict(zip(("good", "broken"), results, strict=True)), cache_dir


def test_the_worker_uses_the_kernel_built_ahead(evaluations) -> None:
    results, cache_dir = evaluations
    good = results["good"]
    # No GPU here: the kernel built, the launch cannot run.
    assert good.status == "run_error", good.reason
    build = good.metrics["build"]
    assert build["prebuild"]["errors"] == []
    assert len(build["prebuild"]["builds"]) == 1
    ahead = build["prebuild"]["builds"][0]
    (in_worker,) = build["builds"]
    assert in_worker["hit"] is True
    assert in_worker["key"] == ahead["key"]
    assert in_worker["cubin"].startswith(str(cache_dir))
    assert ahead["seconds"] > 0
    assert build["prebuild"]["build_s"] >= ahead["seconds"]
    assert good.build_s >= build["prebuild"]["waited_s"]
    assert good.build_s >= build["worker_s"] > 0


def test_a_compile_error_is_a_build_error_with_the_trimmed_message(evaluations) -> None:
    broken = evaluations[0]["broken"]
    assert broken.status == "build_error"
    assert 'identifier "missing_name" is undefined' in broken.reason
    assert 'error: identifier "missing_name" is undefined' in broken.build_log
    assert "1 error detected" in broken.build_log
    assert "Traceback" not in broken.build_log  # the compiler's words, not a Python stack
    assert "<kernelpro_candidate>" in broken.build_log  # where the candidate called the build
    assert broken.build_s > 0


def test_build_time_is_in_the_trajectory_record(evaluations) -> None:
    good = evaluations[0]["good"]
    tree = SearchTree()
    node = tree.add(tree.root, Candidate(CANDIDATE), good, 0.0, mode="initial")
    assert node_record(node)["build_s"] == good.build_s > 0
