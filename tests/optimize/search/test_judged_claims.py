"""The worker's "correct" decided by the judge's verdict (`worker_claims.WorkerClaims._judged`),
without processes: the speedup is the judge's reference time over the worker's candidate time
(the worker times no reference), the excessive-speedup finding follows from it, and a failed
verdict is "wrong" only where the judge says an honest worker would have passed the output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kernelpro.optimize.sandbox.handles import Received
from pytest_kernelpro.optimize.sandbox.task import SandboxLimits
from pytest_kernelpro.optimize.sandbox.worker_claims import EXCESSIVE_SPEEDUP, WorkerClaims
from pytest_kernelpro.optimize.search.interfaces import Evaluation


class Judged:
    """A judge beside the worker that already decided: `finish` gives its verdict."""

    def __init__(self, verdict: dict[str, Any]) -> None:
        self.verdict = verdict

    def finish(self, *, judged: bool) -> dict[str, Any]:
        assert judged
        return self.verdict


def judged(
    candidate_s: float, verdict: dict[str, Any], claims: WorkerClaims | None = None
) -> Evaluation:
    if claims is None:
        claims = fresh_claims()
    claimed = Evaluation(
        status="correct",
        timing={"candidate": {"median_s": candidate_s}, "phase_s": 1.0},
        metrics={"candidate_median_s": candidate_s},
    )
    return claims._judged(claimed, Received(), Judged(verdict))  # type: ignore[arg-type]


def fresh_claims() -> WorkerClaims:
    claims = WorkerClaims.__new__(WorkerClaims)
    claims._reference_ok = None
    claims._reference_timing = None
    claims._known_truth = None
    return claims


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


def test_the_first_judges_reference_time_is_every_later_evaluations() -> None:
    """A judge started once the reference was timed does not time it again (its verdict has
    no reference time): the speedup divides the first judge's time, and the evaluation says
    whose it is. A judge that timed it anyway does not replace the first time."""
    claims = fresh_claims()
    first = judged(0.5, PASSED, claims)
    assert first.metrics["reference_timed_by"] == "this evaluation's judge"
    later = judged(0.25, {**PASSED, "reference_timing": {}}, claims)
    assert later.status == "correct"
    assert later.speedup == pytest.approx(4.0)
    assert later.timing["reference"] == {"median_s": 1.0}
    assert later.metrics["reference_timed_by"].startswith("an earlier evaluation's judge")
    again = judged(0.25, {**PASSED, "reference_timing": {"median_s": 3.0}}, claims)
    assert again.speedup == pytest.approx(12.0)  # its own judge's time, this once
    assert claims._reference_timing == {"median_s": 1.0}


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


class Launched:
    """What `_run_judge` needs of the evaluator, recording the task each judge was given."""

    def __init__(self, root: Path) -> None:
        self.root, self.tasks = root, []

    def scratch_dir(self, prefix: str, judge: bool = False) -> Path:
        path = self.root / f"{prefix}{len(self.tasks)}"
        path.mkdir()
        return path

    def launch(self, command: list[str], judgedir: Path, *rest: Any) -> Any:
        self.tasks.append(json.loads((judgedir / "task.json").read_text("utf-8")))
        (judgedir / "judge.json").write_text(json.dumps(PASSED), "utf-8")
        return type("Run", (), {"peak_mb": 1.0})()


def launching(launched: Launched) -> WorkerClaims:
    """Fresh claims whose judges `launched` starts (`_run_judge`)."""
    claims = fresh_claims()
    claims.standbys = launched  # type: ignore[assignment]
    claims.standbys.release = claims.standbys.remove = lambda path: None  # type: ignore[attr-defined]
    claims.handles = type("Handles", (), {"finish": lambda self, path: None})()  # type: ignore[assignment]
    claims.limits = SandboxLimits()
    claims._task_payload = dict
    claims._launch = launched.launch
    return claims


def judge_once(claims: WorkerClaims, launched: Launched) -> Evaluation:
    return judged(0.5, claims._run_judge(None, streamed=launched.scratch_dir("judge")), claims)


def test_a_judge_is_told_whether_the_reference_was_timed_before(tmp_path: Path) -> None:
    launched = Launched(tmp_path)
    claims = launching(launched)
    for _ in range(2):
        judge_once(claims, launched)
    assert [task["reference_timed"] for task in launched.tasks] == [False, True]


def test_the_first_truth_a_judge_found_is_every_later_judges(tmp_path: Path) -> None:
    """A judge's verdict carries the truth it found (`judge._Reference.known_truth`); every
    later judge of the search is given the first one, even where an earlier verdict failed
    (the truth is the reference's, not the candidate's), and a later verdict's does not
    replace it. The evaluation says whose truth decided it."""
    verdicts = [
        {"ok": False, "reason": "trial-1: off", "known_truth": {"payload": "first"}},
        {**PASSED, "truth_taken": True},
        {**PASSED, "known_truth": {"payload": "second"}},
        {**PASSED, "truth_taken": True},
    ]

    class Verdicts(Launched):
        def launch(self, command: list[str], judgedir: Path, *rest: Any) -> Any:
            run = super().launch(command, judgedir, *rest)
            verdict = verdicts[len(self.tasks) - 1]
            (judgedir / "judge.json").write_text(json.dumps(verdict), "utf-8")
            return run

    launched = Verdicts(tmp_path)
    claims = launching(launched)
    evaluations = [judge_once(claims, launched) for _ in verdicts]
    assert [task.get("known_truth") for task in launched.tasks] == [
        None,
        {"payload": "first"},
        {"payload": "first"},
        {"payload": "first"},
    ]
    assert claims._known_truth == {"payload": "first"}
    by = [ev.metrics["truth_by"] for ev in evaluations]
    assert by[0] == by[2] == "this evaluation's judge"
    assert by[1].startswith("an earlier evaluation's judge")
    assert by[3] == by[1]
    assert [ev.status for ev in evaluations] == ["cheat", "correct", "correct", "correct"]
