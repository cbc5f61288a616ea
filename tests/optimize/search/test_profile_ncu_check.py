"""Every profiled candidate's timed median is checked against the GPU time ncu measured for
its kernels (optimize/candidate_profile/evaluator.py `_check_against_ncu`), not only the
winner's at confirmation: a candidate timed faster than its own kernels is a cheat."""

from __future__ import annotations

from typing import Any

import pytest_kernelpro.tools.advice  # noqa: F401  loaded at collection (a YAML table), before pytester runs
from pytest_kernelpro.optimize.candidate_profile.evaluator import ProfilingEvaluator
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation


class Inner:
    def __init__(self, median_s: float) -> None:
        self.median_s = median_s

    def evaluate(self, candidate: Candidate) -> Evaluation:
        timing = {"candidate": {"median_s": self.median_s}, "reference": {"median_s": 1e-3}}
        return Evaluation("correct", speedup=1e-3 / self.median_s, timing=timing)


def profiler(kernel_ns: float) -> Any:
    def profile(candidate: Candidate, evaluation: Evaluation) -> dict[str, Any]:
        metrics = {"gpu__time_duration.sum": {"value": kernel_ns, "unit": "nsecond"}}
        return {"profile": {"kernels": [{"name": "k", "metrics": {"metrics": metrics}}]}}

    return profile


def test_a_candidate_timed_faster_than_its_kernels_is_a_cheat() -> None:
    """Timed at 2 us, its kernel took 2,700 us by ncu (work on a side stream)."""
    ev = ProfilingEvaluator(Inner(2e-6), profiler(2.7e6)).evaluate(Candidate("code"))
    assert ev.status == "cheat"
    assert ev.speedup is None
    assert (ev.reason or "").startswith(
        "timing not believed at its profile: ncu measured its kernels at 2700 us of GPU time "
        "per call, 1.35e+03x the 2 us it was timed at"
    )


def test_an_honest_candidate_within_the_tolerance_stays_correct() -> None:
    ev = ProfilingEvaluator(Inner(2.7e-3), profiler(2.9e6)).evaluate(Candidate("code"))
    assert ev.status == "correct", ev.reason
