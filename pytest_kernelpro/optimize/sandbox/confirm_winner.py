"""The winner's confirmation run: a fresh sandboxed re-timing, checked by the judge.

`WinnerConfirmation` is the part of `SandboxEvaluator` (`evaluator.py`) that confirms a
winner's time (`confirm`); the rule it applies to the numbers, and its tolerances, are
`confirm.py`'s (`confirm_timing`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_kernelpro.optimize.sandbox.confirm import confirm_timing
from pytest_kernelpro.optimize.sandbox.handles import HandleChannels, Received
from pytest_kernelpro.optimize.sandbox.pool import StandbyPool
from pytest_kernelpro.optimize.sandbox.task import SandboxLimits
from pytest_kernelpro.optimize.sandbox.worker_claims import positive
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

# A re-timing slower than the tolerance is repeated once in another fresh worker before it
# disqualifies, and the later one decides: a load spike on a shared machine can slow one
# process by more than the CPU tolerance, while a search time that was not real is slow in
# every fresh process.
RETIMINGS = 2


class WinnerConfirmation:
    """The winner's confirmation for `SandboxEvaluator`. What it uses of the evaluator is
    annotated here; the evaluator sets it."""

    limits: SandboxLimits
    handles: HandleChannels
    standbys: StandbyPool
    _task_payload: Callable[[], dict[str, Any]]
    _needs_cuda: Callable[[], bool]
    # A worker run with the caches this code's evaluation kept (`evaluator.py`).
    _run_seeded: Callable[[str, Path], Evaluation]
    # The judge's run over handed-over outputs (`worker_claims.WorkerClaims._run_judge`).
    _run_judge: Callable[..., dict[str, Any]]
    # An evaluation's end: handles closed, standby released, scratch removed (`evaluator.py`).
    _release_workdir: Callable[[Path], None]

    def confirm(self, candidate: Candidate, evaluation: Evaluation) -> Evaluation:
        """Confirm a winner's time: re-time it in a fresh sandboxed worker the way the search
        timed it, by the gate's timer on fresh inputs with checked outputs (`worker.retime`),
        have the judge check the output of a call made after timing, and compare the fresh median
        and ncu's kernel durations (where the candidate was profiled) with the time the
        search used (`search.confirm.confirm_timing`: the rule and its tolerances).

        A mismatch disqualifies the candidate (status `cheat`) with the numbers in the
        reason; otherwise `timing["confirmed"]` holds the re-timing and the comparison (the
        judge checks the re-timed output and times nothing: the speedups are the final
        re-measurement's). Only correct evaluations are confirmed.
        """
        if evaluation.status != "correct":
            return evaluation
        claimed = positive((evaluation.timing.get("candidate") or {}).get("median_s")) or 0.0
        # Set by the profiling evaluator (optimize/candidate_profile/evaluator.py) for a
        # profiled candidate.
        ncu_s = positive((evaluation.metrics.get("profile") or {}).get("ncu_gpu_time_s"))
        earlier: list[dict[str, Any]] = []
        for attempt in range(RETIMINGS):
            ran = self._retime_once(candidate)
            if isinstance(ran, str):
                return disqualified(evaluation, ran)
            raw = dict(ran.timing.get("retimed") or {})
            samples = raw.get("samples_s")
            outcome = confirm_timing(
                claimed,
                samples if isinstance(samples, list) else [],
                device_kind="cuda" if self._needs_cuda() else "cpu",
                tolerance=self.limits.confirm_tolerance,
                ncu_s=ncu_s,
                method=str(raw.get("method") or ""),
            )
            if not outcome.too_slow or attempt == RETIMINGS - 1:
                break
            earlier.append(outcome.record)
        # No reference time: the judge checks the re-timed output only (the speedups are the
        # final re-measurement's, interleaved with the current kernel and the reference).
        confirmed = {
            **outcome.record,
            "warmup_runs": raw.get("warmup_runs"),
            "honesty": raw.get("honesty"),
        }
        if earlier:
            confirmed["earlier_retimings"] = earlier
        if not outcome.ok:
            refused = disqualified(evaluation, outcome.reason)
            refused.timing["confirmation"] = confirmed
            return refused
        if outcome.reason:  # a disagreement the winner survives (confirm.py)
            confirmed["reason"] = outcome.reason
        evaluation.timing["confirmed"] = confirmed
        return evaluation

    def _retime_once(self, candidate: Candidate) -> Evaluation | str:
        """One re-timing in a fresh sandboxed worker, its output checked by the judge: the
        worker's evaluation, or why the candidate is disqualified."""
        # In the pool's area, as an evaluation's: the judge (a standby started ahead) reads
        # outputs only there.
        workdir = self.standbys.scratch_dir("kernelpro-retime-")
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
            "retime": True,
        }
        outputs = Received()
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            retimed = self._run_seeded(candidate.code, workdir)
            outputs = self.handles.finish(workdir)
            if retimed.status != "correct":
                return f"timing not confirmed: the re-timing run failed ({retimed.reason})"
            verdict = self._run_judge(outputs, retime=True)
        finally:
            outputs.close()
            self._release_workdir(workdir)
        if not verdict.get("ok"):
            why = (
                verdict.get("reason")
                or verdict.get("reference_error")
                or verdict.get("judge_error")
            )
            return f"timing not confirmed: the output of the re-timed kernel is wrong ({why})"
        return retimed


def disqualified(evaluation: Evaluation, reason: str) -> Evaluation:
    """`evaluation` disqualified (status `cheat`) for `reason`, keeping what it measured."""
    return Evaluation(
        status="cheat",
        reason=reason,
        timing=evaluation.timing,
        correctness=evaluation.correctness,
        metrics=evaluation.metrics,
        logs=evaluation.logs,
        wall_s=evaluation.wall_s,
    )
