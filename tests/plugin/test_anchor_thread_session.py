"""A kernel whose thread slows the CPU anchors, through `pytest` as a user runs it: the
session refuses it (the rule and the other attacks at the timer:
tests/measure/timing/test_cpu_anchor_attacks.py)."""

from __future__ import annotations

import threading

import pytest

from tests.plugin.test_honest_measurement import HEADER

BESIDE_THE_ANCHORS = """
import sys

def big(device):
    return (torch.randn(256, 256, device=device), torch.randn(256, 256, device=device))

STATE = {"go": threading.Event(), "started": threading.Event()}
BUFFER = torch.ones(16 << 20)  # 64 MiB to stream

def _beside():
    # Woken as each sampled call returns: streams memory (one sum of 64 MiB, without the
    # GIL, outlasting the anchors) until the timer records that sample's memory anchor.
    while STATE["go"].wait(2.0):  # gone 2 s after the timing ends (a later one starts another)
        STATE["go"].clear()
        pairs, seen = STATE["pairs"], STATE["seen"]
        STATE["started"].set()
        while len(pairs.memory_s) == seen:
            BUFFER.sum()

def _slows_the_anchors(x, y):
    out = torch.tanh(x @ y)
    frame = sys._getframe(1)  # the timer's sample loop, and its pairs while they record
    while frame is not None and frame.f_code.co_name != "take":
        frame = frame.f_back
    pairs = None if frame is None else frame.f_locals.get("pairs")
    if pairs is not None:
        if "thread" not in STATE or not STATE["thread"].is_alive():
            STATE["thread"] = threading.Thread(
                target=_beside, daemon=True, name="kernelpro-test-beside"
            )
            STATE["thread"].start()
        STATE["pairs"], STATE["seen"] = pairs, len(pairs.memory_s)
        STATE["started"].clear()
        STATE["go"].set()
        STATE["started"].wait(0.05)  # on a core as the anchors start
    return out

# Three items: where the machine's other processes leave the two threads no two cores at
# once, one timing's thread may not run beside the anchors (nor slow them).
@pytest.mark.kernelpro(reference=ref, inputs=big)
def slows_the_anchors_1(x, y):
    return _slows_the_anchors(x, y)

@pytest.mark.kernelpro(reference=ref, inputs=big)
def slows_the_anchors_2(x, y):
    return _slows_the_anchors(x, y)

@pytest.mark.kernelpro(reference=ref, inputs=big)
def slows_the_anchors_3(x, y):
    return _slows_the_anchors(x, y)
"""


def test_a_kernel_whose_thread_streams_memory_beside_the_anchors_is_refused(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_beside=HEADER + BESIDE_THE_ANCHORS)
    try:
        result = kp_project.runpytest("--kernelpro-time-budget=1")
    finally:
        for thread in threading.enumerate():
            if thread.name == "kernelpro-test-beside":
                thread.join()
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, result.stdout.str()[-3000:]
    refused = [line for line in result.stdout.lines if line.startswith("slows_the_anchors_")]
    refused = [line for line in refused if " is refused: " in line]
    assert refused, result.stdout.str()[-3000:]
    assert all("while the CPU anchors ran after the timed calls" in line for line in refused)
