"""Checked calls' inputs by handle through the real evaluation path (`SandboxEvaluator`: the
sandboxed worker, the session, the judge): a candidate that writes into its read-only inputs
fails and is told why, one that tries to make them writable cannot, a reference that writes
its own inputs gets copies (and the candidate with it), and nothing is left afterwards.

Workers import torch (seconds each): one module-scoped run of every candidate.
"""

from __future__ import annotations

import pytest
from test_handle_sandbox import CORRECT, DATA, FAST, REFERENCE
from test_handles import memfds, shm_entries

from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

torch = pytest.importorskip("torch")

FORWARD = "    def forward(self, x):\n"
assert FORWARD in CORRECT
CANDIDATES = {
    "honest": CORRECT,
    # Scales its input in place by exactly 1: the values stay right, the write does not.
    "writes its input": CORRECT.replace(FORWARD, FORWARD + "        x.mul_(1.0)\n"),
    # Asks for write access to its input's pages first, and says what it got.
    "mprotect": CORRECT.replace(
        FORWARD,
        FORWARD + "        import ctypes\n"
        "        libc = ctypes.CDLL(None, use_errno=True)\n"
        "        page = x.data_ptr() & ~4095\n"
        "        if libc.mprotect(ctypes.c_void_p(page), 4096, 3) != 0:\n"
        "            raise PermissionError(f'mprotect refused: errno {ctypes.get_errno()}')\n"
        "        x.mul_(1.0)\n",
    ),
}
# A reference that writes its own input (an in-place ReLU first), and a candidate doing the same.
WRITING_REFERENCE = REFERENCE.replace(
    "        return torch.softmax(self.lin(x), dim=-1)",
    "        x.relu_()\n        return torch.softmax(self.lin(x), dim=-1)",
)
assert WRITING_REFERENCE != REFERENCE
WRITING_CANDIDATE = CORRECT.replace(FORWARD, FORWARD + "        x.relu_()\n")
# Inputs that are not sealed (strided: the problem's layout is kept) are handed to the call as
# they are, as CUDA inputs are: the CPU stand-in of the device path, where a write is found by
# the input's digest taken before the call.
STRIDED_REFERENCE = REFERENCE.replace(
    "return [torch.randn(batch, n)]", "return [torch.randn(n, batch).t()]"
)
assert STRIDED_REFERENCE != REFERENCE
# Its result written over its input (new values: a comparison sees them).
WRITES_VALUES = (DATA / "writes_input.py").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def world() -> dict[str, object]:
    before = {"memfds": memfds(), "shm": shm_entries()}
    limits = SandboxLimits(build_timeout_s=120.0, run_timeout_s=60.0, memory_limit_mb=2048)
    found: dict[str, object] = {"before": before}
    evaluator = SandboxEvaluator(
        KernelBenchTask(REFERENCE, name="softmax_linear", device="cpu", **FAST), limits
    )
    try:
        evaluations = evaluator.evaluate_many(
            [Candidate(code) for code in CANDIDATES.values()], jobs=2
        )
        found.update(zip(CANDIDATES, evaluations, strict=True))
    finally:
        evaluator.close()
    writing = SandboxEvaluator(
        KernelBenchTask(WRITING_REFERENCE, name="relu_softmax", device="cpu", **FAST), limits
    )
    try:
        found["in place like its reference"] = writing.evaluate(Candidate(WRITING_CANDIDATE))
    finally:
        writing.close()
    strided = SandboxEvaluator(
        KernelBenchTask(STRIDED_REFERENCE, name="strided_softmax", device="cpu", **FAST), limits
    )
    try:
        found["writes a shared input"] = strided.evaluate(Candidate(WRITES_VALUES))
    finally:
        strided.close()
    found["after"] = {"memfds": memfds(), "shm": shm_entries()}
    return found


def _ev(world: dict[str, object], name: str) -> Evaluation:
    ev = world[name]
    assert isinstance(ev, Evaluation)
    return ev


@pytest.mark.slow
def test_an_honest_candidate_on_read_only_inputs_is_correct(world) -> None:
    ev = _ev(world, "honest")
    assert ev.status == "correct", (ev.reason, ev.logs[-2000:])


@pytest.mark.slow
def test_a_candidate_writing_its_read_only_input_fails_and_is_told_why(world) -> None:
    ev = _ev(world, "writes its input")
    assert ev.status == "run_error", (ev.reason, ev.logs[-2000:])
    assert "signal SIGSEGV" in ev.reason
    assert "inputs are read-only shared memory" in ev.reason
    assert ev.speedup is None


@pytest.mark.slow
def test_a_candidate_cannot_make_its_inputs_writable(world) -> None:
    ev = _ev(world, "mprotect")
    assert ev.status == "run_error", (ev.reason, ev.logs[-2000:])
    assert "mprotect refused" in ev.reason


@pytest.mark.slow
def test_a_reference_that_writes_its_inputs_gives_the_candidate_copies(world) -> None:
    ev = _ev(world, "in place like its reference")
    assert ev.status == "correct", (ev.reason, ev.logs[-2000:])


@pytest.mark.slow
def test_a_candidate_writing_an_input_that_is_shared_is_refused_by_its_digest(world) -> None:
    ev = _ev(world, "writes a shared input")
    assert ev.status == "cheat", (ev.reason, ev.logs[-2000:])
    assert "modifies its inputs in place (trial 1/3)" in ev.reason


@pytest.mark.slow
def test_no_handle_outlives_the_evaluations(world) -> None:
    before, after = world["before"], world["after"]
    assert after == before
