"""An `Evaluator` wrapper that profiles every correct candidate like a user's kernel item.

`ProfilingEvaluator(inner, profiler)` delegates to `inner` (the sandbox: build, check, time)
and, for each candidate it finds correct, calls `profiler(candidate, evaluation)`, which
returns `Analysis.to_dict()` (ncu of the candidate's own `__global__` kernels, SASS,
timeline, Stage 1, every relevant tool). What the next prompt needs goes into the
evaluation, where `agents/feedback.py` reads it:

- `metrics["guidance_md"]`: the tools' guidance in the seed's order ("tools" feedback);
- `metrics["raw_guidance_md"]`: the same candidate's ncu counters as name = value lines
  ("raw" feedback);
- `metrics["profile"]`: Stage 1, what was not collected, the report text, and the seconds the
  profile cost (`profile_s`, also per candidate in `records`);
- `findings`: the tools' findings (tool, severity, title, root cause).

With feedback "none" nothing is profiled (the ablation's control, and no GPU time spent).
The search never knows: it sees a slower evaluator whose evaluations say more. A profile
that fails or runs past `timeout_s` leaves the candidate's evaluation as the sandbox made it,
with the reason in `metrics["profile"]["error"]`; it never fails the candidate.

`CandidateProfiler` is the GPU profiler: one child process per candidate
(`analysis/candidate.py`), started with the sandbox's scrubbed environment in its own session
and killed (whole process group) at its time limit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.agents.feedback import check_feedback_mode
from pytest_kernelpro.analysis.candidate import combined_problem
from pytest_kernelpro.errors import KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.analysis.core import RooflineFacts
    from pytest_kernelpro.search.base import Candidate, Evaluation, Evaluator

Profiler = Callable[["Candidate", "Evaluation"], Mapping[str, Any]]


class ProfileFailed(KernelproError):
    """Profiling one candidate did not produce an analysis (the reason says why)."""


@dataclass(frozen=True)
class ProfileRecord:
    """What profiling one candidate cost and found (for the search's report)."""

    strategy: str
    profile_s: float
    ok: bool
    stage1: str = ""
    findings: int = 0
    error: str = ""
    guidance_chars: int = 0


class ProfilingEvaluator:
    """Profiles each correct candidate after `inner` evaluated it (module doc)."""

    def __init__(self, inner: Evaluator, profiler: Profiler, *, feedback: str = "tools") -> None:
        self.inner = inner
        self.profiler = profiler
        self.feedback = check_feedback_mode(feedback)
        self.records: list[ProfileRecord] = []
        # Called with "profiling" before each candidate's profile (progress displays).
        self.on_phase: Callable[[str], None] | None = None

    def environment(self) -> dict[str, str] | None:
        """The inner sandbox's worker environment, when it has one."""
        env = getattr(self.inner, "environment", None)
        return env() if callable(env) else None

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Let the inner evaluator build the expansion ahead (`SandboxEvaluator.prepare`)."""
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            prepare(candidates)

    def evaluate(self, candidate: Candidate) -> Evaluation:
        """The inner evaluation, with the candidate's profile and guidance when correct."""
        evaluation = self.inner.evaluate(candidate)
        if not evaluation.ok or self.feedback == "none":
            return evaluation
        if self.on_phase is not None:
            self.on_phase("profiling")
        started = time.perf_counter()
        try:
            result = dict(self.profiler(candidate, evaluation))
        except ProfileFailed as exc:
            spent = time.perf_counter() - started
            evaluation.metrics["profile"] = {"error": str(exc), "profile_s": spent}
            self.records.append(ProfileRecord(candidate.strategy, spent, False, error=str(exc)))
            return evaluation
        spent = time.perf_counter() - started
        _attach(evaluation, result, spent)
        self.records.append(
            ProfileRecord(
                candidate.strategy,
                spent,
                True,
                stage1=str((result.get("stage1") or {}).get("cls") or ""),
                findings=len(result.get("findings") or ()),
                guidance_chars=len(result.get("guidance_md") or ""),
            )
        )
        return evaluation


def ncu_gpu_time_s(kernels: Sequence[Mapping[str, Any]]) -> float | None:
    """Sum of `gpu__time_duration.sum` over profiled kernels (the `profile.kernels` entries
    of an Analysis dict), in seconds: the GPU time one call cannot go below, which the
    winner's confirmation checks its time against (`search.confirm`). None when no kernel
    has a usable duration."""
    from pytest_kernelpro.tools.timeline import SECONDS_PER_UNIT

    total, seen = 0.0, False
    for kernel in kernels:
        metrics = ((kernel.get("metrics") or {}).get("metrics") or {}) if kernel else {}
        entry = metrics.get("gpu__time_duration.sum") or {}
        value, scale = entry.get("value"), SECONDS_PER_UNIT.get(str(entry.get("unit", "")))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or scale is None:
            continue
        if value > 0:
            total += float(value) * scale
            seen = True
    return total if seen else None


def _main_counters(profile: Mapping[str, Any]) -> dict[str, float]:
    for kernel in profile.get("kernels") or ():
        metrics = (kernel.get("metrics") or {}).get("metrics") or {}
        if metrics:
            return {
                name: float(m["value"])
                for name, m in metrics.items()
                if isinstance(m.get("value"), (int, float)) and not isinstance(m["value"], bool)
            }
    return {}


def _attach(evaluation: Evaluation, result: Mapping[str, Any], spent: float) -> None:
    profile = result.get("profile") or {}
    if result.get("guidance_md"):
        evaluation.metrics["guidance_md"] = result["guidance_md"]
    if result.get("raw_md"):
        evaluation.metrics["raw_guidance_md"] = result["raw_md"]
    counters = _main_counters(profile)
    if counters:
        evaluation.metrics["ncu"] = counters
    evaluation.metrics["profile"] = {
        "profile_s": spent,
        "collect_s": float(result.get("profile_s") or 0.0),
        "build_s": result.get("build_s"),
        "stage1": result.get("stage1"),
        "kernels": [k.get("name") for k in profile.get("kernels") or ()],
        # GPU time of one call by ncu's clock: the winner's confirmation cross-checks with it.
        "ncu_gpu_time_s": ncu_gpu_time_s(profile.get("kernels") or ()),
        "sass": any(k.get("sass") for k in profile.get("kernels") or ()),
        "timeline": profile.get("timeline") is not None,
        "not_collected": list(profile.get("not_collected") or ()),
        "text": result.get("text", ""),
    }
    for finding in result.get("findings") or ():
        evaluation.findings.append(
            {k: finding.get(k) for k in ("tool", "kernel", "severity", "title", "root_cause")}
        )


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _scrubbed_environment() -> dict[str, str]:
    """The sandbox's environment rules (no secrets), with this package importable."""
    from pytest_kernelpro.search.evaluator import PACKAGE_ROOT, scrub_environment

    env = scrub_environment(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p
    )
    env["PYTHONUNBUFFERED"] = "1"
    return env


class CandidateProfiler:
    """Profiles a candidate on the GPU in a child process (`analysis/candidate.py`)."""

    def __init__(
        self,
        reference_source: str,
        facts: RooflineFacts,
        *,
        device: str = "cuda",
        timeout_s: float = 120.0,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        ncu_path: str | None = None,
        timeline_runs: int = 5,
        max_launches: int = 8,
    ) -> None:
        if timeout_s <= 0:
            raise KernelproError(f"candidate profile timeout_s={timeout_s!r} must be positive")
        self.reference_source = reference_source
        self.facts = facts
        self.device = device
        self.timeout_s = timeout_s
        self.env = dict(env) if env is not None else _scrubbed_environment()
        self.python = python
        self.ncu_path = ncu_path
        self.timeline_runs = timeline_runs
        # ncu replays every profiled launch once per metric pass, so a PyTorch-op candidate of
        # a dozen kernels costs a dozen fused ones: the cap bounds one candidate's profile.
        self.max_launches = max_launches

    def __call__(self, candidate: Candidate, evaluation: Evaluation) -> Mapping[str, Any]:
        """The candidate's Analysis dict; `ProfileFailed` when none could be made."""
        median = evaluation.metrics.get("candidate_median_s")
        facts = self.facts.for_median(float(median) if median else None)
        with tempfile.TemporaryDirectory(prefix="kernelpro-profile-cand-") as tmp:
            workdir = Path(tmp)
            problem = workdir / "candidate_problem.py"
            problem.write_text(
                combined_problem(self.reference_source, candidate.code), encoding="utf-8"
            )
            output = workdir / "analysis.json"
            spec = {
                "problem_file": str(problem),
                "device": self.device,
                # The child's own profilers share the budget: the timeline and ncu runs.
                "timeout_s": max(1.0, self.timeout_s / 2),
                "facts": facts.to_dict(),
                "output": str(output),
                "ncu_path": self.ncu_path,
                "timeline_runs": self.timeline_runs,
                "max_launches": self.max_launches,
            }
            (workdir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
            with open(workdir / "stderr.log", "wb") as err:
                proc = subprocess.Popen(
                    [
                        self.python,
                        "-m",
                        "pytest_kernelpro.analysis.candidate",
                        str(workdir / "spec.json"),
                    ],
                    cwd=workdir,
                    env=self.env,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
                try:
                    code = proc.wait(timeout=self.timeout_s)
                except subprocess.TimeoutExpired:
                    _kill_group(proc)
                    proc.wait()
                    raise ProfileFailed(
                        f"profiling the candidate ran past its {self.timeout_s:.0f} s limit "
                        "(--kernelpro-profile-timeout)"
                    ) from None
                except BaseException:
                    _kill_group(proc)
                    proc.wait()
                    raise
                _kill_group(proc)  # profiler children left behind
            if code != 0 or not output.exists():
                tail = (workdir / "stderr.log").read_text(errors="replace").strip().splitlines()
                raise ProfileFailed(
                    f"the candidate profiler exited with {code}: " + " | ".join(tail[-3:])[:600]
                )
            return json.loads(output.read_text(encoding="utf-8"))
