"""A kernel whose thread slows the CPU anchors, through `pytest` as a user runs it: the
session refuses it. Its thread holds the GIL without CPU while the memory anchor runs (the
anchor's call cannot return meanwhile): the time the timer's thread was blocked is counted on
its own clocks, so the refusal holds however busy the machine is. The streaming and
computing threads, and the rule itself: tests/measure/timing/test_cpu_anchor_attacks.py."""

from __future__ import annotations

import threading

import pytest

from tests.plugin.test_honest_measurement import HEADER

HOLDS_THE_GIL = """
import ctypes, sys

def big(device):
    return (torch.randn(256, 256, device=device), torch.randn(256, 256, device=device))

STATE = {"go": threading.Event(), "started": threading.Event()}
HOLD = ctypes.pythonapi.usleep  # the C library's usleep, called with the GIL held

def _holder():
    # Woken as each sampled call returns: sleeps through the GEMMs (the GIL free), then
    # holds the GIL 0.1 ms at a time until the timer records the sample's memory anchor.
    while STATE["go"].wait(2.0):  # gone 2 s after the timing ends (a later one starts another)
        STATE["go"].clear()
        pairs, seen = STATE["pairs"], STATE["seen"]
        STATE["started"].set()
        time.sleep(1e-4)
        while len(pairs.memory_s) == seen:
            HOLD(100)

@pytest.mark.kernelpro(reference=ref, inputs=big)
def slows_the_anchors(x, y):
    out = torch.tanh(x @ y)
    frame = sys._getframe(1)  # the timer's sample loop, and its pairs while they record
    while frame is not None and frame.f_code.co_name != "take":
        frame = frame.f_back
    pairs = None if frame is None else frame.f_locals.get("pairs")
    if pairs is not None:
        if "thread" not in STATE or not STATE["thread"].is_alive():
            STATE["thread"] = threading.Thread(
                target=_holder, daemon=True, name="kernelpro-test-beside"
            )
            STATE["thread"].start()
        STATE["pairs"], STATE["seen"] = pairs, len(pairs.memory_s)
        STATE["started"].clear()
        STATE["go"].set()
        STATE["started"].wait(0.05)
    return out
"""


def test_a_kernel_whose_thread_holds_the_gil_beside_the_anchors_is_refused(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_beside=HEADER + HOLDS_THE_GIL)
    try:
        result = kp_project.runpytest("--kernelpro-time-budget=1")
    finally:
        for thread in threading.enumerate():
            if thread.name == "kernelpro-test-beside":
                thread.join()
    result.assert_outcomes(failed=1)
    refused = [line for line in result.stdout.lines if line.startswith("slows_the_anchors is")]
    assert len(refused) == 1, result.stdout.str()[-3000:]
    assert "held the GIL, while the CPU anchors ran after the timed calls" in refused[0]
