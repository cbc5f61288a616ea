"""The live progress of a search (`optimize/loop/progress.py`): the profiling phase reaches it from
the profiling evaluator, and the plain lines of CI logs say what each profile cost."""

from __future__ import annotations

import io

from pytest_kernelpro.optimize.candidate_profile.evaluator import ProfileFailed, ProfilingEvaluator
from pytest_kernelpro.optimize.loop.progress import PHASES, SearchProgress
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation


class Correct:
    def evaluate(self, candidate: Candidate) -> Evaluation:
        return Evaluation(status="correct", speedup=2.0)


def _plain() -> tuple[SearchProgress, list[str]]:
    lines: list[str] = []
    return SearchProgress("k", "4", write_line=lines.append, clock=lambda: 0.0), lines


def test_the_profiling_evaluator_reports_the_profiling_phase_before_each_profile() -> None:
    progress, _ = _plain()
    seen: list[str] = []

    def profiler(candidate: Candidate, evaluation: Evaluation) -> dict:
        seen.append(progress.phase_name)  # the phase while the profile runs
        return {"profile": {"kernels": []}, "guidance_md": "g"}

    evaluator = ProfilingEvaluator(Correct(), profiler, feedback="tools")
    evaluator.on_phase = progress.phase
    evaluator.evaluate(Candidate("class ModelNew: ..."))
    assert seen == ["profiling"]
    assert "profiling" in PHASES
    assert progress.status_text().startswith("kernelpro optimize k: profiling, 0 evaluations")


def test_a_failed_profile_still_went_through_the_profiling_phase() -> None:
    phases: list[str] = []

    def profiler(candidate: Candidate, evaluation: Evaluation) -> dict:
        raise ProfileFailed("ncu ran past its 5 s limit")

    evaluator = ProfilingEvaluator(Correct(), profiler, feedback="tools")
    evaluator.on_phase = phases.append
    ev = evaluator.evaluate(Candidate("x"))
    assert phases == ["profiling"]
    assert ev.metrics["profile"]["error"] == "ncu ran past its 5 s limit"


def test_no_profiling_phase_with_feedback_none() -> None:
    phases: list[str] = []
    evaluator = ProfilingEvaluator(Correct(), lambda c, e: {}, feedback="none")
    evaluator.on_phase = phases.append
    evaluator.evaluate(Candidate("x"))
    assert phases == []


def test_plain_lines_say_what_the_profile_cost() -> None:
    progress, lines = _plain()
    progress.evaluated("correct", 1.5, label="candidate 2", note="profiled in 12.3 s")
    progress.evaluated("wrong (output 0 differs)", None, label="candidate 3")
    assert lines == [
        "kernelpro optimize k: candidate 2 1.50x the current kernel; profiled in 12.3 s "
        "[1 evaluations, best 1.50x, $0.00, 0:00]",
        "kernelpro optimize k: candidate 3 wrong (output 0 differs) "
        "[2 evaluations, best 1.50x, $0.00, 0:00]",
    ]


def test_the_live_line_shows_the_profiling_phase(monkeypatch) -> None:
    import rich.console

    out = io.StringIO()
    real = rich.console.Console
    monkeypatch.setattr(
        rich.console, "Console", lambda **kw: real(file=out, force_terminal=True, width=200)
    )
    progress = SearchProgress("k", "4", write_line=print, live=True, max_evaluations=4)
    progress.phase("timing")
    progress.phase("profiling")
    progress.close()
    text = out.getvalue()
    assert "kernelpro optimize k: timing, 0/4 evaluations" in text
    assert "kernelpro optimize k: profiling, 0/4 evaluations" in text
