"""What the fresh-content mix holds and the attacks on how it saves memory (unit level:
measure/timing/fresh_inputs.py): byte weights, a checked call's content rebuilt into the timed
tensors, the call's output dropped before its check compares."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
import torch

from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.fresh_inputs import (
    CHUNK,
    WINDOW,
    DishonestTiming,
    FreshInputs,
    fresh_inputs,
    kept_content,
    kept_content_changed,
)


def _check(got: Any, expected: Any) -> str | None:
    return None if torch.allclose(got, expected, rtol=1e-5, atol=1e-6) else "differs"


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _rows(seed: int, shape: tuple[int, ...] = (64, 128)) -> tuple[torch.Tensor]:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)),)


def _fresh(kernel: Any = _softmax, reference: Any = _softmax, **kw: Any) -> FreshInputs:
    shape = kw.pop("shape", (64, 128))
    fresh = fresh_inputs(
        torch, kernel, list(_rows(1, shape)), device="cpu",
        make_draw=lambda seed: _rows(seed, shape), reference=reference, check=_check, **kw,
    )  # fmt: skip
    assert fresh.mode == "mix"
    return fresh


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def _checked_calls(fresh: FreshInputs, count: int) -> None:
    """`count` calls, each checked, as a timer makes them (untimed)."""
    for _ in range(count):
        content = fresh.before()
        fresh.after(fresh.call(), force=True, content=content)


def _budget() -> TimingBudget:
    return TimingBudget(warmup_ms=0.0, max_time_s=0.05, min_samples=20, max_samples=40)


def test_the_pools_are_one_byte_a_weight_and_the_second_end_is_the_first_rolled() -> None:
    """Kept beside the timed inputs: the first end and a pool of bytes per leaf, a quarter of a
    float32 input. The second end is the first itself, rolled by half its rows as the chunks
    are made: the maker's second draw (which tells that the inputs regenerate) is not kept."""
    drawn: list[weakref.ref[torch.Tensor]] = []

    def draw(seed: int) -> tuple[torch.Tensor]:
        (tensor,) = _rows(seed)
        drawn.append(weakref.ref(tensor))
        return (tensor,)

    fresh = fresh_inputs(
        torch, _softmax, list(_rows(1)), device="cpu", make_draw=draw, reference=_softmax,
        check=_check,
    )  # fmt: skip
    assert fresh.mode == "mix"
    assert fresh.ends is not None
    assert fresh.ends[1][0] is fresh.ends[0][0]
    assert len(drawn) == 1
    gc.collect()
    assert drawn[0]() is None
    (pool,) = fresh.weights
    assert pool.dtype == torch.uint8
    assert pool.numel() == 64 * 128 + WINDOW
    # Each chunk's second end is a view of the first end's other half (row i + 32 of 64).
    plan = fresh.prepare()
    a = fresh.ends[0][0].view(-1)
    for _dst, first, second, *_ in plan:
        assert first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
        offset = first.storage_offset() + 32 * 128
        assert second.storage_offset() == offset % a.numel()
        assert torch.equal(second, a[second.storage_offset() : offset % a.numel() + first.numel()])


def test_a_leaf_whose_roll_is_itself_keeps_the_second_draw_and_its_content_still_changes() -> None:
    """Both halves of its rows equal: rolled, it is itself and every call's content would be
    the first draw (a memo by content would hit, right on every check); that leaf's second end
    is the maker's second draw, kept."""

    def halves(seed: int) -> tuple[torch.Tensor]:
        half = torch.randn(32, 128, generator=torch.Generator().manual_seed(seed))
        return (torch.cat([half, half]),)

    fresh = fresh_inputs(
        torch, _softmax, list(halves(1)), device="cpu", make_draw=halves, reference=_softmax,
        check=_check,
    )  # fmt: skip
    assert fresh.mode == "mix"
    assert fresh.ends is not None
    assert fresh.ends[1][0] is not fresh.ends[0][0]
    assert not torch.equal(fresh.ends[1][0], fresh.ends[0][0])
    seen = set()
    for _ in range(20):
        fresh.before()
        seen.add(fresh.storage[0].numpy().tobytes())
    assert len(seen) == 20


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda g: torch.randn(3, CHUNK + 5, generator=g), id="float32-chunks"),
        pytest.param(lambda g: torch.randn(2048, 1024, generator=g).t(), id="transposed"),
        # Not dense: timed by rows (chunks of 3, the roll's wrap in one of them), its first end
        # a contiguous copy rebuilt flat: the roll is the same rows in both.
        pytest.param(
            lambda g: torch.randn(7, 2 * (CHUNK // 3) + 2, generator=g)[:, ::2], id="strided"
        ),
        pytest.param(lambda g: torch.randn(5, 1, 3, generator=g), id="odd-rows"),
        pytest.param(lambda g: torch.randn(40, 33, generator=g).half(), id="float16"),
        pytest.param(lambda g: torch.randn(40, 33, generator=g).bfloat16(), id="bfloat16"),
        pytest.param(lambda g: torch.randn(40, 33, generator=g).double(), id="float64"),
        pytest.param(lambda g: torch.randint(0, 9, (300,), generator=g), id="int64"),
        pytest.param(lambda g: torch.rand(300, generator=g) > 0.5, id="bool"),
        pytest.param(lambda g: torch.randn((), generator=g), id="0-dim"),
    ],
)
def test_a_checks_content_rebuilt_into_the_timed_tensors_is_the_calls_bit_for_bit(
    make: Any,
) -> None:
    """The check's reference reads the timed tensors refilled from the call's offset: the same
    bits the call got (whatever its dtype, strides or size in chunks), and the copy apart
    (`content`) agrees with them."""

    def draw(seed: int) -> tuple[torch.Tensor]:
        return (make(torch.Generator().manual_seed(seed)),)

    def total(x: torch.Tensor) -> torch.Tensor:
        return x.double().sum()

    fresh = fresh_inputs(
        torch, total, list(draw(1)), device="cpu", make_draw=draw, reference=total,
        check=_check,
    )  # fmt: skip
    assert fresh.mode == "mix"
    for _ in range(3):
        offset, _draw = fresh.before()
        given = fresh.storage[0].clone()
        fresh.storage[0].zero_()  # as a kernel writing its input would
        fresh.expected_on(offset)
        assert torch.equal(_bits(fresh.storage[0]), _bits(given))
        (apart,) = fresh.content(offset)
        assert torch.equal(_bits(apart), _bits(given))
    assert not fresh._apart


def _memo_by_values(count: int) -> tuple[Any, list[int]]:
    """A kernel memoising its output by its input's first `count` values; its hits."""
    memo: dict[tuple[float, ...], torch.Tensor] = {}
    hits = [0]

    def kernel(x: torch.Tensor) -> torch.Tensor:
        key = tuple(x.reshape(-1)[:count].tolist())
        if key in memo:
            hits[0] += 1
            return memo[key].clone()
        memo[key] = out = _softmax(x)
        return out

    return kernel, hits


def test_a_memo_keyed_by_one_value_hits_on_the_byte_weights_and_its_first_hit_is_refused() -> None:
    """One element takes one of 256 values between its two ends, so a memo keyed by it hits
    within a few dozen calls; the rest of the content differs, so the hit's output is wrong
    and its check refuses it."""
    kernel, hits = _memo_by_values(1)
    fresh = _fresh(kernel)
    with pytest.raises(DishonestTiming, match="returned a wrong output"):
        _checked_calls(fresh, 400)
    assert hits[0] == 1


def test_a_memo_keyed_by_eight_values_never_hits() -> None:
    kernel, hits = _memo_by_values(8)
    _checked_calls(_fresh(kernel), 300)
    assert hits[0] == 0


def _memo_rewriting_pools() -> tuple[Any, dict[str, int]]:
    """A memo keyed by eight values that, at its 4th call, finds its timer through gc and
    rewrites the pools in place with a period of the 256 byte values (every value as often as
    in a random pool, but the content then depends only on the offset modulo 256, and the
    memo hits with the right output); that call returns the output a check of it rebuilds."""
    made = {"calls": 0, "hits": 0}
    memo: dict[tuple[float, ...], torch.Tensor] = {}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        made["calls"] += 1
        if made["calls"] == 4:
            for timer in [o for o in gc.get_objects() if type(o) is FreshInputs and o.ends]:
                if timer.storage[0].data_ptr() != x.data_ptr():
                    continue
                for pool in timer.weights:
                    pool.copy_(torch.arange(pool.numel()) % 256)
                # What a check of this call rebuilds from the rewritten pools.
                return _softmax(timer.content(timer._offset)[0])
        key = tuple(x.reshape(-1)[:8].tolist())
        if key in memo:
            made["hits"] += 1
            return memo[key].clone()
        memo[key] = out = _softmax(x)
        return out

    return kernel, made


def test_pools_rewritten_with_every_byte_value_in_a_short_period_are_refused() -> None:
    """The pools' fingerprint reads runs of four weights: a period of the 256 byte values has
    as many distinct bytes as a random pool but few distinct runs."""
    kernel, made = _memo_rewriting_pools()
    with pytest.raises(DishonestTiming, match="rewrote the timer's kept content"):
        time_kernel(None, device="cpu", budget=_budget(), fresh=_fresh(kernel))  # type: ignore[arg-type]
    assert made["calls"] >= 4


def test_the_timers_own_renewal_of_the_pools_passes_their_fingerprint() -> None:
    fresh = _fresh()
    kept = kept_content(fresh, 7)
    pools = [pool.clone() for pool in fresh.weights]
    fresh._used.update(range(WINDOW // 2))  # half of the offsets spent: renewed
    fresh.before()
    assert not any(torch.equal(a, b) for a, b in zip(pools, fresh.weights, strict=True))
    assert kept_content(fresh, 7) != kept
    assert not kept_content_changed(fresh, 7, kept)


def _stale_kernel(shape: tuple[int, ...]) -> tuple[Any, dict[str, Any]]:
    """Computes once, on the first call's content X0, then returns that output on every call
    (the state holds X0 and the timed tensor it was given)."""
    state: dict[str, Any] = {}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        if "x0" not in state:
            state["x0"], state["timed"] = x.clone(), x
            state["y0"] = _softmax(x)
        return state["y0"].clone()

    return kernel, state


def test_a_timed_tensor_rewritten_while_the_reference_reads_it_sends_the_check_apart() -> None:
    """The kernel kept the timed tensor and puts its first content back into it after its
    call (here at the moment the reference reads it, the worst time: a stand-in for its
    thread). The reference then agrees with the stale output, but the timed tensor no longer
    holds the rebuilt content: the check goes to a copy apart, which the kernel never held,
    and refuses it."""
    kernel, state = _stale_kernel((64, 128))

    def reference(x: torch.Tensor) -> torch.Tensor:
        if "timed" in state and x.data_ptr() == state["timed"].data_ptr():
            x.copy_(state["x0"])  # what the kernel's thread writes
        return _softmax(x)

    fresh = _fresh(kernel, reference)
    with pytest.raises(DishonestTiming, match="returned a wrong output"):
        _checked_calls(fresh, 5)
    assert fresh._apart


def test_a_kernel_whose_thread_rewrites_the_timed_tensor_after_its_calls_is_refused() -> None:
    """The same through the timer, with a real thread writing the first content into the timed
    tensor for as long as the timing runs. The thread races the mix's validity trial: where it
    makes the trial disagree, the inputs are the maker's draws instead, and the attack must be
    refused there too. The thread is stopped and joined whatever happens, so it never runs on
    into another test's timing (its CPU between timed calls would refuse honest kernels)."""
    kernel, state = _stale_kernel((256, 1024))
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def rewrite() -> None:
        while not stop.is_set():
            if "timed" in state:
                state["timed"].copy_(state["x0"])

    def starting(x: torch.Tensor) -> torch.Tensor:
        if "x0" not in state:
            threads.append(threading.Thread(target=rewrite, daemon=True))
            threads[-1].start()
        return kernel(x)

    shape = (256, 1024)
    try:
        fresh = fresh_inputs(
            torch, starting, list(_rows(1, shape)), device="cpu",
            make_draw=lambda seed: _rows(seed, shape), reference=_softmax, check=_check,
        )  # fmt: skip
        assert fresh.mode in ("mix", "maker")
        with pytest.raises(DishonestTiming, match="wrong output|disagree"):
            time_kernel(None, device="cpu", budget=_budget(), fresh=fresh)  # type: ignore[arg-type]
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_a_reference_writing_its_inputs_is_no_verdict_on_an_honest_kernel() -> None:
    """The reference zeroes its input after reading it: the timed tensor no longer holds the
    rebuilt content, which is not the kernel's doing; the checks move to copies apart and the
    honest kernel is timed."""

    def zeroing(x: torch.Tensor) -> torch.Tensor:
        out = _softmax(x)
        x.zero_()
        return out

    fresh = _fresh(_softmax, zeroing)
    time_kernel(None, device="cpu", budget=_budget(), fresh=fresh)  # type: ignore[arg-type]
    assert fresh._apart
    assert fresh.checked >= 2


def test_a_reference_returning_its_input_is_compared_on_a_copy() -> None:
    """An identity reference's output is the timed tensor itself: copied before the kernel
    (which holds that tensor) runs again, and a stale identity kernel is still refused."""
    kernel_state: dict[str, torch.Tensor] = {}

    def stale_identity(x: torch.Tensor) -> torch.Tensor:
        kernel_state.setdefault("y0", x.clone())
        return kernel_state["y0"].clone()

    def identity(x: torch.Tensor) -> torch.Tensor:
        return x

    fresh = _fresh(lambda x: x.clone(), identity)
    offset, _ = fresh.before()
    expected = fresh.expected_on(offset)
    assert expected.data_ptr() != fresh.storage[0].data_ptr()
    fresh = _fresh(stale_identity, identity)
    with pytest.raises(DishonestTiming, match="returned a wrong output"):
        _checked_calls(fresh, 5)


def test_the_cpu_timer_drops_the_calls_output_before_its_check_compares() -> None:
    """A checked call holds the output's copy and the reference's output, not the output the
    call returned as well: it is gone when the check runs."""
    returned: list[weakref.ref[torch.Tensor]] = []
    alive_at_check: list[bool] = []

    def kernel(x: torch.Tensor) -> torch.Tensor:
        out = _softmax(x) * (1 + 2**-20)  # not bit-identical: the check runs
        returned.append(weakref.ref(out))
        return out

    def check(got: Any, expected: Any) -> str | None:
        alive_at_check.append(returned[-1]() is not None)
        return _check(got, expected)

    fresh = fresh_inputs(
        torch, kernel, list(_rows(1)), device="cpu", make_draw=_rows, reference=_softmax,
        check=check,
    )  # fmt: skip
    alive_at_check.clear()  # the validity trial's own check holds its output
    time_kernel(None, device="cpu", budget=_budget(), fresh=fresh)  # type: ignore[arg-type]
    assert alive_at_check
    assert not any(alive_at_check)


def test_queued_bytes_counts_the_queued_copies_and_leaves_a_foreign_entry_to_drain() -> None:
    fresh = _fresh()
    fresh.defer = True
    keys = []
    for _ in range(2):
        content = fresh.before()
        keys.append(fresh.after(fresh.call(), force=True, content=content))
    assert fresh.queued_bytes() == 2 * 64 * 128 * 4
    fresh._pending.append("not a check")  # type: ignore[arg-type]
    assert fresh.queued_bytes() == 2 * 64 * 128 * 4
    with pytest.raises(DishonestTiming, match="queue of deferred output checks"):
        fresh.drain(tuple(keys))  # type: ignore[arg-type]


def test_the_maker_setup_holds_at_most_three_copies_of_the_inputs() -> None:
    """Where the mix does not fit (a new draw every call), the setup asks the maker twice for
    one seed (does it repeat itself?). The draw that told the inputs regenerate and the kept
    copy of the inputs are gone by then: the timed inputs and those two draws, 3 copies. Held
    beside them they made 5 (an H100 worker of 23_Softmax held 5.25 copies of its 6 GiB
    input at this moment, and kept them reserved through its timing)."""
    shape = (64, 129)  # no other tensor of this test has it

    def live_copies() -> int:
        gc.collect()  # what is only garbage holds no memory worth counting
        return sum(
            1
            for o in gc.get_objects()
            if type(o) is torch.Tensor and tuple(o.shape) == shape and o.dtype == torch.float32
        )

    alive_at_draw: list[int] = []

    def draw(seed: int) -> tuple[torch.Tensor]:
        alive_at_draw.append(live_copies())
        return _rows(seed, shape)

    inputs = list(_rows(1, shape))
    fresh = fresh_inputs(
        torch, _softmax, inputs, device="cpu", make_draw=draw, reference=_softmax,
        check=_check, free_bytes=1,
    )  # fmt: skip
    assert fresh.mode == "maker"
    assert fresh.maker_repeats
    # The second draw (the inputs regenerate), then the repeat check's two of one seed.
    assert len(alive_at_draw) == 3
    assert alive_at_draw[1:] == [1, 2]  # the timed inputs, then they and the check's first
    assert max(alive_at_draw) + 1 <= 3  # with the draw being made


def test_a_repeating_makers_checked_call_holds_two_copies_of_the_inputs() -> None:
    """A maker that repeats its draw for a seed: the check draws the call's content again from
    the seed (what a kernel wrote into a kept draw is not what the reference reads), so the
    call's draw goes once copied into the timed inputs, and the check's draw is the
    reference's argument as drawn, not copied again. At the reference's call: the timed
    inputs and the check's draw, 2 copies (were 4: the kept draw and the draw's copy beside
    them; with the output's copy and the reference's output, 5 copies of a softmax's 2 GiB at
    the issue's size, bench/results/2026-12-06-optimizer-speed15-cpu.md). Counted for a
    kernel whose output has another shape than its input."""
    shape = (64, 131)  # no other tensor of this test has it

    def live_copies() -> int:
        gc.collect()
        return sum(
            1
            for o in gc.get_objects()
            if type(o) is torch.Tensor and tuple(o.shape) == shape and o.dtype == torch.float32
        )

    at_reference: list[int] = []

    def row_sums(x: torch.Tensor) -> torch.Tensor:  # an output of another shape: not counted
        return x.sum(dim=-1)

    def reference(x: torch.Tensor) -> torch.Tensor:
        at_reference.append(live_copies())
        return row_sums(x)

    inputs = list(_rows(1, shape))
    fresh = fresh_inputs(
        torch, row_sums, inputs, device="cpu", make_draw=lambda seed: _rows(seed, shape),
        reference=reference, check=_check, free_bytes=1,
    )  # fmt: skip
    assert fresh.mode == "maker"
    assert fresh.maker_repeats
    at_reference.clear()  # the setup's trials
    for _ in range(3):
        content = fresh.before()
        fresh.after(fresh.call(), force=True, content=content)
    assert at_reference == [2, 2, 2], at_reference
