"""The sandbox's harness run in this process, as a worker runs it, for the tests that watch
what one evaluation does inside (what it digests, when it drops its inputs, which calls it
makes): a task of a reference and a candidate on the CPU with a short timing, and the modules
the run imported removed afterwards, whatever the outcome."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from pytest_kernelpro.optimize.sandbox import harness

QUICK_TIMING = {"warmup_ms": 1.0, "max_time_s": 0.01, "min_samples": 2, "max_samples": 3}


def run_in_process(
    reference: str,
    candidate: str,
    *,
    read: Callable[[Any], Any] | None = None,
    **task_keys: Any,
) -> tuple[dict[str, Any], Any]:
    """The harness's result of the task (`task_keys` added to it or replacing its defaults),
    and what `read` took from the candidate's module before it was removed (None without
    `read`)."""
    task = {
        "reference": reference,
        "candidate": candidate,
        "device": "cpu",
        "timing": dict(QUICK_TIMING),
        "cpu_threads": 1,
        **task_keys,
    }
    try:
        result = harness.run_task(task, lambda phase: None)
        seen = read(sys.modules["kernelpro_candidate"]) if read is not None else None
    finally:
        for name in ("kernelpro_candidate", "kernelpro_reference"):
            sys.modules.pop(name, None)
    return result, seen
