"""The search's wall split (optimize/loop/clock.py): each evaluation's parts add up to the time
its wrapper measured, whatever a worker claims, and `other` is exactly the rest."""

from __future__ import annotations

import pytest

from pytest_kernelpro.optimize.loop.clock import BUCKETS, TimedEvaluator, WallClock, with_rest
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation


def _evaluation(**over: object) -> Evaluation:
    values: dict = {
        "status": "correct",
        "wall_s": 6.0,  # the worker's process, by the trusted side's clock
        "build_s": 1.5,
        "timing": {"candidate": {"wall_s": 0.5}, "reference": {"wall_s": 0.25}},
        "metrics": {"judge_s": 2.0, "profile": {"profile_s": 10.0}},
    }
    values.update(over)
    return Evaluation(**values)


def test_an_evaluation_is_split_into_its_parts_and_the_wrappers_rest() -> None:
    clock = WallClock()
    clock.add_evaluation("fused", _evaluation(), elapsed=19.0)
    (part,) = clock.per_candidate
    assert part["profile_s"] == 10.0
    assert part["build_s"] == 1.5
    assert part["time_s"] == 0.75
    assert part["judge_s"] == 2.0
    assert part["check_s"] == 6.0 - 1.5 - 0.75 + 2.0  # the worker's rest and the judge
    assert part["other_s"] == pytest.approx(1.0)  # 19 s measured, 18 s accounted for
    totals = clock.totals()
    assert list(totals) == list(BUCKETS)
    assert totals["build"] + totals["check"] + totals["time"] + totals["profile"] == 18.0
    assert clock.evaluation_other == pytest.approx(1.0)


def test_forged_worker_numbers_cannot_add_up_to_more_than_the_evaluation_took() -> None:
    clock = WallClock()
    forged = _evaluation(
        wall_s=4.0,
        build_s=1e9,
        timing={"candidate": {"wall_s": 1e9}},
        metrics={"judge_s": 1e9, "profile": {"profile_s": float("nan")}},
    )
    clock.add_evaluation("liar", forged, elapsed=5.0)
    (part,) = clock.per_candidate
    pieces = ("build_s", "check_s", "time_s", "profile_s", "other_s")
    assert sum(part[k] for k in pieces) == pytest.approx(5.0)
    assert part["build_s"] == 4.0  # at most the worker's own process
    assert part["time_s"] == 0.0
    assert part["profile_s"] == 0.0


def test_other_is_what_elapsed_has_beyond_the_named_buckets() -> None:
    wall = WallClock(setup=1.0, generate=2.0, build=3.0).totals()
    out = with_rest(wall, 10.0, setup=0.5, patches=1.5)
    assert out["setup"] == 1.5
    assert out["patches"] == 1.5
    assert out["other"] == pytest.approx(10.0 - 1.5 - 2.0 - 3.0 - 1.5)
    assert list(out)[-1] == "other"
    # Never negative: buckets measured on other clocks may overlap the elapsed time a little.
    assert with_rest(wall, 5.0)["other"] == 0.0


def test_the_timed_evaluator_hands_its_own_clock_to_the_split() -> None:
    class Slow:
        def evaluate(self, candidate: Candidate) -> Evaluation:
            return Evaluation(status="run_error", wall_s=0.0)

    clock = WallClock()
    evaluation = TimedEvaluator(Slow(), clock).evaluate(Candidate("x", strategy="s"))
    (part,) = clock.per_candidate
    assert evaluation.wall_s == part["elapsed_s"]
    assert part["check_s"] == part["elapsed_s"]  # no build or timing reported: all its own
