"""The winner's confirmation takes no more samples than its decision needs.

It decides whether a fresh median is within the tolerance of the search's, so the re-timing
samples for at most `worker.RETIME_BUDGET_S` whatever the search's own per-kernel budget,
and the judge checks the re-timed output without timing the reference. A candidate that
sleeps 10 ms per call cannot take more than RETIME_BUDGET_S / 10 ms samples in that time
(a sleep is never shorter), where the search's 30 s budget would allow the 200-sample cap.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.sandbox.worker import RETIME_BUDGET_S, RETIME_MAX_SAMPLES
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "data" / "search"
SLEEP_S = 0.01
SLEEPY = (
    (DATA / "cpu" / "correct.py")
    .read_text(encoding="utf-8")
    .replace(
        "    def forward(self, x):\n",
        f"    def forward(self, x):\n        import time\n        time.sleep({SLEEP_S})\n",
    )
)


def test_the_retiming_is_bounded_by_its_own_budget_not_the_searchs() -> None:
    assert "time.sleep" in SLEEPY
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    timing = {"warmup_ms": 1.0, "max_time_s": 30.0, "min_samples": 5, "flush_l2": False}
    task = KernelBenchTask(reference, name="sleepy", device="cpu", timing=timing, cpu_threads=1)
    limits = SandboxLimits(
        build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024, confirm_tolerance=50.0
    )
    evaluator = SandboxEvaluator(task, limits)
    # As the search recorded it: correct, at the sleep's time per call.
    claimed = Evaluation("correct", timing={"candidate": {"median_s": SLEEP_S}})
    confirmed = evaluator.confirm(Candidate(SLEEPY), claimed)
    assert confirmed.status == "correct", confirmed.reason
    record = confirmed.timing["confirmed"]
    assert record["median_s"] >= SLEEP_S
    most = int(RETIME_BUDGET_S / SLEEP_S) + 1
    assert 5 <= record["samples"] <= most < RETIME_MAX_SAMPLES
    assert "speedup" not in record  # the judge timed no reference
