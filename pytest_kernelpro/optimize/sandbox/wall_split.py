"""One evaluation's wall time by part (`Evaluation.metrics["wall_split"]`): the sandbox's
start, the build, the checks, the timing and the judge's process, from the worker's progress
lines (`processes.phase_seconds`). The search's clock sums it (`loop/clock.py`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The worker's phases (`worker.BUILD_PHASES`, `RUN_PHASES`; `launch`: the sandbox's setup and
# the interpreter's start before its first line) by the part of an evaluation they are.
SPLIT_PHASES = {
    "sandbox_start_s": ("launch", "start", "import"),
    "build_s": ("build",),
    "checks_s": ("reference", "built", "correctness", "checks", "shapes", "timed", "done"),
    "timing_s": ("timing",),
}


def wall_split(metrics: Mapping[str, Any], prebuild_wait_s: float = 0.0) -> dict[str, float]:
    """One evaluation's wall time by part: the sandbox's start, the build (with the wait for
    compiles made ahead), the checks, the timing (from the worker's progress lines) and the
    judge's process."""
    phases = metrics.get("phases") or {}
    split = {
        part: round(sum(float(phases.get(name) or 0.0) for name in names), 3)
        for part, names in SPLIT_PHASES.items()
    }
    split["build_s"] = round(split["build_s"] + prebuild_wait_s, 3)
    split["judge_s"] = round(float(metrics.get("judge_s") or 0.0), 3)
    return split
