"""The CUDA timer's honesty checks on the CPU, with a stand-in for torch's CUDA layer.

The stand-in's events read the host clock when recorded and its device-wide synchronize
waits for the "device work" a kernel left pending, so the timer's own code runs unchanged
(`measure.timing.cuda._time_cuda_on`): fresh inputs before every sample, outputs checked,
the checked calls that see work left running after the timed stream's end event, the stream
watch. The real GPU runs are bench/honest_measurement_h200.py.
"""

from __future__ import annotations

import gc
import time
import types
import warnings
from typing import Any

import pytest
import torch

from pytest_kernelpro.measure.output_rule import compare_outputs, tolerance_rule
from pytest_kernelpro.measure.timing import DishonestTiming, TimingBudget
from pytest_kernelpro.measure.timing.cuda import _queued, _time_cuda_on
from pytest_kernelpro.measure.timing.fresh_inputs import (
    PENDING_BYTES,
    PENDING_CHECKS,
    fresh_inputs,
)
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


def _seeded(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(64, 64, generator=torch.Generator().manual_seed(seed)),)


def _timing(
    kernel: Any, budget: TimingBudget | None = None, mode: str = "mix", make_draw: Any = None
) -> tuple[Any, Any]:
    """The fresh inputs for `kernel` on the stand-in, and a call that times it with them."""
    fresh = fresh_inputs(
        torch, kernel, (torch.randn(64, 64),), device="cpu",
        make_draw=make_draw or (lambda seed: (torch.randn(64, 64),)), reference=ref, check=_check,
        free_bytes=None if mode == "mix" else 1,  # no room for the mix: a draw per call
    )  # fmt: skip
    assert fresh.mode == mode
    fake = fake_torch()
    props = types.SimpleNamespace(name="stand-in GPU", L2_cache_size=0)
    budget = budget or TimingBudget(warmup_ms=1, max_time_s=0.05, flush_l2=False)

    def run() -> Any:
        watch = StreamWatch().install(fake, force=True)
        try:
            return _time_cuda_on(fake, kernel, 0, props, budget, None, fresh, watch)
        finally:
            watch.uninstall()

    return fresh, run


def _time(
    kernel: Any, budget: TimingBudget | None = None, mode: str = "mix", make_draw: Any = None
) -> Any:
    return _timing(kernel, budget, mode, make_draw)[1]()


def test_an_honest_kernel_is_timed_with_fresh_inputs_and_checked_calls() -> None:
    log, extra = _time(ref)
    assert log.samples
    honesty = extra["honesty"]
    assert honesty["mode"] == "mix"
    assert honesty["stream_checked_calls"] >= 2  # one after the warm-up, one per round
    # The output checks: the first call's always, and 60% of the calls after it.
    assert 1 <= honesty["checked_calls"] <= honesty["calls"]
    assert honesty["stream_switches"] == []


@pytest.mark.parametrize(
    ("held", "count", "compared"),
    [(PENDING_BYTES - 1, 1, False), (PENDING_BYTES, 1, True), (0, PENDING_CHECKS, True)],
)
def test_queued_copies_are_compared_once_they_hold_the_byte_cap(
    held: int, count: int, compared: bool
) -> None:
    """Device memory: a round's checked outputs' copies are compared as soon as they hold
    `PENDING_BYTES` (a large output's copies one at a time, not piled up for the round), or
    once `PENDING_CHECKS` are queued."""
    drained: list[tuple[Any, ...]] = []
    run = types.SimpleNamespace(
        fresh=types.SimpleNamespace(queued_bytes=lambda: held), drain=drained.append
    )
    keys = tuple((n, 0, None) for n in range(count))
    left = _queued(keys[:-1], keys[-1], run)  # type: ignore[arg-type]
    assert drained == ([keys] if compared else [])
    assert left == (() if compared else keys)


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


# The attacks below find the timer's state as a kernel would: through the garbage collector,
# the object that holds the queue of deferred checks and the kernel's own input tensor.


def _found_through_gc(x: torch.Tensor) -> Any:
    with warnings.catch_warnings():  # touching every object wakes deprecation warnings
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                state = vars(o)
            except Exception:
                continue
            storage = state.get("storage") if isinstance(state, dict) else None
            if isinstance(state.get("_pending"), list) and any(t is x for t in storage or ()):
                return o
    raise AssertionError("the timer's state was not found")


def _tampering_kernel(tamper: Any, lazy: bool = False) -> Any:
    """From its 3rd call on, `tamper(state, memo)` on every call (memo: the 1st call's
    output, content offset and draw); lazy: returns the memo from then on."""
    seen: dict[str, Any] = {"calls": 0}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        seen["calls"] += 1
        if "state" not in seen:
            seen["state"] = _found_through_gc(x)
        state = seen["state"]
        if seen["calls"] == 1:
            seen["memo"] = [torch.tanh(x * 2.0), state._offset, state._draw]
            return seen["memo"][0]
        if seen["calls"] >= 3:
            tamper(state, seen["memo"])
            if lazy:
                return seen["memo"][0]
        return torch.tanh(x * 2.0)

    return kernel


def _drain_swallowing(state: Any, memo: Any) -> None:
    try:  # the queue compared by the kernel itself, its refusal caught: then empty
        state.drain()
    except DishonestTiming:
        pass


def _replace_with_the_first_entry(state: Any, memo: Any) -> None:
    pending = state._pending
    if pending and len(memo) == 3:
        memo.append(pending[0])  # an entry of an honest call, kept
    if len(memo) == 4:
        pending[:] = [memo[3]] * len(pending)


def _point_keys_at_the_memos_content(state: Any, memo: Any) -> None:
    state._pending[:] = [((k[0], memo[1], k[2]), snap) for k, snap in state._pending]


def _append_a_forged_entry(state: Any, memo: Any) -> None:
    state._pending.append(((0, memo[1], None), memo[0].clone()))


TAMPERING = {
    "cleared": lambda state, memo: state._pending.clear(),
    "drained_by_the_kernel": _drain_swallowing,
    "replaced_by_an_honest_entry": _replace_with_the_first_entry,
    "keys_pointed_at_the_memos_content": _point_keys_at_the_memos_content,
    "forged_entry_appended": _append_a_forged_entry,
}
WHAT = {
    "cleared": "emptied or shortened",
    "drained_by_the_kernel": "emptied or shortened",
    "replaced_by_an_honest_entry": "edited",
    "keys_pointed_at_the_memos_content": "edited",
    "forged_entry_appended": "added to",
}


@pytest.mark.parametrize("how", sorted(TAMPERING))
def test_an_honest_kernel_tampering_with_the_deferred_queue_is_refused_by_name(how: str) -> None:
    """Honest outputs: only the tampering with the queue can be what is refused."""
    with pytest.raises(DishonestTiming, match=f"queue of deferred output checks was {WHAT[how]}"):
        _time(_tampering_kernel(TAMPERING[how]))


@pytest.mark.parametrize("how", sorted(TAMPERING))
def test_a_memo_hiding_its_wrong_outputs_in_the_deferred_queue_is_refused(how: str) -> None:
    with pytest.raises(DishonestTiming, match="queue of deferred output checks|wrong output"):
        _time(_tampering_kernel(TAMPERING[how], lazy=True))


def _point_the_object_at_the_memos_content(state: Any, memo: Any) -> None:
    state._offset, state._draw = memo[1], memo[2]


@pytest.mark.parametrize("mode", ["mix", "maker"])
def test_a_memo_pointing_the_timers_object_at_its_content_is_refused(mode: str) -> None:
    """The memo returned and the content the check would rebuild rewritten to the memo's (the
    mix's offset, the maker's draw): every CUDA timed call carries the token `before`
    returned to `after`, so the rewrite is seen at the call it was made in."""
    kernel = _tampering_kernel(_point_the_object_at_the_memos_content, lazy=True)
    with pytest.raises(DishonestTiming, match="which content the call was given"):
        _time(kernel, mode=mode)


@pytest.mark.parametrize("make_draw", [None, _seeded], ids=["unseeded", "seeded"])
def test_an_honest_kernel_on_a_draw_of_the_maker_per_call_passes(make_draw: Any) -> None:
    log, extra = _time(ref, mode="maker", make_draw=make_draw)
    assert log.samples
    assert extra["honesty"]["mode"] == "maker"


def test_a_maker_draw_rewritten_in_place_during_the_call_is_refused() -> None:
    """A maker that makes the same draw for a seed: each check makes its call's draw again
    from the seed, so the memo's inputs written into the kept draw are not what the reference
    runs on (before, the check cloned the kept draw and every such memo passed)."""
    state_memo: dict[str, Any] = {}

    def memo_rewriting_the_draw(x: torch.Tensor) -> torch.Tensor:
        if "state" not in state_memo:
            state_memo["state"] = _found_through_gc(x)
        state = state_memo["state"]
        if "out" not in state_memo:
            state_memo["in"], state_memo["out"] = x.clone(), torch.tanh(x * 2.0)
            return state_memo["out"]
        # Where the timer still holds the draw (a repeating maker's goes once copied in).
        for leaf in state._draw if isinstance(state._draw, (list, tuple)) else ():
            leaf.copy_(state_memo["in"])
        return state_memo["out"]

    with pytest.raises(DishonestTiming, match="wrong output"):
        _time(memo_rewriting_the_draw, mode="maker", make_draw=_seeded)


def _confirming_run(kernel: Any) -> Any:
    """The CUDA timer's shared state for `kernel` on the stand-in, fresh inputs deferred."""
    from pytest_kernelpro.measure.timing import cuda
    from pytest_kernelpro.measure.timing.streams import EscapeProbe

    fresh = fresh_inputs(
        torch, kernel, (torch.randn(64, 64),), device="cpu",
        make_draw=lambda seed: (torch.randn(64, 64),), reference=ref, check=_check,
    )  # fmt: skip
    fresh.defer = True
    fake = fake_torch()
    events = cuda.CudaEvents(fake, FakeStream(0))
    budget = TimingBudget(warmup_ms=1, max_time_s=0.05, flush_l2=False)
    return cuda._CudaRun(
        fake, 0, budget, None, fresh, StreamWatch(), events, EscapeProbe(events), None,
        False, fresh.call,
    )  # fmt: skip


def test_the_escape_recheck_carries_each_calls_token() -> None:
    """The re-measurement before an escape refusal (`EscapeProbe.confirm`, as `_refuse_escape`
    calls it) makes its calls on new content and hands each call's token to `after`: honest
    calls pass their queued checks; a memo that points the timer's object at its own
    content there is refused (the old path handed `after` no token in the re-measurement)."""
    run = _confirming_run(ref)
    queued = run.probe.confirm(run.body, run.observe, None, before=run.refill)
    assert len(queued) == len(run.fresh._pending)
    run.drain(queued)
    assert run.fresh._pending == []

    memo: dict[str, Any] = {}

    def memo_in_the_recheck(x: torch.Tensor) -> torch.Tensor:
        if "state" not in memo:
            memo["state"] = _found_through_gc(x)
        if "out" not in memo:
            memo["out"], memo["offset"] = torch.tanh(x * 2.0), memo["state"]._offset
            return memo["out"]
        memo["state"]._offset = memo["offset"]
        return memo["out"]

    run = _confirming_run(memo_in_the_recheck)
    with pytest.raises(DishonestTiming, match="which content the call was given"):
        run.probe.confirm(run.body, run.observe, None, before=run.refill)


def _found_run() -> Any:
    """The CUDA timer's shared state, as a kernel finds it through gc (by its type's name)."""
    for o in gc.get_objects():
        if type(o).__name__ == "_CudaRun":
            return o
    raise AssertionError("the timer's run was not found")


def _rewrite_calls(run: Any) -> None:
    run.calls = 1000  # every sample divided by 1000


def _rewrite_body(run: Any) -> None:
    run.body = lambda: None  # the timed call made a no-op (a replay returns None too)


def _rewrite_fresh(run: Any) -> None:
    run.fresh = None  # no fresh content, no checks


def _rewrite_readings(run: Any) -> None:
    run.readings = []  # the NVML readings of the clock-limit decision dropped


def _delete_anchor(run: Any) -> None:
    del run.anchor


RUN_REWRITES = {
    "calls": _rewrite_calls,
    "body": _rewrite_body,
    "fresh": _rewrite_fresh,
    "readings": _rewrite_readings,
    "anchor": _delete_anchor,
}


@pytest.mark.parametrize("field", sorted(RUN_REWRITES))
def test_a_kernel_rewriting_the_cuda_runs_fields_through_gc_is_refused(field: str) -> None:
    """From its 8th call on (the estimate and the warm-up are behind it) the kernel rewrites
    one field of the timer's run; the fields are compared with the timer's own copy before and
    after every sample and after every checked call."""
    calls = {"n": 0}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 8:
            RUN_REWRITES[field](_found_run())
        return torch.tanh(x * 2.0)

    budget = TimingBudget(warmup_ms=0, max_time_s=0.05, flush_l2=False)
    with pytest.raises(DishonestTiming, match=f"the timer's own state \\({field} of its CUDA run"):
        _time(kernel, budget)
    assert calls["n"] >= 8


def test_a_method_of_the_run_cannot_be_shadowed_on_the_object() -> None:
    """The run has no instance dict: a kernel that sets `drain` (or `observe`) on it to drop
    every check fails in its own call instead (and the class's methods are kept bindings)."""
    seen: dict[str, Any] = {}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        seen["calls"] = seen.get("calls", 0) + 1
        if seen["calls"] == 2:  # the 1st is the mix's validity trial: no timer yet
            run = _found_run()
            try:
                run.drain = lambda queued: None
            except AttributeError as exc:
                seen["refused"] = str(exc)
        return torch.tanh(x * 2.0)

    log, _extra = _time(kernel)
    assert log.samples
    assert "drain" in seen["refused"]


def test_a_failed_timing_drops_its_queued_copies() -> None:
    """A timing that fails mid-round leaves nothing queued: on a GPU the copies held most of
    the item's memory and outlived it."""
    calls = [0]
    holder: list[Any] = []

    def failing_late(x: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        if calls[0] > 12 and holder[0]._pending:
            raise RuntimeError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return ref(x)

    fresh, run = _timing(failing_late, mode="maker")
    holder.append(fresh)
    with pytest.raises(Exception, match="out of memory"):
        run()
    assert calls[0] > 12
    assert fresh._pending == []
    assert fresh.queued_bytes() == 0


def test_a_queued_check_counts_the_draw_it_keeps() -> None:
    """In `maker` mode each queued check keeps its call's draw to rebuild the inputs: the
    queue's bytes count it (an H100 filled with 8 GiB draws behind 256 KiB outputs)."""
    fresh, _run = _timing(ref, mode="maker")
    fresh.defer = True
    for _ in range(2):
        content = fresh.before()
        fresh.after(fresh.call(), force=True, content=content)
    output, draw = 64 * 64 * 4, 64 * 64 * 4
    assert fresh.queued_bytes() == 2 * (output + draw)
