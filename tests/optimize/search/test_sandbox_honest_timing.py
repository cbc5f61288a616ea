"""Candidates that cheat only once they are timed, through the real sandbox (a worker process
per candidate): each is refused as a cheat with its reason, and an honest one beside them is
correct (measure/timing/fresh_inputs.py, measure/bound.py, optimize/sandbox/worker.py).

The CUDA-only tricks (a side stream, a graph replayed on one, a patched Event.elapsed_time,
torch._C._cuda_setStream) are in bench/cheats/ for the GPU; the stream guard's wrappers are
tested here on stand-ins (test_the_stream_guard_sees_c_level_switches_and_new_streams).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from pytest_kernelpro.optimize.sandbox.checks import StreamGuard
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate, Evaluation

pytestmark = pytest.mark.slow

DATA = Path(__file__).resolve().parents[2] / "data" / "search"
CHEATS = DATA / "honest_timing"
TIMING = {
    "timing": {"warmup_ms": 1.0, "max_time_s": 0.05, "min_samples": 20, "max_samples": 40},
    "cpu_threads": 1,
}
LIMITS = SandboxLimits(build_timeout_s=120.0, run_timeout_s=90.0, memory_limit_mb=1024)

# Which timed call a cheat is caught on follows how many calls the checks and the warm-up
# (a wall-clock deadline) made before it: the reason names the call, the test takes any.
WRONG_WHILE_TIMED = r"refused while timed: timed call \d+ returned a wrong output"
EXPECTED = {
    "memo_identity": WRONG_WHILE_TIMED,
    "garbage_on_repeat": WRONG_WHILE_TIMED,
    "lazy_subclass": re.escape("Lazy, not a plain torch.Tensor"),
    "work_after_return": WRONG_WHILE_TIMED,
    # The channel's kept os.write is a kept name too (bound.keep_module): named, not only
    # caught by the parent's view of the timing phase (as rewrites_result.py is).
    "channel_write": re.escape(
        "refused while timed: pytest_kernelpro.optimize.sandbox.result_channel._os_write (now "
        "kernelpro_candidate._shrinking_write, "
    )
    + r"made by kernelpro_candidate .*\) was replaced|"
    + re.escape(
        "refused while timed: its module (<kernelpro_candidate>) rebound "
        "pytest_kernelpro.optimize.sandbox.result_channel._os_write (to "
        "kernelpro_candidate._shrinking_write), found and put back before this timing"
    ),
    "json_shrink": re.escape("refused while timed: json.dumps (now kernelpro_candidate.<lambda>, ")
    # Named as the patcher: its module made the patch, whenever it was seen.
    + r"made by kernelpro_candidate .*\) was replaced|"
    + re.escape(
        "refused while timed: its module (<kernelpro_candidate>) rebound json.dumps (to "
        "kernelpro_candidate.<lambda>), found and put back before this timing"
    ),
    # Rebound after its timing, on the worker's call after it: the worker's last look at its
    # kept bindings, before it writes its result, names it.
    "rebinds_after_timing": re.escape(
        "time.perf_counter (now kernelpro_candidate.ModelNew.forward.<locals>.<lambda>, made by "
        "kernelpro_candidate (<kernelpro_candidate>)) was replaced in the worker"
    ),
}


@pytest.fixture(scope="module")
def evaluations() -> dict[str, Evaluation]:
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    task = KernelBenchTask(reference, name="softmax_linear", device="cpu", **TIMING)
    names = [*sorted(EXPECTED), "honest"]
    sources = [
        (CHEATS / f"{n}.py" if n != "honest" else DATA / "cpu" / "correct.py").read_text(
            encoding="utf-8"
        )
        for n in names
    ]
    results = SandboxEvaluator(task, LIMITS).evaluate_many(
        [Candidate(code) for code in sources], jobs=2
    )
    return dict(zip(names, results, strict=True))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_candidate_that_cheats_once_timed_is_refused_with_its_reason(
    evaluations: dict[str, Evaluation], name: str
) -> None:
    ev = evaluations[name]
    assert ev.status == "cheat", (ev.status, ev.reason)
    assert re.search(EXPECTED[name], ev.reason or ""), ev.reason
    assert ev.speedup is None


def test_the_honest_candidate_beside_them_is_correct(evaluations: dict[str, Evaluation]) -> None:
    ev = evaluations["honest"]
    assert ev.status == "correct", ev.reason
    honesty = ev.timing["candidate"]["honesty"]
    assert honesty["mode"] == "mix"
    assert honesty["outputs_checked"] is True


def test_the_stream_guard_sees_c_level_switches_and_new_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch._C._cuda_setStream called directly and torch.cuda.streams.Stream(): on a
    CPU-only torch the first is a stand-in set here, the second raises after the guard saw it."""
    calls: list[dict] = []
    monkeypatch.setattr(torch._C, "_cuda_setStream", lambda **kw: calls.append(kw), raising=False)
    guard = StreamGuard().install(force=True)
    try:
        guard.active = True
        torch._C._cuda_setStream(stream_id=12345, device_index=0, device_type=1)
        try:
            torch.cuda.streams.Stream()
        except (RuntimeError, AssertionError):
            pass  # no CUDA here: the constructor refuses after the guard counted it
    finally:
        guard.uninstall()
    assert calls == [{"stream_id": 12345, "device_index": 0, "device_type": 1}]
    assert "switched to stream 12345 (torch._C._cuda_setStream)" in guard.events
    assert any(e.startswith("created a new torch.cuda.streams.Stream") for e in guard.events)
    assert torch._C._cuda_setStream.__name__ == "<lambda>"  # the original is back
    assert "__new__" in torch.cuda.streams.Stream.__dict__


def test_a_result_rewritten_past_the_kept_encoder_is_refused_by_the_parents_view() -> None:
    """A candidate that wraps the worker's own result channel (found in memory) to shrink every
    number: the worker writes a timing phase 5x shorter than the parent saw pass. An honest
    candidate timed the same way is believed. A longer budget than the other tests: the
    phase must outlast the parent's polling slack."""
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    timing = {**TIMING, "timing": {**TIMING["timing"], "max_time_s": 0.6, "max_samples": 5000}}
    task = KernelBenchTask(reference, name="softmax_linear", device="cpu", **timing)
    cheat, honest = SandboxEvaluator(task, LIMITS).evaluate_many(
        [
            Candidate((CHEATS / "rewrites_result.py").read_text(encoding="utf-8")),
            Candidate((DATA / "cpu" / "correct.py").read_text(encoding="utf-8")),
        ],
        jobs=1,
    )
    assert cheat.status == "cheat", (cheat.status, cheat.reason)
    assert (cheat.reason or "").startswith("timing not believed: the worker claims its timing")
    assert honest.status == "correct", honest.reason


@pytest.mark.xfail(
    strict=True,
    reason="known gap: the worker's progress markers are written from the candidate's own "
    "process, so a candidate that also holds back its 'timing' marker leaves the parent no "
    "window to hold a shrunk claim against; on a GPU the profile's ncu kernel time is the "
    "cross-check (optimize/search/confirm), on the CPU there is none yet",
)
def test_a_shrunk_claim_with_its_timing_marker_held_back_is_refused() -> None:
    reference = (DATA / "cpu" / "reference.py").read_text(encoding="utf-8")
    timing = {**TIMING, "timing": {**TIMING["timing"], "max_time_s": 0.6, "max_samples": 5000}}
    task = KernelBenchTask(reference, name="softmax_linear", device="cpu", **timing)
    cheat = SandboxEvaluator(task, LIMITS).evaluate(
        Candidate((CHEATS / "hides_timing_phase.py").read_text(encoding="utf-8"))
    )
    assert cheat.status == "cheat", (cheat.status, cheat.reason)
