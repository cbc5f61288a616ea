"""The GPU's deferred output checks, driven with CPU tensors (no CUDA needed).

On a GPU a checked call's output copy is queued (`FreshInputs.defer`) and compared after the
round (`drain`). The queue is an object a kernel can find through gc; the keys `after`
returns are kept by the timer in its own frames and handed to `drain(queued)`, which refuses
a queue that does not hold exactly those objects in that order. The same attacks through the
CUDA timer's own code (a stand-in for torch's CUDA layer) are in test_timing_cuda_honesty.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_kernelpro.measure.timing.fresh_inputs import (
    WINDOW,
    DishonestTiming,
    FreshInputs,
    fresh_inputs,
    queue_tampering,
)


def _tanh2(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x * 2.0)


def _check(got: Any, expected: Any) -> str | None:
    return None if torch.allclose(got, expected, rtol=1e-5, atol=1e-6) else "differs"


def _draw(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(32, 32, generator=torch.Generator().manual_seed(seed)),)


def _deferred(mode: str = "mix") -> FreshInputs:
    """Fresh inputs as the CUDA timer uses them (`defer` on), on CPU tensors."""
    fresh = fresh_inputs(
        torch, _tanh2, list(_draw(1)), device="cpu", make_draw=_draw, reference=_tanh2,
        check=_check, free_bytes=None if mode == "mix" else 1,
    )  # fmt: skip
    assert fresh.mode == mode
    fresh.defer = True
    return fresh


def _queue_calls(fresh: FreshInputs, n: int, out: Any = None) -> tuple[Any, ...]:
    """n calls, every one checked (`force`); the keys `after` returned, as the timer keeps
    them. `out`: a fixed output (a memo) instead of the call's own."""
    queued: tuple[Any, ...] = ()
    for _ in range(n):
        content = fresh.before()
        got = fresh.call() if out is None else out
        key = fresh.after(got, force=True, content=content)
        assert key is not None
        queued = (*queued, key)
    return queued


@pytest.mark.parametrize("mode", ["mix", "maker"])
def test_honest_queued_checks_pass_when_the_queue_is_what_the_timer_kept(mode: str) -> None:
    fresh = _deferred(mode)
    queued = _queue_calls(fresh, 8)
    assert len(fresh._pending) == 8  # queued, not compared yet
    fresh.drain(queued)
    assert fresh._pending == []
    assert fresh.checked == 8
    fresh.drain(())  # nothing left, nothing expected


def test_without_deferral_a_check_runs_at_once_and_nothing_is_queued() -> None:
    """The CPU timer's path: `after` compares at once and returns no key."""
    fresh = _deferred()
    fresh.defer = False
    content = fresh.before()
    assert fresh.after(fresh.call(), force=True, content=content) is None
    assert fresh._pending == []
    stale = fresh.call()
    content = fresh.before()
    with pytest.raises(DishonestTiming, match="returned a wrong output"):
        fresh.after(stale, force=True, content=content)


def test_a_wrong_queued_output_is_still_named_when_the_queue_is_intact() -> None:
    fresh = _deferred()
    first = fresh.before()
    stale = fresh.call()
    queued = (fresh.after(stale, force=True, content=first),)
    queued += _queue_calls(fresh, 1, out=stale)  # the first call's output again
    with pytest.raises(DishonestTiming, match="timed call 2 returned a wrong output"):
        fresh.drain(queued)


def _attack(fresh: FreshInputs, how: str, queued: tuple[Any, ...]) -> None:
    """What a kernel that found the `FreshInputs` through gc can do to its queue."""
    pending = fresh._pending
    if how == "cleared":
        pending.clear()
    elif how == "popped":
        pending.pop()
    elif how == "drained_by_the_kernel":
        fresh.drain()  # compared without the timer's keys: the entries are gone
    elif how == "appended":
        pending.append(pending[0])
    elif how == "junk_appended":
        pending.append("not an entry")
    elif how == "replaced_by_an_earlier_entry":
        pending[1] = pending[0]
    elif how == "key_recreated_with_equal_values":
        (number, offset, held), snapshot = pending[0]
        pending[0] = ((number, offset, held), snapshot)
    elif how == "key_pointed_at_another_offset":
        (number, offset, held), snapshot = pending[1]
        pending[1] = ((number, pending[0][0][1], held), snapshot)
    elif how == "reordered":
        pending.reverse()
    elif how == "cleared_and_refilled_with_the_same_count":
        honest = pending[0]
        pending.clear()
        pending.extend([honest] * len(queued))
    else:
        raise AssertionError(how)


@pytest.mark.parametrize(
    ("how", "what"),
    [
        ("cleared", "emptied or shortened"),
        ("popped", "emptied or shortened"),
        ("drained_by_the_kernel", "emptied or shortened"),
        ("appended", "added to"),
        ("junk_appended", "added to"),
        ("replaced_by_an_earlier_entry", "edited"),
        ("key_recreated_with_equal_values", "edited"),
        ("key_pointed_at_another_offset", "edited"),
        ("reordered", "edited"),
        ("cleared_and_refilled_with_the_same_count", "edited"),
    ],
)
def test_a_queue_emptied_or_edited_through_gc_is_refused_by_name(how: str, what: str) -> None:
    """Honest outputs, so only the tampering can be what is refused."""
    fresh = _deferred()
    queued = _queue_calls(fresh, 4)
    _attack(fresh, how, queued)
    with pytest.raises(DishonestTiming, match=f"queue of deferred output checks was {what}"):
        fresh.drain(queued)


def test_the_checks_counter_a_kernel_can_edit_is_not_what_is_compared() -> None:
    """The record's count of checks is object state; the timer compares its own keys."""
    fresh = _deferred()
    queued = _queue_calls(fresh, 3)
    fresh._pending.clear()
    fresh.checked = 0
    fresh._calls = 0
    with pytest.raises(DishonestTiming, match="emptied or shortened \\(3 checks queued, 0 left\\)"):
        fresh.drain(queued)


def test_the_mixs_queued_check_holds_no_content_to_rewrite_in_place() -> None:
    """Its content is rebuilt from the offset when compared: a kernel that copies a memo's
    inputs into every tensor it finds in the queue (the old entries held the content's
    tensors) changes nothing the comparison reads, and its memo is refused."""
    fresh = _deferred()
    first = fresh.before()
    memo_in = fresh.storage[0].clone()
    memo_out = fresh.call()
    queued = (fresh.after(memo_out, force=True, content=first),)
    queued += _queue_calls(fresh, 3, out=memo_out)
    for (_number, _offset, held), snapshot in fresh._pending:
        assert held is None
        for tensor in (held, snapshot):
            if isinstance(tensor, torch.Tensor) and tensor is not snapshot:
                tensor.copy_(memo_in)  # never reached: nothing but the output is kept
    with pytest.raises(DishonestTiming, match="timed call 2 returned a wrong output"):
        fresh.drain(queued)


def test_the_pools_are_not_renewed_while_checks_are_queued() -> None:
    """A queued mix check is rebuilt from its offset in the pools: a renewal between the
    call and the comparison would blame an honest kernel; it waits for the queue to empty."""
    fresh = _deferred()
    queued = _queue_calls(fresh, 2)
    fresh._used.update(range(WINDOW // 2))  # half of the offsets spent
    pools = [pool.clone() for pool in fresh.weights]
    queued = (*queued, *_queue_calls(fresh, 2))
    assert all(torch.equal(a, b) for a, b in zip(pools, fresh.weights, strict=True))
    fresh.drain(queued)  # honest: passes on the rebuilt content
    fresh.before()  # nothing queued now: the pools are renewed
    assert not any(torch.equal(a, b) for a, b in zip(pools, fresh.weights, strict=True))
    assert len(fresh._used) == 1


def test_queue_tampering_accepts_only_the_same_objects_in_order() -> None:
    a, b = tuple([1, 0, None]), tuple([2, 5, None])  # made at run time, as `after` does
    assert queue_tampering((a, b), [a, b]) is None
    assert queue_tampering((), []) is None
    assert "edited" in (queue_tampering((a, b), [b, a]) or "")
    assert "edited" in (queue_tampering((a,), [tuple([1, 0, None])]) or "")  # equal, not it
    assert "emptied" in (queue_tampering((a, b), [a]) or "")
    assert "added" in (queue_tampering((a,), [a, b]) or "")


def _rewrites_the_draw_in_place(found: dict[str, Any]) -> Any:
    """A memo for the maker mode: from its 2nd call on, it copies its 1st call's inputs into
    the timer's current draw (`_draw`, found on the object) and returns its 1st output, so
    a check that reads the kept draw compares the memo with the reference on the memo's
    inputs."""

    def kernel(x: torch.Tensor) -> torch.Tensor:
        state = found["state"]
        if "memo" not in found:
            found["memo"] = (x.clone(), _tanh2(x))
            return found["memo"][1]
        # Where the timer still holds the draw (a repeating maker's goes once copied in).
        for leaf in state._draw if isinstance(state._draw, (list, tuple)) else ():
            leaf.copy_(found["memo"][0])
        return found["memo"][1]

    return kernel


@pytest.mark.parametrize("defer", [False, True])
def test_a_maker_draw_rewritten_in_place_during_the_call_is_not_what_is_checked(
    defer: bool,
) -> None:
    """The maker makes the same draw for the same seed (tried when the mode is chosen), so a
    check makes its call's draw again from the seed (the token's first half): the values
    the kernel wrote into the kept draw are not what the reference runs on."""
    found: dict[str, Any] = {}
    fresh = fresh_inputs(
        torch, _rewrites_the_draw_in_place(found), list(_draw(1)), device="cpu",
        make_draw=_draw, reference=_tanh2, check=_check, free_bytes=1,
    )  # fmt: skip
    assert fresh.mode == "maker"
    assert fresh.maker_repeats
    found["state"] = fresh
    fresh.defer = defer
    content = fresh.before()
    first = fresh.after(fresh.call(), force=True, content=content)  # the memo's own: honest
    content = fresh.before()
    out = fresh.call()

    def checked() -> None:
        key = fresh.after(out, force=True, content=content)
        fresh.drain((first, key) if defer else None)

    with pytest.raises(DishonestTiming, match="timed call 2 returned a wrong output"):
        checked()


def test_a_maker_that_draws_differently_for_one_seed_keeps_its_draw_and_passes() -> None:
    """A maker that ignores its seed cannot be asked for a call's draw again: the kept draw
    is what the check reads (no false accusation; the in-place rewrite above is then not
    seen, said in docs/honest-measurement.md)."""
    fresh = fresh_inputs(
        torch, _tanh2, [torch.randn(32, 32)], device="cpu",
        make_draw=lambda seed: (torch.randn(32, 32),), reference=_tanh2, check=_check,
        free_bytes=1,
    )  # fmt: skip
    assert fresh.mode == "maker"
    assert not fresh.maker_repeats
    fresh.defer = True
    fresh.drain(_queue_calls(fresh, 6))
