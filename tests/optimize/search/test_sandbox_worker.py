"""The sandboxed evaluator with real worker processes (each imports torch: seconds each).

All candidates of one task are evaluated once, in parallel, by a module-scoped fixture;
the tests then read their evaluations. The hang runs with a 3 s run timeout on its own.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation
from pytest_kernelpro.optimize.search.mcts import MCTS

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "data" / "search" / "cpu"
SECRET = "sk-kernelpro-test-0123456789"
FAST_TIMING = {
    "timing": {
        "warmup_ms": 1.0,
        "max_time_s": 0.02,
        "min_samples": 5,
        "max_samples": 10,
        "flush_l2": False,
    },
    "cpu_threads": 1,
}
# Generous: the CI machine may be busy; only the hang test needs a short run timeout.
LIMITS = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)

CANDIDATES = [
    "correct",
    "renamed_weights",
    "wrong",
    "unwritten",
    "syntax_error",
    "no_modelnew",
    "raises",
    "exit_crash",
    "segfault",
    "memory_hog",
    "env_reader",
    "calls_reference",
    "cached",
    "cached_by_address",
    "writes_input",
    "fixed_shape",
    "lazy_after_timing",
]


def source(name: str) -> str:
    return (DATA / f"{name}.py").read_text(encoding="utf-8")


def task(**options: object) -> KernelBenchTask:
    return KernelBenchTask(
        source("reference"), name="softmax_linear", device="cpu", **{**FAST_TIMING, **options}
    )


@pytest.fixture(scope="module")
def results() -> dict[str, Evaluation]:
    with pytest.MonkeyPatch.context() as mp:
        # Set in this (parent) process: the workers must not see them.
        mp.setenv("KERNELPRO_TEST_API_KEY", SECRET)
        mp.setenv("ANTHROPIC_API_KEY", SECRET)
        mp.setenv("KERNELPRO_TEST_VISIBLE", "visible-value")
        evaluator = SandboxEvaluator(task(), LIMITS)
        evaluations = evaluator.evaluate_many([Candidate(source(n)) for n in CANDIDATES], jobs=4)
        forbidding = SandboxEvaluator(task(forbidden_ops=("aten._softmax",)), LIMITS)
        extra = forbidding.evaluate_many(
            [Candidate(source("forbidden_op")), Candidate(source("correct"))], jobs=2
        )
    out = dict(zip(CANDIDATES, evaluations, strict=True))
    out["forbidden_op"], out["correct_under_forbidden_ops"] = extra
    return out


def test_correct_candidate_is_timed(results: dict[str, Evaluation]) -> None:
    ev = results["correct"]
    assert ev.status == "correct", ev.reason or ev.logs
    assert ev.speedup is not None
    assert ev.speedup > 0
    assert ev.timing["reference"]["samples"] >= 5
    assert ev.timing["candidate"]["median_s"] > 0
    assert ev.timing["candidate"]["method"] == "cpu-perf-counter"  # measure.timing did it
    assert ev.speedup == pytest.approx(
        ev.timing["reference"]["median_s"] / ev.timing["candidate"]["median_s"]
    )
    assert ev.correctness["trials"] == 3
    assert ev.correctness["weights_copied"]
    assert ev.correctness["shape_check"] == ["batch 8 instead of 16"]
    assert ev.correctness["checks"] == ["fresh inputs", "inputs changed in place"]
    assert ev.metrics["device"] == "cpu"
    assert ev.wall_s > 0


def test_module_candidate_with_other_weight_names_gets_the_reference_weights(
    results: dict[str, Evaluation],
) -> None:
    ev = results["renamed_weights"]
    assert ev.status == "correct", ev.reason or ev.logs
    assert ev.correctness["weights"] == "copied by position and shape"
    assert results["correct"].correctness["weights"] == "copied by name"


@pytest.mark.parametrize(
    ("name", "status", "reason"),
    [
        (
            "wrong",
            "wrong",
            # Refused by the judge, and said with its acknowledgment (the worker compares
            # none of the calls the judge decides): by the float64 truth itself where this
            # judge found it, else by the tolerance an earlier judge's truth calibrated.
            # Named as the worker names its output ("output", not "output[0]").
            "wrong result (trial 1/3): output: 1024 of 1024 elements (100%) ",
        ),
        (
            "unwritten",
            "wrong",
            "512 NaN where the reference is a number, first at index (8, 0): never written",
        ),
        ("syntax_error", "build_error", "SyntaxError: expected ':'"),
        ("no_modelnew", "build_error", "the candidate defines no class ModelNew"),
        ("raises", "run_error", "ValueError: kernel launch failed"),
        (
            "exit_crash",
            "run_error",
            "worker died (exit code 3) without a result in phase 'correctness'",
        ),
        ("segfault", "run_error", "worker died (signal SIGSEGV)"),
        ("memory_hog", "run_error", "out of memory"),
        ("calls_reference", "cheat", "calls the reference during its run (Model.forward x1)"),
        ("cached", "cheat", "returns the same output for different inputs (cached"),
        # Its inputs are read-only shared memory: the write faults (input_handles.py).
        ("writes_input", "run_error", "a checked call's inputs are read-only shared memory"),
        (
            "fixed_shape",
            "cheat",
            "passes only for the checked shapes: wrong result (batch 8 instead of 16)",
        ),
        # Caught while timed ("refused while timed: timed call N returned a wrong output")
        # when a sampled call meets it, else by the check after timing ("wrong once timed").
        ("lazy_after_timing", "cheat", "wrong"),
        ("forbidden_op", "cheat", "uses forbidden library op(s) aten._softmax"),
    ],
)
def test_candidate_is_classified_with_its_reason(
    results: dict[str, Evaluation], name: str, status: str, reason: str
) -> None:
    ev = results[name]
    assert (ev.status, reason in (ev.reason or "")) == (status, True), ev.reason
    assert ev.speedup is None


def test_address_keyed_cache_is_caught(results: dict[str, Evaluation]) -> None:
    ev = results["cached_by_address"]
    # Caught by whichever check meets it first: a reused address across trials (same
    # output for different inputs), or the in-place refill of the same tensors.
    assert ev.status == "cheat"
    assert "cached" in (ev.reason or "")


def test_allowed_ops_are_not_flagged(results: dict[str, Evaluation]) -> None:
    ev = results["correct_under_forbidden_ops"]  # addmm/exp/sum, no _softmax
    assert ev.status == "correct", ev.reason


def test_segfault_leaves_a_python_traceback_in_the_logs(results: dict[str, Evaluation]) -> None:
    logs = results["segfault"].logs
    assert "Fatal Python error: Segmentation fault" in logs
    assert 'File "<kernelpro_candidate>", line 12 in forward' in logs


def test_build_error_keeps_the_build_log(results: dict[str, Evaluation]) -> None:
    log = results["syntax_error"].build_log
    assert "SyntaxError" in log
    assert "<kernelpro_candidate>" in log


def test_worker_environment_has_no_secrets(results: dict[str, Evaluation]) -> None:
    ev = results["env_reader"]
    assert ev.status == "correct", ev.reason
    seen = {line.split("=", 1)[0][4:] for line in ev.logs.splitlines() if line.startswith("ENV ")}
    assert "KERNELPRO_TEST_VISIBLE" in seen
    assert "PATH" in seen
    assert "KERNELPRO_TEST_API_KEY" not in seen
    assert "ANTHROPIC_API_KEY" not in seen
    assert SECRET not in ev.logs
    assert os.environ.get("KERNELPRO_TEST_API_KEY") is None  # and the parent is restored


def test_hang_is_killed_at_the_run_timeout() -> None:
    limits = SandboxLimits(build_timeout_s=120.0, run_timeout_s=3.0, memory_limit_mb=1024)
    ev = SandboxEvaluator(task(), limits).evaluate(Candidate(source("hang")))
    assert ev.status == "timeout"
    assert ev.reason.startswith("no result within the 3s run timeout (phase 'correctness'); ")
    assert ev.reason.endswith(("every process of its PID namespace killed", "process group killed"))
    assert ev.wall_s < 60


def test_a_search_survives_crashing_candidates(tmp_path: Path) -> None:
    class Serve:
        def __init__(self) -> None:
            self.queue = [
                Candidate(source("build_crash"), strategy="crash while building"),
                Candidate(source("correct"), strategy="fix"),
            ]

        def generate(self, mode, parent, evaluation, *, max_candidates=1):  # noqa: ANN001
            return [self.queue.pop(0)] if self.queue else []

    path = tmp_path / "trajectory.jsonl"
    extensions = tmp_path / "torch_extensions"
    limits = SandboxLimits(
        build_timeout_s=120.0,
        run_timeout_s=90.0,
        memory_limit_mb=1024,
        extensions_dir=str(extensions),
    )
    result = MCTS().run(Serve(), SandboxEvaluator(task(), limits), "2", trajectory=path)
    crashed, fixed = result.nodes
    assert crashed.evaluation.status == "build_error"
    assert crashed.evaluation.reason == (
        "worker died (exit code 1) without a result in phase 'build'"
    )
    assert crashed.reward == -3.0
    # Its torch extensions directory was its own (its scratch): the lock it left behind is
    # gone with it, and nothing reached the directory the search shares.
    assert not (extensions / "kp_fake_extension").exists()
    assert fixed.evaluation.status == "correct"
    assert result.best is fixed
    assert SECRET not in path.read_text()


def test_a_broken_reference_is_a_problem_error_not_a_candidate_failure() -> None:
    broken = KernelBenchTask(
        source("reference").replace("return [n]", "raise RuntimeError('no init inputs')"),
        name="broken_problem",
        device="cpu",
    )
    with pytest.raises(
        KernelproError, match=r"The reference of task 'broken_problem' fails in a trusted process"
    ):
        SandboxEvaluator(broken, LIMITS).evaluate(Candidate(source("correct")))
