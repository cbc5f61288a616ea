"""Where a search's wall time went: named buckets that add up to (at most) its elapsed time.

`WallClock` holds one search's buckets, in the order a search spends them:

- `setup`: the problem's KernelBench view and context, the task, the model backend, the run
  folder (`optimize.py` adds what it spent before the loop started);
- `sandbox_probe`: which isolation this machine allows (`search.isolation`; cached per
  process, and per machine for CUDA, so mostly near zero);
- `current_kernel`: the user's kernel evaluated in the sandbox (worker and judge);
- `reference_profile`: the Benchmarking Agent's profile of the reference;
- per candidate `generate` (the Programmer and Profiling agents), `build`, `check` (the
  worker's time outside its build and timing: interpreter and torch start, the reference,
  correctness; plus the judge's process), `time` (the worker's timer) and `profile`;
- `remeasure` (the final interleaved re-measurement) and `confirm` (the winner's re-timing);
- `patches`: the summary and the patches written to the run folder as the search goes;
- `other`: the rest of the elapsed time (the search algorithm's own bookkeeping, the
  trajectory, the wrappers around each evaluation), `elapsed - sum(named)`.

Each evaluation is split from the time its wrapper measured (`TimedEvaluator`), taking the
parts in a fixed order and never more than what is left: the numbers a worker reports (its
build and timing seconds) are claims, so a forged one can shift time between buckets but
never make the buckets add up to more than the evaluation took.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation, Mode

BUCKETS = (
    "setup",
    "sandbox_probe",
    "current_kernel",
    "reference_profile",
    "generate",
    "build",
    "check",
    "time",
    "profile",
    "remeasure",
    "confirm",
)


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    value = float(value)
    return value if value > 0 and value != float("inf") else 0.0


@dataclass
class WallClock:
    """Where the search's time went, in seconds (module doc)."""

    setup: float = 0.0
    sandbox_probe: float = 0.0
    current_kernel: float = 0.0
    reference_profile: float = 0.0
    generate: float = 0.0
    build: float = 0.0
    check: float = 0.0
    time: float = 0.0
    profile: float = 0.0
    remeasure: float = 0.0
    confirm: float = 0.0
    per_candidate: list[dict[str, Any]] = field(default_factory=list)
    evaluation_other: float = 0.0  # wrappers around evaluations: part of "other"

    def add_evaluation(
        self, strategy: str, evaluation: Evaluation, elapsed: float | None = None
    ) -> None:
        """Split one evaluation of `elapsed` seconds (its wrapper's clock; the evaluation's
        own `wall_s` when None): profile (the profiling evaluator's), the worker's process
        (build, timing, the rest of it: check), the judge's process (check too), and what
        is left (`other_s`: the wrappers)."""
        metrics = evaluation.metrics
        profile = metrics.get("profile")
        profile_s = _seconds(profile.get("profile_s")) if isinstance(profile, dict) else 0.0
        worker_s = _seconds(evaluation.wall_s)
        judge_s = _seconds(metrics.get("judge_s"))
        total = _seconds(elapsed) if elapsed is not None else worker_s + judge_s + profile_s
        left = total

        def take(seconds: float) -> float:
            nonlocal left
            part = min(_seconds(seconds), left)
            left -= part
            return part

        profile_s = take(profile_s)
        worker_s = take(worker_s)
        judge_s = take(judge_s)
        build_s = min(_seconds(getattr(evaluation, "build_s", 0.0)), worker_s)
        timing_s = min(
            sum(
                _seconds(part.get("wall_s"))
                for part in evaluation.timing.values()
                if isinstance(part, dict)
            ),
            worker_s - build_s,
        )
        check_s = worker_s - build_s - timing_s + judge_s
        self.build += build_s
        self.time += timing_s
        self.check += check_s
        self.profile += profile_s
        self.evaluation_other += left
        self.per_candidate.append(
            {
                "strategy": strategy,
                "status": evaluation.status,
                "speedup_vs_reference": evaluation.speedup,
                "elapsed_s": total,
                "build_s": build_s,
                "check_s": check_s,
                "judge_s": judge_s,
                "time_s": timing_s,
                "profile_s": profile_s,
                "other_s": left,
                # Its worker's process started ahead (`sandbox/pool.py`): how long before its
                # task, off the critical path; None when it started with its task.
                "standby": metrics.get("standby"),
                # Where the worker's own time went (`launch`: from its task to its first line).
                "phases": metrics.get("phases"),
                # Sandbox start, build, checks, timing, judge (`sandbox.wall_split.wall_split`).
                "wall_split": metrics.get("wall_split"),
                "peak_mb": metrics.get("peak_mb"),  # host memory, worker or judge
                # Each process's own (the watchdog's limit is per process) and both at once.
                "worker_peak_mb": metrics.get("worker_peak_mb"),
                "judge_peak_mb": metrics.get("judge_peak_mb"),
                "both_peak_mb": metrics.get("both_peak_mb"),
                "both_peak_at": metrics.get("both_peak_at"),
                # A CUDA problem's GPU memory above its level at the start (`device_peak.py`).
                "device_peak_mb": metrics.get("device_peak_mb"),
                "device_peak_at": metrics.get("device_peak_at"),
            }
        )

    def totals(self) -> dict[str, float]:
        """The named buckets (module doc), in the order a search spends them."""
        return {name: float(getattr(self, name)) for name in BUCKETS}


def with_rest(wall: dict[str, float], elapsed: float, **more: float) -> dict[str, float]:
    """`wall` plus `more` (e.g. the patches' time) and `other`: what `elapsed` has beyond
    the named buckets (never negative)."""
    out = dict(wall)
    for name, seconds in more.items():
        out[name] = out.get(name, 0.0) + _seconds(seconds)
    out.pop("other", None)
    out["other"] = max(0.0, _seconds(elapsed) - sum(out.values()))
    return out


class TimedGenerator:
    """Wraps a generator to count its wall time (and forwards the node it works for)."""

    def __init__(self, inner: Any, clock: WallClock) -> None:
        self.inner = inner
        self.clock = clock

    def at_node(self, node_id: int) -> None:
        hook = getattr(self.inner, "at_node", None)
        if callable(hook):
            hook(node_id)

    def generate(
        self, mode: Mode, parent: Candidate | None, evaluation: Evaluation | None, *,
        max_candidates: int = 1,
    ) -> Sequence[Candidate]:  # fmt: skip
        started = time.perf_counter()
        try:
            return self.inner.generate(mode, parent, evaluation, max_candidates=max_candidates)
        finally:
            self.clock.generate += time.perf_counter() - started


class TimedEvaluator:
    """Wraps the evaluator chain to split each evaluation's time (`WallClock`)."""

    def __init__(self, inner: Any, clock: WallClock) -> None:
        self.inner = inner
        self.clock = clock

    def prepare(self, candidates: Sequence[Candidate]) -> None:
        """Let the inner evaluator build ahead (`SandboxEvaluator.prepare`)."""
        prepare = getattr(self.inner, "prepare", None)
        if callable(prepare):
            prepare(candidates)

    def last_evaluation(self) -> None:
        """Pass on that the next evaluation is the budget's last (`SandboxEvaluator.last_evaluation`)."""
        last = getattr(self.inner, "last_evaluation", None)
        if callable(last):
            last()

    def evaluate(self, candidate: Candidate) -> Evaluation:
        started = time.perf_counter()
        evaluation = self.inner.evaluate(candidate)
        elapsed = time.perf_counter() - started
        if not evaluation.wall_s:
            evaluation.wall_s = elapsed
        self.clock.add_evaluation(candidate.strategy, evaluation, elapsed)
        return evaluation


__all__ = ["BUCKETS", "TimedEvaluator", "TimedGenerator", "WallClock", "with_rest"]
