"""The winner's confirmation times the kernel the way the search does (`worker.retime`: the
search's timed call on the gate's timer, new content every call, outputs checked at calls
chosen after they returned), so a candidate that behaves differently once confirmed is
refused there with the timer's reason.

The attack: honest in the search; in the confirmation's process (found by its frames, or by
the task file its worker reads) it skips its work whenever it is called on a tensor it has
seen before, and computes honestly on any new tensor. The confirmation of old timed one set
of inputs in a loop and handed the judge the output of one more call on new tensors: this
candidate was re-timed far faster than its work, the judge saw a right output, and the
winner stayed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "data" / "search"
TIMING = {"warmup_ms": 1.0, "max_time_s": 0.05, "min_samples": 20, "max_samples": 40}

LAZY_WHEN_CONFIRMED = (
    (DATA / "cpu" / "correct.py")
    .read_text(encoding="utf-8")
    .replace(
        "    def forward(self, x):\n",
        """    def forward(self, x):
        if x.data_ptr() in SEEN and confirming():
            return torch.zeros(x.shape[0], self.lin.weight.shape[0])
        SEEN.add(x.data_ptr())
""",
    )
    + '''

import json
import sys

SEEN = set()


def confirming():
    """The confirmation's worker: a `retime` frame on the stack, or `"retime": true` in the
    task file named on its command line."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "retime":
            return True
        frame = frame.f_back
    try:
        with open(sys.argv[sys.argv.index("--task") + 1]) as handle:
            return bool(json.load(handle).get("retime"))
    except (ValueError, IndexError, OSError):
        return False
'''
)


def _searched_then_confirmed(code: str, name: str) -> Evaluation:
    """`code` evaluated as the search does (it must pass there: honest in the search), then
    confirmed as a winner; the confirmation's outcome."""
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    task = KernelBenchTask(reference, name=name, device="cpu", timing=TIMING, cpu_threads=1)
    limits = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)
    evaluator = SandboxEvaluator(task, limits)
    candidate = Candidate(code)
    searched = evaluator.evaluate(candidate)
    assert searched.status == "correct", searched.reason
    return evaluator.confirm(candidate, searched)


def test_a_candidate_that_skips_its_work_only_when_confirmed_is_disqualified() -> None:
    assert "confirming()" in LAZY_WHEN_CONFIRMED
    confirmed = _searched_then_confirmed(LAZY_WHEN_CONFIRMED, "lazy")
    assert confirmed.status == "cheat", confirmed.timing.get("confirmed")
    assert (confirmed.reason or "").startswith(
        "timing not confirmed: the re-timing run failed (refused while re-timed: timed call "
    ), confirmed.reason
    assert "returned a wrong output" in (confirmed.reason or "")


SLOW_WHEN_CONFIRMED = LAZY_WHEN_CONFIRMED.replace(
    """        if x.data_ptr() in SEEN and confirming():
            return torch.zeros(x.shape[0], self.lin.weight.shape[0])
""",
    """        if confirming():
            time.sleep(0.02)
""",
).replace("import json\n", "import json\nimport time\n")


def test_a_search_time_no_fresh_process_reproduces_is_disqualified_after_the_repeat() -> None:
    """The other side of repeating a slow re-timing (`confirm_winner.RETIMINGS`): a candidate
    whose search time no fresh process reproduces (here: it sleeps whenever it is confirmed)
    is slow in every re-timing and loses the win."""
    assert "time.sleep(0.02)" in SLOW_WHEN_CONFIRMED
    confirmed = _searched_then_confirmed(SLOW_WHEN_CONFIRMED, "slow")
    assert confirmed.status == "cheat", confirmed.timing.get("confirmed")
    assert "re-timed in a fresh process at" in (confirmed.reason or ""), confirmed.reason
    record = confirmed.timing["confirmation"]
    assert len(record["earlier_retimings"]) == 1
    assert min(record["ratio"], record["earlier_retimings"][0]["ratio"]) > record["tolerance"]
