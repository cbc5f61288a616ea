"""The CUDA timer's honesty checks on the CPU, with a stand-in for torch's CUDA layer.

The stand-in's events read the host clock when recorded and its device-wide synchronize
waits for the "device work" a kernel left pending, so the timer's own code runs unchanged
(`measure.timing.cuda._time_cuda_on`): fresh inputs before every sample, outputs checked,
the checked calls that see work left running after the timed stream's end event, the stream
watch. The real GPU runs are bench/honest_measurement_h200.py.
"""

from __future__ import annotations

import time
import types
from typing import Any

import pytest
import torch

from pytest_kernelpro.measure.output_rule import compare_outputs, tolerance_rule
from pytest_kernelpro.measure.timing import DishonestTiming, TimingBudget
from pytest_kernelpro.measure.timing.cuda import _time_cuda_on
from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs
from pytest_kernelpro.measure.timing.streams import StreamWatch

PENDING: list[float] = []  # seconds of "device work" a call left running on a side stream


class FakeStream:
    def __init__(self, stream_id: int = 0) -> None:
        self.stream_id, self.device_index, self.device_type = stream_id, 0, 1


class FakeEvent:
    def __init__(self, enable_timing: bool = True) -> None:
        self.t = 0.0

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) * 1e3

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


def _synchronize() -> None:
    """The device-wide synchronize: returns once the pending side-stream work is done."""
    while PENDING:
        time.sleep(PENDING.pop())


def fake_torch() -> Any:
    cuda = types.SimpleNamespace(
        Event=FakeEvent,
        _sleep=lambda cycles: None,
        synchronize=_synchronize,
        current_stream=lambda device=None: FakeStream(0),
        set_stream=lambda stream: None,
        is_available=lambda: True,
        streams=types.SimpleNamespace(Stream=type("Stream", (), {})),
    )
    c = types.SimpleNamespace(_CudaEventBase=FakeEvent, _cuda_synchronize=_synchronize)
    return types.SimpleNamespace(cuda=cuda, _C=c)


def _check(got: Any, expected: Any) -> str | None:
    failed = [r for r in compare_outputs(torch, got, expected, tolerance_rule()) if not r.ok]
    return failed[0].message if failed else None


def ref(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 2.0)


def _time(kernel: Any, budget: TimingBudget | None = None) -> Any:
    inputs = (torch.randn(64, 64),)
    fresh = fresh_inputs(
        torch, kernel, inputs, device="cpu",
        make_draw=lambda seed: (torch.randn(64, 64),), reference=ref, check=_check,
    )  # fmt: skip
    fake = fake_torch()
    watch = StreamWatch().install(fake, force=True)
    props = types.SimpleNamespace(name="stand-in GPU", L2_cache_size=0)
    budget = budget or TimingBudget(warmup_ms=1, max_time_s=0.05, flush_l2=False)
    try:
        return _time_cuda_on(fake, kernel, 0, props, budget, None, fresh, watch)
    finally:
        watch.uninstall()


def test_an_honest_kernel_is_timed_with_fresh_inputs_and_checked_calls() -> None:
    log, extra = _time(ref)
    assert log.samples
    honesty = extra["honesty"]
    assert honesty["mode"] == "mix"
    assert honesty["checked_calls"] >= 2  # one after the warm-up, one per round
    assert honesty["stream_switches"] == []


def test_work_left_running_past_the_end_event_is_refused_by_name() -> None:
    """A kernel that returns at once and leaves 50 ms of device work on a side stream."""

    def escapes(x: torch.Tensor) -> torch.Tensor:
        PENDING.append(0.05)
        return torch.tanh(x * 2.0)

    with pytest.raises(DishonestTiming, match="device work outside the timed stream"):
        _time(escapes)


def test_marked_streams_any_it_is_timed_at_its_real_cost() -> None:
    def own_stream(x: torch.Tensor) -> torch.Tensor:
        PENDING.append(0.005)
        return torch.tanh(x * 2.0)

    budget = TimingBudget(warmup_ms=1, max_time_s=0.05, flush_l2=False, streams="any")
    log, extra = _time(own_stream, budget)
    assert min(log.samples) >= 0.005  # every sample waited for the device-wide end
    assert extra["honesty"]["streams"] == "any"


def test_a_stale_output_among_the_timed_calls_is_refused() -> None:
    memo: dict[int, torch.Tensor] = {}

    def memo_by_identity(x: torch.Tensor) -> torch.Tensor:
        if id(x) not in memo:
            memo[id(x)] = torch.tanh(x * 2.0)
        return memo[id(x)]

    with pytest.raises(DishonestTiming, match=r"timed call \d+ returned a wrong output"):
        _time(memo_by_identity)


def test_a_memo_by_version_never_hits_in_any_call_of_the_timer() -> None:
    """Every call the timer makes, the warm-up's included, sees inputs with a new _version
    (as the CPU timer's do). The warm-up's did not, and on the H200 a memo by _version hit
    26 times in a session that tested it (tests/plugin/test_honest_measurement.py)."""
    memo: dict[tuple[int, int], torch.Tensor] = {}
    hits: list[int] = []

    def memo_by_version(x: torch.Tensor) -> torch.Tensor:
        key = (id(x), x._version)
        if key in memo:
            hits.append(1)
            return memo[key]
        memo[key] = out = torch.tanh(x * 2.0)
        return out

    budget = TimingBudget(warmup_ms=5, max_time_s=0.05, flush_l2=False)
    log, extra = _time(memo_by_version, budget)
    assert extra["warmup_runs"] > 6  # the warm-up loop ran (6: the first call and the estimate)
    assert log.samples
    assert hits == []
