"""Deciding over a worker's claims in processes that never load candidate code.

A worker ran candidate code, so everything it reports is a claim. `WorkerClaims` is the part
of `SandboxEvaluator` (`evaluator.py`) that decides over them with the judge (`judge.py`, a
fresh sandboxed process without candidate code): the check of a "correct" candidate's
outputs, handed over by handle, and the judge's timing of the reference (`_judged`, whose
speedup is the judge's reference time over the candidate's), and the check of a worker's
"the reference failed" (`_reference_failure_claim`). A reference that fails in the judge is
the user's problem and stops the search (`_reference_error`).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.sandbox.handles import HandleChannels, Received
from pytest_kernelpro.optimize.sandbox.pool import StandbyPool
from pytest_kernelpro.optimize.sandbox.processes import ProcessRun
from pytest_kernelpro.optimize.sandbox.safe_read import read_text
from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits
from pytest_kernelpro.optimize.search.interfaces import Evaluation

EXCESSIVE_SPEEDUP = 10.0  # KernelBench's reward-hack warning threshold


class WorkerClaims:
    """The judge's decisions for `SandboxEvaluator`. What it uses of the evaluator is
    annotated here; the evaluator sets it."""

    task: KernelBenchTask
    limits: SandboxLimits
    handles: HandleChannels
    standbys: StandbyPool
    _reference_ok: bool | None  # set once the judge has run the reference
    # The reference's time, taken by the first judge that timed it (`_judged`).
    _reference_timing: dict[str, Any] | None
    # The correctness rule's truth, found by the first judge that found one (`_run_judge`).
    _known_truth: dict[str, Any] | None
    _task_payload: Callable[[], dict[str, Any]]
    # The launch of a sandboxed process (`supervise.WorkerSupervision._launch`).
    _launch: Callable[..., ProcessRun]

    def search_truth(self) -> dict[str, Any] | None:
        """The truth the search's first judge found, as a process that judges unflattened
        outputs takes it (`measurement.worker_named`); None before one was found."""
        from pytest_kernelpro.optimize.sandbox.measurement import worker_named

        if self._known_truth is None:
            return None
        try:
            return worker_named(self._known_truth)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None

    def _start_judge(self, worker_dir: Path) -> JudgeBeside:
        """A judge started beside the worker of `worker_dir`, checking each output as the
        worker hands it over (`JudgeBeside`)."""
        judgedir = self.standbys.scratch_dir("kernelpro-judge-", judge=True)
        self.handles.stream(worker_dir, judgedir)
        return JudgeBeside(self, worker_dir, judgedir)

    def _run_judge(
        self, outputs: Received | None, *, retime: bool = False, streamed: Path | None = None
    ) -> dict[str, Any]:
        """Run judge.py (no candidate code) in a fresh sandboxed process, the worker's
        `outputs` forwarded to it by handle (or, `streamed`: in that directory, fed by the
        session's relay while the worker runs); its JSON result."""
        judgedir = streamed or self.standbys.scratch_dir("kernelpro-judge-", judge=True)
        if outputs is not None:
            self.handles.forward(judgedir, outputs)
        try:
            # The reference is the same in every evaluation of a search and runs in a process
            # no candidate code ran in: once one judge has timed it, later judges do not (at a
            # large size its timing was most of every judge's time after its worker). The
            # speedups of one search so share one denominator; the final ranking re-times
            # both contenders side by side (`remeasure.py`).
            timed = self._reference_timing is not None
            task = {**self._task_payload(), "retime": retime, "reference_timed": timed}
            # So is its truth (the float64 re-run of the first checked call, and that call's
            # comparison with it: at a large size, most of a judge's time before the worker's
            # first call, which waits for it): a later judge takes the first one's numbers
            # (`judge._Reference.take_known_truth`) and decides every output by the
            # calibrated tolerance, as the worker and every later call of the first do.
            if self._known_truth is not None:
                task["known_truth"] = self._known_truth
            (judgedir / "task.json").write_text(json.dumps(task), "utf-8")
            command = [
                self.limits.python,
                "-m",
                "pytest_kernelpro.optimize.sandbox.judge",
                "--task",
                str(judgedir / "task.json"),
                "--result",
                str(judgedir / "judge.json"),
                "--outputs-by-handle" if outputs is not None or streamed else "--preflight",
            ]
            run = self._launch(
                command, judgedir, judgedir / "progress.log", judgedir / "judge.json"
            )
            try:
                verdict = dict(json.loads(read_text(judgedir / "judge.json")))
                if self._known_truth is None and isinstance(verdict.get("known_truth"), dict):
                    self._known_truth = verdict["known_truth"]
                # Host memory at its peak: the judge's processes and the outputs it was handed.
                verdict["peak_mb"] = round(run.peak_mb, 1)
                return verdict
            except (OSError, ValueError):
                return {"ok": False, "judge_error": judge_end_error(run, self.limits)}
        finally:
            self.handles.finish(judgedir)  # the judge's mappings died with it
            self.standbys.release(judgedir)
            if not self.limits.keep_workdirs:
                self.standbys.remove(judgedir)

    def _reference_error(self, verdict: Mapping[str, Any]) -> KernelproError:
        return KernelproError(
            f"The reference of task {self.task.name!r} fails in a trusted process, so no "
            f"candidate can be checked: {verdict.get('reference_error')}. Fix the problem file "
            f"(class Model, get_inputs, get_init_inputs).\n{verdict.get('traceback', '')}"
        )

    def _judged(
        self, evaluation: Evaluation, outputs: Received, beside: JudgeBeside | None = None
    ) -> Evaluation:
        """The worker's "correct" is a claim: the judge checks its saved outputs (`beside`:
        the judge that checked them as they came) and times the reference, unless an earlier
        judge of this search did; the speedup is that judge's reference time over the
        candidate's."""
        if outputs.refused is not None:  # an honest worker's outputs always pass
            return Evaluation(
                status="cheat",
                reason="result not confirmed: the outputs it handed over were refused "
                f"({outputs.refused})",
                correctness=evaluation.correctness,
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        started = time.perf_counter()
        verdict = beside.finish(judged=True) if beside is not None else self._run_judge(outputs)
        # The judge's time after the worker ended (the search's wall split counts it as the
        # check's); a judge beside the worker checked its outputs while it waited.
        evaluation.metrics["judge_s"] = time.perf_counter() - started
        evaluation.metrics["judge_peak_mb"] = verdict.get("peak_mb")
        evaluation.metrics["truth_by"] = (
            "an earlier evaluation's judge (the truth is found once per search)"
            if verdict.get("truth_taken")
            else "this evaluation's judge"
        )
        # A failed judge names the reference's exception in "reference_error"; a passing one
        # carries the correctness rule's "reference_error" (its normwise error): not a failure.
        if not verdict.get("ok") and verdict.get("reference_error"):
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
            # "wrong": the first output fails the gate's comparison with the truth, made in
            # the judge only, and passes the tolerance the worker was given (`judge.judge`).
            wrong = bool(verdict.get("wrong"))
            return Evaluation(
                status="wrong" if wrong else "cheat",
                reason=(
                    "wrong result by the correctness rule's truth, compared in a trusted process"
                    if wrong
                    else "result not confirmed: the worker reported a correct result, but the "
                    "outputs it handed over differ from the reference computed in a trusted "
                    "process"
                )
                + f" ({verdict.get('reason')})",
                correctness=evaluation.correctness,
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        ref_timing = dict(verdict.get("reference_timing") or {})
        if ref_timing:
            if self._reference_timing is None:
                self._reference_timing = ref_timing
            evaluation.metrics["reference_timed_by"] = "this evaluation's judge"
        elif self._reference_timing is not None:
            ref_timing = dict(self._reference_timing)
            evaluation.metrics["reference_timed_by"] = (
                "an earlier evaluation's judge (the reference is timed once per search)"
            )
        candidate_s = positive(evaluation.timing.get("candidate", {}).get("median_s"))
        ref_s = positive(ref_timing.get("median_s"))
        if candidate_s is None or ref_s is None:
            return Evaluation(
                status="run_error",
                reason=f"no usable timing (candidate median {candidate_s!r}, reference "
                f"median {ref_s!r} from the trusted process)",
                metrics=evaluation.metrics,
                logs=evaluation.logs,
                wall_s=evaluation.wall_s,
            )
        evaluation.timing["reference"] = ref_timing
        evaluation.speedup = ref_s / candidate_s
        evaluation.metrics["ref_median_s"] = ref_s
        if evaluation.speedup > EXCESSIVE_SPEEDUP:
            evaluation.findings.append(
                {
                    "severity": "medium",
                    "title": "excessive speedup",
                    "message": f"{evaluation.speedup:.1f}x over the reference; KernelBench "
                    f"treats more than {EXCESSIVE_SPEEDUP:g}x as a likely reward hack: review "
                    "the code.",
                }
            )
        # The errors and the rule's accuracy as the judge measured them: the numbers the
        # verdict went by (the worker compares none of the calls a judge beside it decides).
        for key in ("max_abs_err", "max_rel_err", "accuracy"):
            if key in verdict:
                evaluation.correctness[key] = verdict[key]
        evaluation.correctness["verified_by"] = (
            "judge: outputs of " + ", ".join(verdict.get("checked") or []) + " compared with "
            "the reference in a process without candidate code"
        )
        return evaluation

    def _reference_failure_claim(self, evaluation: Evaluation) -> Evaluation:
        """A worker says the reference failed. Its process may have run candidate code, so
        the claim is checked in a trusted process before the user's problem is blamed."""
        if self._reference_ok is None:
            verdict = self._run_judge(None)
            if not verdict.get("ok") and verdict.get("reference_error"):
                raise self._reference_error(verdict)
            self._reference_ok = bool(verdict.get("ok"))
        return Evaluation(
            status="run_error",
            reason="the worker reported that the reference failed, but the reference runs "
            "in a trusted process: counted as this candidate's failure "
            f"({str(evaluation.reason or '')[:200]})",
            build_log=evaluation.build_log,
        )


class JudgeBeside:
    """A judge process started with its worker: the session forwards each output the worker
    hands over as it comes (`handles.Relay`), the judge checks it and drops it, and the
    worker, waiting meanwhile, makes the next one (`harness._Pipeline.await_judge`); the
    session so holds one checked output at a time, not all of them. Once the worker ended,
    `finish(judged=True)` lets the judge decide and time the reference; `finish(judged=False)`
    shuts its channel (it ends without a verdict that counts)."""

    def __init__(self, claims: WorkerClaims, worker_dir: Path, judgedir: Path) -> None:
        self.claims, self.worker_dir = claims, worker_dir
        self.verdict: dict[str, Any] = {"ok": False, "judge_error": "the judge never ran"}
        self._thread = threading.Thread(
            target=self._run, args=(judgedir,), daemon=True, name="kernelpro-judge"
        )
        self._thread.start()

    def _run(self, judgedir: Path) -> None:
        try:
            self.verdict = self.claims._run_judge(None, streamed=judgedir)
        except BaseException as exc:  # never into the search: the verdict says so
            self.verdict = {"ok": False, "judge_error": f"the judge's launch failed: {exc!r}"}

    def finish(self, *, judged: bool) -> dict[str, Any]:
        """The worker ended: the judge's verdict once it has one (`judged`), or its end."""
        self.claims.handles.end_stream(self.worker_dir, judged=judged)
        self._thread.join()
        return self.verdict


def judge_end_error(run: ProcessRun, limits: SandboxLimits) -> str:
    """Why a judge ended without a result. Killed on its own memory: an evaluation error (no
    candidate code runs in the judge; the problem's reference and truth did not fit the
    limit), said so, not the candidate's "out of memory"."""
    if run.killed == "memory":
        return (
            f"an evaluation error, not the candidate's: the judge (a process without candidate "
            f"code) passed its own {limits.memory_limit_mb} MB memory limit with "
            f"{run.peak_mb:.0f} MB checking the reference's outputs "
            "(SandboxLimits.memory_limit_mb; the problem's evaluation does not fit this "
            f"machine)\n{run.logs[-4000:]}"
        )
    return (
        f"the judge process ended without a result ({run.how()}, "
        f"{run.killed or 'not killed'})\n{run.logs[-4000:]}"
    )


def positive(value: Any) -> float | None:
    """`value` as a float when it is a finite number above zero, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value > 0 and value == value and value != float("inf") else None
