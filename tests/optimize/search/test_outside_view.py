"""A worker's claimed timing phase against its parent's clock and the CPU time it saw
(optimize/sandbox/outside_view.py); the sandbox end to end is in tests/optimize/search/test_sandbox_honest_timing.py."""

from __future__ import annotations

import os

from pytest_kernelpro.optimize.sandbox.outside_view import (
    PhaseMark,
    claim_failure,
    process_cpu_s,
    tree_cpu_s,
)


def test_an_honest_claim_within_the_polling_slack_is_believed() -> None:
    start, end = PhaseMark(10.0, 1.0), PhaseMark(14.2, 5.0)
    assert claim_failure(4.0, start, end, poll_s=0.2, cores=2) is None
    assert claim_failure(3.8, start, end, poll_s=0.2, cores=2) is None  # seen a poll late


def test_a_claim_five_times_shorter_than_the_parents_window_is_refused() -> None:
    failure = claim_failure(0.8, PhaseMark(10.0, 1.0), PhaseMark(14.0, 4.0), poll_s=0.2, cores=2)
    assert failure is not None
    assert failure.startswith("timing not believed: the worker claims its timing phase took 0.8 s")
    assert "its parent saw it in that phase for 4 s" in failure


def test_cpu_time_bounds_the_claim_from_below() -> None:
    """The parent's window is too short to judge (one poll), but 8 s of CPU on 2 cores cannot
    fit in 1 s of wall time."""
    start, end = PhaseMark(10.0, 0.0), PhaseMark(10.3, 8.0)
    assert claim_failure(1.0, start, end, poll_s=0.2, cores=2) is not None
    assert claim_failure(4.0, start, end, poll_s=0.2, cores=2) is None


def test_no_marks_no_verdict() -> None:
    assert claim_failure(0.1, None, PhaseMark(1.0, 0.0), poll_s=0.2, cores=1) is None
    assert (
        claim_failure(None, PhaseMark(0.0, 0.0), PhaseMark(9.0, 0.0), poll_s=0.2, cores=1) is None
    )


def test_this_process_cpu_time_is_read_from_proc() -> None:
    before = process_cpu_s(os.getpid())
    sum(i * i for i in range(2_000_000))  # burn some CPU
    assert process_cpu_s(os.getpid()) > before
    assert tree_cpu_s(os.getpid(), lambda pid: []) >= before


def test_a_parent_late_to_poll_does_not_lengthen_its_window() -> None:
    """The parent polls at 0 s and 0.05 s (the worker timing), then is descheduled and next
    looks at 0.5 s (the worker has moved on). The window it can vouch for ends at its last
    poll that saw the phase, so an honest 0.06 s claim is believed; the end-at-first-sight
    window (0.5 s) refused such claims on a loaded CI machine."""
    from pytest_kernelpro.optimize.sandbox.supervise import POLL_TIMING_S, mark_timing_phase

    marks: dict[str, object] = {}
    me = os.getpid()
    for now, seen in [(0.0, "checks"), (0.001, "timing"), (0.05, "timing"), (0.5, "timed")]:
        mark_timing_phase(marks, seen, now, me)
    start, end = marks["timing"], marks["timed"]
    assert isinstance(start, PhaseMark)
    assert isinstance(end, PhaseMark)
    assert (start.at_s, end.at_s) == (0.001, 0.05)
    assert claim_failure(0.06, start, end, poll_s=POLL_TIMING_S, cores=1) is None
    # The same claim against the window closed at the late poll would have been refused.
    late = PhaseMark(0.5, end.cpu_s)
    assert claim_failure(0.06, start, late, poll_s=POLL_TIMING_S, cores=1) is not None
    # Later polls change nothing once the end is marked.
    mark_timing_phase(marks, "timing", 9.0, me)
    assert marks["timed"] is end
