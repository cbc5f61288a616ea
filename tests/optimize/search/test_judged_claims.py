"""The worker's "correct" decided by the judge's verdict (`worker_claims.WorkerClaims._judged`),
without processes: the speedup is the judge's reference time over the worker's candidate time
(the worker times no reference), the excessive-speedup finding follows from it, and a failed
verdict is "wrong" only where the judge says an honest worker would have passed the output."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_kernelpro.optimize.sandbox.handles import Received
from pytest_kernelpro.optimize.sandbox.worker_claims import EXCESSIVE_SPEEDUP, WorkerClaims
from pytest_kernelpro.optimize.search.interfaces import Evaluation


class Judged:
    """A judge beside the worker that already decided: `finish` gives its verdict."""

    def __init__(self, verdict: dict[str, Any]) -> None:
        self.verdict = verdict

    def finish(self, *, judged: bool) -> dict[str, Any]:
        assert judged
        return self.verdict


def judged(candidate_s: float, verdict: dict[str, Any]) -> Evaluation:
    claims = WorkerClaims.__new__(WorkerClaims)
    claims._reference_ok = None
    claimed = Evaluation(
        status="correct",
        timing={"candidate": {"median_s": candidate_s}, "phase_s": 1.0},
        metrics={"candidate_median_s": candidate_s},
    )
    return claims._judged(claimed, Received(), Judged(verdict))  # type: ignore[arg-type]


PASSED = {"ok": True, "checked": ["trial-1"], "reference_timing": {"median_s": 1.0}}


@pytest.mark.parametrize(
    ("candidate_s", "flagged"), [(1.0 / (EXCESSIVE_SPEEDUP * 2), True), (0.5, False)]
)
def test_the_speedup_is_the_judges_reference_time_over_the_candidates(
    candidate_s: float, flagged: bool
) -> None:
    ev = judged(candidate_s, PASSED)
    assert ev.status == "correct"
    assert ev.speedup == pytest.approx(1.0 / candidate_s)
    assert ev.metrics["ref_median_s"] == 1.0
    assert ev.timing["reference"] == {"median_s": 1.0}
    titles = [f["title"] for f in ev.findings]
    assert titles == (["excessive speedup"] if flagged else [])


def test_a_verdict_without_the_judges_reference_time_gives_no_speedup() -> None:
    """The worker's own time of the reference is gone: nothing else can stand in for it."""
    ev = judged(0.5, {**PASSED, "reference_timing": {}})
    assert ev.status == "run_error"
    assert ev.speedup is None


@pytest.mark.parametrize(
    ("wrong", "status", "says"),
    [
        (True, "wrong", "wrong result by the correctness rule's truth"),
        (False, "cheat", "result not confirmed"),
    ],
)
def test_a_failed_verdict_is_wrong_only_where_the_judge_says_so(
    wrong: bool, status: str, says: str
) -> None:
    ev = judged(0.5, {"ok": False, "reason": "trial-1: off", "wrong": wrong})
    assert ev.status == status
    assert ev.reason.startswith(says), ev.reason
    assert ev.reason.endswith("(trial-1: off)")
    assert ev.speedup is None
