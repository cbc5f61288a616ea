"""The trusted side of the sandboxed evaluator: what is decided over a worker's claim.

A worker ran candidate code, so everything it reports is a claim. `TrustedSide` (a base of
`SandboxEvaluator`) holds what the evaluator does with one in processes that never load
candidate code: the judge's check of a "correct" candidate's saved outputs and its timing of
the reference (`_judged`), the check of a worker's "the reference failed"
(`_reference_failure_claim`), and the winner's confirmation by a fresh re-timing and ncu
(`confirm`; the rule is `confirm.py`'s). It launches those processes through the
evaluator's own `_launch` and `_run_worker`.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox.processes import ProcessRun, log_tail, remove_tree
from pytest_kernelpro.optimize.search.base import Candidate, Evaluation

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits


class TrustedSide:
    """Judging and confirming for `SandboxEvaluator` (see the module docstring)."""

    task: KernelBenchTask
    limits: SandboxLimits
    _reference_ok: bool | None

    # Provided by SandboxEvaluator.
    def _launch(
        self,
        command: list[str],
        workdir: Path,
        progress_path: Path,
        result_path: Path,
        readable: Sequence[Path] = (),
    ) -> ProcessRun:
        raise NotImplementedError

    def _run_worker(self, workdir: Path) -> Evaluation:
        raise NotImplementedError

    def _run_seeded(self, code: str, workdir: Path) -> Evaluation:
        raise NotImplementedError

    def _task_payload(self) -> dict[str, Any]:
        raise NotImplementedError

    def _needs_cuda(self) -> bool:
        raise NotImplementedError

    def _run_judge(self, outputs: Path | None, *, retime: bool = False) -> dict[str, Any]:
        """Run judge.py (no candidate code) in a fresh sandboxed process; its JSON result."""
        judgedir = Path(tempfile.mkdtemp(prefix="kernelpro-judge-"))
        try:
            task = {**self._task_payload(), "retime": retime}
            (judgedir / "task.json").write_text(json.dumps(task), "utf-8")
            command = [
                self.limits.python,
                "-m",
                "pytest_kernelpro.optimize.sandbox.judge",
                "--task",
                str(judgedir / "task.json"),
                "--result",
                str(judgedir / "judge.json"),
                *(["--outputs", str(outputs)] if outputs is not None else ["--preflight"]),
            ]
            run = self._launch(
                command,
                judgedir,
                judgedir / "progress.log",
                judgedir / "judge.json",
                readable=[outputs] if outputs is not None else [],  # the sandbox hides /tmp
            )
            try:
                return dict(json.loads((judgedir / "judge.json").read_text(encoding="utf-8")))
            except (OSError, ValueError):
                logs = log_tail(judgedir / "stdout.log", judgedir / "stderr.log", 4000)
                return {
                    "ok": False,
                    "judge_error": f"the judge process ended without a result ({run.how()}, "
                    f"{run.killed or 'not killed'})\n{logs}",
                }
        finally:
            if not self.limits.keep_workdirs:
                remove_tree(judgedir)

    def _reference_error(self, verdict: Mapping[str, Any]) -> KernelproError:
        return KernelproError(
            f"The reference of task {self.task.name!r} fails in a trusted process, so no "
            f"candidate can be checked: {verdict.get('reference_error')}. Fix the problem file "
            f"(class Model, get_inputs, get_init_inputs).\n{verdict.get('traceback', '')}"
        )

    def _judged(self, evaluation: Evaluation, outputs: Path) -> Evaluation:
        """The worker's "correct" is a claim: the judge checks its saved outputs and times
        the reference; the speedup is the judge's reference time over the candidate's."""
        started = time.perf_counter()
        verdict = self._run_judge(outputs)
        # The judge's own process (the search's wall split counts it as the check's).
        evaluation.metrics["judge_s"] = time.perf_counter() - started
        if verdict.get("reference_error"):
            raise self._reference_error(verdict)
        if verdict.get("judge_error"):
            return Evaluation(
                status="run_error",
                reason="the trusted check of this candidate's outputs did not finish: "
                + str(verdict["judge_error"]).splitlines()[0],
                logs=evaluation.logs + "\n" + str(verdict["judge_error"]),
                metrics=evaluation.metrics,
                wall_s=evaluation.wall_s,
            )
        self._reference_ok = True
        if not verdict.get("ok"):
            return Evaluation(
                status="cheat",
                reason="result not confirmed: the worker reported a correct result, but the "
                "outputs it handed over differ from the reference computed in a trusted "
                f"process ({verdict.get('reason')})",
                correctness=evaluation.correctness,
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        ref_timing = dict(verdict.get("reference_timing") or {})
        candidate_s = _positive(evaluation.timing.get("candidate", {}).get("median_s"))
        ref_s = _positive(ref_timing.get("median_s"))
        if candidate_s is None or ref_s is None:
            return Evaluation(
                status="run_error",
                reason=f"no usable timing (candidate median {candidate_s!r}, reference "
                f"median {ref_s!r} from the trusted process)",
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        evaluation.timing["reference_in_worker"] = evaluation.timing.get("reference")
        evaluation.timing["reference"] = ref_timing
        evaluation.speedup = ref_s / candidate_s
        evaluation.metrics["ref_median_s"] = ref_s
        evaluation.correctness["verified_by"] = (
            "judge: outputs of " + ", ".join(verdict.get("checked") or []) + " compared with "
            "the reference in a process without candidate code"
        )
        return evaluation

    def confirm(self, candidate: Candidate, evaluation: Evaluation) -> Evaluation:
        """Confirm a winner's time: re-time it in a fresh sandboxed worker the way the search
        timed it, with clocks bound before the candidate's code runs (`worker.retime`), have
        the judge check the output of a call made after timing, and compare the fresh median
        and ncu's kernel durations (where the candidate was profiled) with the time the
        search used (`search.confirm.confirm_timing`: the rule and its tolerances).

        A mismatch disqualifies the candidate (status `cheat`) with the numbers in the
        reason; otherwise `timing["confirmed"]` holds the re-timing and the comparison (the
        judge checks the re-timed output and times nothing: the speedups are the final
        re-measurement's). Only correct evaluations are confirmed.
        """
        from pytest_kernelpro.optimize.sandbox.confirm import confirm_timing

        if evaluation.status != "correct":
            return evaluation
        claimed = _positive((evaluation.timing.get("candidate") or {}).get("median_s"))
        workdir = Path(tempfile.mkdtemp(prefix="kernelpro-retime-"))
        payload = {
            **self._task_payload(),
            "candidate": candidate.code,
            "memory_limit_mb": self.limits.memory_limit_mb,
            "outputs_dir": str(workdir / "outputs"),
            "retime": True,
        }
        try:
            (workdir / "task.json").write_text(json.dumps(payload), encoding="utf-8")
            retimed = self._run_seeded(candidate.code, workdir)
            if retimed.status != "correct":
                return _disqualified(
                    evaluation, f"timing not confirmed: the re-timing run failed ({retimed.reason})"
                )
            verdict = self._run_judge(workdir / "outputs", retime=True)
        finally:
            if not self.limits.keep_workdirs:
                remove_tree(workdir)
        if not verdict.get("ok"):
            why = (
                verdict.get("reason")
                or verdict.get("reference_error")
                or verdict.get("judge_error")
            )
            return _disqualified(
                evaluation,
                f"timing not confirmed: the output of the re-timed kernel is wrong ({why})",
            )
        raw = dict(retimed.timing.get("retimed") or {})
        samples = raw.get("samples_s")
        unwarmed = raw.get("unwarmed_samples_s")
        # Set by the profiling evaluator (optimize/candidate_profile/evaluator.py) for a profiled candidate.
        ncu_s = _positive((evaluation.metrics.get("profile") or {}).get("ncu_gpu_time_s"))
        outcome = confirm_timing(
            claimed or 0.0,
            samples if isinstance(samples, list) else [],
            device_kind="cuda" if self._needs_cuda() else "cpu",
            tolerance=self.limits.confirm_tolerance,
            ncu_s=ncu_s,
            unwarmed_s=unwarmed if isinstance(unwarmed, list) else (),
            method=str(raw.get("method") or ""),
        )
        # No reference time: the judge checks the re-timed output only (the speedups are the
        # final re-measurement's, interleaved with the current kernel and the reference).
        confirmed = {**outcome.record, "warmup_runs": raw.get("warmup_runs")}
        if not outcome.ok:
            disqualified = _disqualified(evaluation, outcome.reason)
            disqualified.timing["confirmation"] = confirmed
            return disqualified
        evaluation.timing["confirmed"] = confirmed
        return evaluation

    def _reference_failure_claim(self, evaluation: Evaluation) -> Evaluation:
        """A worker says the reference failed. Its process may have run candidate code, so
        the claim is checked in a trusted process before the user's problem is blamed."""
        if self._reference_ok is None:
            verdict = self._run_judge(None)
            if verdict.get("reference_error"):
                raise self._reference_error(verdict)
            self._reference_ok = bool(verdict.get("ok"))
        return Evaluation(
            status="run_error",
            reason="the worker reported that the reference failed, but the reference runs "
            "in a trusted process: counted as this candidate's failure "
            f"({str(evaluation.reason or '')[:200]})",
            build_log=evaluation.build_log,
        )


def _disqualified(evaluation: Evaluation, reason: str) -> Evaluation:
    return Evaluation(
        status="cheat",
        reason=reason,
        timing=evaluation.timing,
        correctness=evaluation.correctness,
        metrics=evaluation.metrics,
        logs=evaluation.logs,
        wall_s=evaluation.wall_s,
    )


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 and value == value and value != float("inf") else None
