"""New content on every timed call, checks decided after the call returned (unit level:
measure/timing/fresh_inputs.py). The attacks through `pytest` are in
tests/plugin/test_honest_attacks.py."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

from pytest_kernelpro.measure import bound
from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
from pytest_kernelpro.measure.timing.fresh_inputs import (
    CHECK_RATE,
    DishonestTiming,
    FreshInputs,
    Seal,
    fresh_inputs,
    survival,
    verify_bindings,
)


def _check(got: Any, expected: Any) -> str | None:
    return None if torch.allclose(got, expected, rtol=1e-5, atol=1e-6) else "differs"


def _between_calls(gap: Any, work: Any) -> None:
    """`work` in a gap between two timed calls, counted into `gap` (an `OtherThreads`) with
    the reads `CpuSampler.take` makes around its refill and flush."""
    thread0 = bound.thread_time()
    process0, wall0 = bound.process_time(), bound.perf_counter()
    work()
    process = bound.process_time() - process0
    gap.other_s += max(0.0, process - (bound.thread_time() - thread0))
    gap.gap_s += bound.perf_counter() - wall0


def _draw(seed: int) -> tuple[Any, ...]:
    gen = torch.Generator().manual_seed(seed)
    return (
        torch.randn(16, 16, generator=gen),
        torch.randint(0, 16, (16,), generator=gen),
        torch.rand(16, generator=gen) > 0.5,
    )


def _gather(x: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return x[index] * mask[:, None]


def _fresh(kernel: Any = _gather, **kw: Any) -> FreshInputs:
    kw.setdefault("make_draw", _draw)
    kw.setdefault("reference", _gather)
    kw.setdefault("check", _check)
    return fresh_inputs(torch, kernel, list(_draw(1)), device="cpu", **kw)


def _second_end(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The mix's second end as a tensor: `b is a` is `a` rolled by half its rows (row i
    takes row i + half)."""
    return torch.roll(a, -(a.shape[0] // 2), 0) if b is a else b


def test_every_call_holds_content_no_earlier_call_held() -> None:
    fresh = _fresh()
    assert fresh.mode == "mix"
    a, kept = fresh.ends or ([], [])
    b = [_second_end(x, y) for x, y in zip(a, kept, strict=True)]
    assert [y is x for x, y in zip(a, kept, strict=True)] == [True, True, True]
    assert not any(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    seen = set()
    for _ in range(300):
        fresh.before()
        x, index, mask = fresh.storage
        key = x.numpy().tobytes()
        assert key not in seen
        seen.add(key)
        # Every element stays within what its two draws span: indices in range, masks boolean.
        assert bool(((x >= torch.minimum(a[0], b[0])) & (x <= torch.maximum(a[0], b[0]))).all())
        assert bool(((index == a[1]) | (index == b[1])).all())
        assert mask.dtype == torch.bool
    assert fresh.to_dict()["refill_per_call_s"] > 0


def test_a_checked_call_is_compared_with_the_reference_on_its_own_content() -> None:
    fresh = _fresh()
    for _ in range(20):
        fresh.before()
        fresh.after(fresh.call(), force=True)
    assert fresh.checked == 20
    stale = fresh.call()
    fresh.before()
    with pytest.raises(DishonestTiming, match="timed call 21 returned a wrong output"):
        fresh.after(stale, force=True)


def test_the_first_timed_call_does_not_see_the_trial_calls_content() -> None:
    """The validity trial calls the kernel once, untimed, on a mixed input; the timers refill
    before their first call, so a memo of the trial's content never hits."""
    seen: list[bytes] = []

    def remembers(x: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seen.append(x.numpy().tobytes())
        return _gather(x, index, mask)

    fresh = _fresh(remembers)
    time_kernel(lambda: None, device="cpu", budget=TimingBudget(max_time_s=0.02), fresh=fresh)
    assert len(seen) == len(set(seen)) > 5


def test_an_input_a_mix_makes_invalid_falls_back_to_the_input_maker() -> None:
    """Cholesky needs a positive-definite input: a per-element mix of two is not one, so the
    kernel raises in the untimed trial and every call gets a new draw of the maker instead."""

    def spd(seed: int) -> tuple[torch.Tensor]:
        a = torch.randn(8, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return (a @ a.T + 8 * torch.eye(8, dtype=torch.float64),)

    def strict_cholesky(x: torch.Tensor) -> torch.Tensor:
        if not torch.equal(x, x.T):
            raise ValueError("not symmetric")
        return torch.linalg.cholesky(x)

    fresh = fresh_inputs(
        torch, strict_cholesky, list(spd(1)), device="cpu", make_draw=spd,
        reference=torch.linalg.cholesky, check=_check,
    )  # fmt: skip
    assert fresh.mode == "maker"
    assert "a mixed input is not valid (ValueError" in fresh.note
    seen = set()
    for _ in range(5):
        fresh.before()
        seen.add(fresh.storage[0].numpy().tobytes())
        fresh.after(fresh.call(), force=True)
    assert len(seen) == 5


def test_inputs_that_cannot_be_regenerated_are_named_and_jittered() -> None:
    fresh = _fresh(make_draw=None, name="my_kernel")
    assert fresh.to_dict()["inputs_fixed"].startswith("my_kernel: its inputs cannot be regenerated")
    assert fresh.mode == "mix"
    assert "a jitter of them" in fresh.note
    fresh.before()
    first = fresh.storage[0].clone()
    fresh.before()
    assert not torch.equal(first, fresh.storage[0])


def test_a_maker_returning_the_same_tensors_with_an_invalid_jitter_is_checked_every_call() -> None:
    fixed = list(_draw(1))

    def symmetric_only(x: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not torch.equal(x, fixed[0]):
            raise ValueError("only the one input")
        return _gather(x, index, mask)

    fresh = _fresh(symmetric_only, make_draw=lambda seed: fixed, name="k")
    assert "same contents for another seed" in fresh.inputs_fixed
    assert fresh.mode == "fixed"
    assert fresh.rate == 1.0
    assert "a memo keyed by the contents cannot be excluded" in fresh.note


def test_the_timed_calls_checked_share_is_the_rate_whatever_os_urandom_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`FreshInputs.after` draws the check decision inline (it runs after every timed call)
    with the kept `os.urandom`: over many calls the checked share is `CHECK_RATE`, and a
    replaced `os.urandom` that would say "never" changes nothing."""
    fresh = _fresh()
    monkeypatch.setattr(os, "urandom", lambda n: b"\xff" * n)
    for _ in range(1500):
        content = fresh.before()
        fresh.after(fresh.call(), content=content)
    monkeypatch.undo()
    assert 0.54 < fresh.checked / fresh.to_dict()["calls"] < 0.66  # 4.7 sigma either side


def test_the_docs_survival_probabilities() -> None:
    # The default timing: the first call and 20 samples, half of them skipped.
    assert survival(CHECK_RATE, 0.5, 21) < 1e-3
    assert survival(CHECK_RATE, 0.5, 20) == pytest.approx(0.7**20)
    assert survival(CHECK_RATE, 0.1, 100) == pytest.approx(0.94**100)


@pytest.mark.parametrize("n", [1, 3, 10, 100, 1000])
def test_a_kernel_that_turns_lazy_after_its_nth_call_is_caught_within_a_few_calls(n: int) -> None:
    """The timer's per-call protocol (new content, call, decision) for 1,200 calls: honest for
    N calls, then skipping its work on every call. Each call after N is checked with p = 0.6,
    so it survives k of them with p = 0.4^k (here 40 calls: 1e-16)."""
    made = [0]

    def lazy_after_n(x: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        made[0] += 1
        if made[0] > n + 1:  # + the mix's validity trial
            return torch.zeros(16, 16)
        return _gather(x, index, mask)

    fresh = _fresh(lazy_after_n)

    def timed_calls() -> None:
        for _ in range(1200):
            fresh.before()
            fresh.after(fresh.call(), force=fresh._calls == 0)

    with pytest.raises(DishonestTiming, match="returned a wrong output") as caught:
        timed_calls()
    number = int(str(caught.value).split("timed call ")[1].split()[0])
    assert n < number <= n + 40


def test_a_kernel_lowering_the_check_rate_or_swapping_the_timers_tensors_is_refused() -> None:
    for attack in ("rate", "weights", "reference"):
        fresh = _fresh()

        def cheat(x: Any, index: Any, mask: Any, attack: str = attack, fresh: Any = fresh) -> Any:
            if attack == "rate":
                fresh.__dict__["rate"] = 0.0  # shadows the property's constant
            elif attack == "weights":
                fresh.weights = [w.clone() for w in fresh.weights]
            else:
                fresh.reference = cheat
            return _gather(x, index, mask)

        fresh.kernel = cheat
        seal = Seal.of(fresh)
        fresh.before()
        fresh.call()
        with pytest.raises(DishonestTiming, match="the timer's own state"):
            verify_bindings(fresh, seal)


def _urandom_as_float(size: int) -> float:
    return 0.0


def test_a_kept_function_rebound_so_the_timer_raises_is_refused_as_the_rebinding() -> None:
    """A kernel that rebinds the kept `os.urandom` to return a float in its 3rd call: the
    check decision raises TypeError before the sample's verification; the timing is refused
    naming the patch, not failed as the kernel's error (seen through the optimizer: "the
    kernel raised TypeError during timing")."""
    made = [0]

    def rebinds(x: torch.Tensor, index: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        made[0] += 1
        if made[0] == 3:
            bound.os_urandom = _urandom_as_float
        return _gather(x, index, mask)

    fresh = _fresh(rebinds)
    budget = TimingBudget(warmup_ms=0.0, max_time_s=0.05, min_samples=5, max_samples=50)
    known = dict(bound.patchers)
    try:
        with pytest.raises(DishonestTiming, match="os_urandom .now .*_urandom_as_float"):
            time_kernel(None, device="cpu", budget=budget, fresh=fresh)  # type: ignore[arg-type]
    finally:
        bound.restore()
        # This module is remembered as a patcher: its other kernels would be refused.
        bound.patchers.clear()
        bound.patchers.update(known)
    assert bound.binding_failure("after the test") is None


def test_cpu_time_of_other_threads_between_the_timed_calls_is_named() -> None:
    """`on_cpu.OtherThreads`: a thread busy while the timer refills and flushes (one torch
    thread) refuses the timing; the same gap without it does not."""
    import threading
    import time

    from pytest_kernelpro.measure.timing.on_cpu import OtherThreads

    def busy(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def quiet_gap() -> OtherThreads:
        gap = OtherThreads(kernel_s=0.001)
        _between_calls(gap, lambda: time.sleep(0.01))
        return gap

    # A thread another test of this process left running may use a window; not all five.
    quiet = next((g for g in (quiet_gap() for _ in range(5)) if g.failure(1) is None), None)

    def another_thread_works() -> None:
        worker = threading.Thread(target=busy, args=(0.02,))
        worker.start()
        worker.join()

    loud = OtherThreads(kernel_s=0.001)
    _between_calls(loud, another_thread_works)
    assert quiet is not None
    assert "other threads of the process used" in (loud.failure(1) or "")
    assert loud.failure(2) is None  # torch's own workers may run then


def test_background_threads_of_the_process_are_not_a_kernels_work_moved_out() -> None:
    """The honest case CI met: a tiny kernel (4.1 ms of timed calls in all), 644 ms of gaps
    (refills and flushes), 2.9 ms of other threads' CPU in them (pytest-xdist's channel
    reader at 0.45% of the gaps) was refused. A background rate of the gaps is allowed; the
    attack, a thread busy for a share of each gap that a moved-out kernel needs, is not."""
    from pytest_kernelpro.measure.timing.on_cpu import OtherThreads

    background = OtherThreads(other_s=2.9e-3, gap_s=0.6439, kernel_s=4.1e-3)
    assert background.failure(1) is None
    # The attack: the next output computed in another thread during each gap (a fifth of
    # every gap busy), the timed calls left with almost nothing to do.
    moved_out = OtherThreads(other_s=0.129, gap_s=0.6439, kernel_s=0.4e-3)
    assert "other threads of the process used 129.0 ms" in (moved_out.failure(1) or "")
    # Twice the background rate with a tiny kernel: refused (the rate is a ceiling).
    twice = OtherThreads(other_s=2 * 0.01 * 0.6439, gap_s=0.6439, kernel_s=1e-4)
    assert twice.failure(1) is not None


def test_the_timers_own_clock_reads_are_not_another_threads_time_and_warm_up_is_not_gated() -> None:
    """A microsecond kernel gets thousands of samples: the reads of the process and thread
    clocks around each gap must not charge this thread's own time between them to "other
    threads" (it summed to milliseconds and refused honest kernels), and the warm-up's gaps
    are not gated (`reset` at the sampling rounds)."""
    import threading
    import time

    from pytest_kernelpro.measure.timing.on_cpu import OtherThreads

    gaps = OtherThreads(kernel_s=1e-6)
    for _ in range(20000):
        _between_calls(gaps, lambda: None)
    assert gaps.other_s < 1e-3, gaps.other_s

    def busy(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def another_thread_works() -> None:
        spinner = threading.Thread(target=busy, args=(0.02,))
        spinner.start()
        spinner.join()

    warm_up = OtherThreads(kernel_s=0.001)
    _between_calls(warm_up, another_thread_works)
    assert warm_up.failure(1) is not None
    warm_up.reset()
    assert warm_up.failure(1) is None


def _mul_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # Elementwise and small: no intra-op worker threads left spinning for the next test.
    return torch.tanh(x * w).sum(dim=1)


def _pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(32, 32, generator=gen), torch.randn(32, 32, generator=gen))


def _content_memo(rewrite: str, at_call: int) -> tuple[Any, dict[str, int]]:
    """A memo keyed by a sample of the values that, in its `at_call`-th call, finds the timer's
    `FreshInputs` through gc and rewrites its kept tensors in place (the same objects, so the
    seal's identity check holds): the second end of the mix made equal to the first ("ends":
    a kept second end copied from the first, a rolled first end given its first row in every
    row, so its roll is itself), or the pools of uniform values zeroed ("pools"). Every later call's content is then the
    first end, and every check rebuilds that same content; the call that rewrites returns the
    output the check will rebuild."""
    import gc

    memo: dict[Any, torch.Tensor] = {}
    made = {"calls": 0, "hits": 0}

    def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        made["calls"] += 1
        if made["calls"] == at_call:
            # This kernel's timer: another test's may still be alive (its leaves differ).
            timers = [
                o
                for o in gc.get_objects()
                if type(o) is FreshInputs
                and o.ends
                and [t.shape for t in o.ends[0]] == [x.shape, w.shape]
            ]
            for timer in timers:
                first, second = timer.ends
                if rewrite == "ends":
                    for a, b in zip(first, second, strict=True):
                        if b is a:  # rolled by half its rows: every row the first
                            a[1:] = a[0]
                        else:
                            b.copy_(a)
                else:
                    for pool in timer.weights:
                        pool.zero_()
            return _mul_sum(*first) if timers else _mul_sum(x, w)
        key = (repr(x[0, :4].tolist()), repr(w[0, :4].tolist()))
        if key in memo:
            made["hits"] += 1
            return memo[key].clone()
        memo[key] = out = _mul_sum(x, w)
        return out

    return kernel, made


@pytest.mark.parametrize("rewrite", ["ends", "pools"])
@pytest.mark.parametrize("at_call", [1, 4])
def test_a_kernel_rewriting_the_mixs_kept_tensors_in_place_is_refused(
    rewrite: str, at_call: int
) -> None:
    """At its 1st call (the mix's validity trial, before the timing starts) or its 4th (a
    timed call); the memo hit and passed every check before the kept tensors were
    fingerprinted."""
    kernel, made = _content_memo(rewrite, at_call)

    def timed() -> None:
        fresh = fresh_inputs(
            torch, kernel, list(_pair(1)), device="cpu", make_draw=_pair, reference=_mul_sum,
            check=_check,
        )  # fmt: skip
        budget = TimingBudget(warmup_ms=0.0, max_time_s=0.05, min_samples=20, max_samples=50)
        time_kernel(None, device="cpu", budget=budget, fresh=fresh)  # type: ignore[arg-type]

    with pytest.raises(DishonestTiming, match="rewrote the timer's kept content"):
        timed()
    assert made["calls"] >= at_call  # the rewrite ran


@pytest.mark.parametrize(
    "attack",
    [
        "plan",  # the refill's plan swapped for one that writes nothing
        "targets",  # the leaves refilled in place swapped (fixed and maker modes)
        "layout",  # the timed tensors' kept layout rewritten to a re-pointed input's
        "storages",  # the timed storages a reference's output is compared with, emptied
        "flat",  # the reference's arguments built another way
        "used",  # the offsets already used forgotten (old content again)
        "weights_in_place",  # one pool replaced inside the kept list
        "ends_in_place",  # one end of the mix replaced inside the kept list
        "namespace",  # the object's namespace replaced by one that shadows a method
        "before",  # the refill shadowed on the object
        "after",  # the output check shadowed on the object
        "content",  # the checked call's content shadowed on the object
        "drain",  # the comparison shadowed on the object
        "deleted",  # a sealed name deleted from the object
    ],
)
def test_every_part_of_the_timers_state_is_sealed(attack: str) -> None:
    """What the timers' per-sample check compares in C (`bound.intact` with the seal's kept
    groups): each rewrite a kernel could make to the `FreshInputs` it finds (call stack, gc)
    is seen, and named by `changed`."""
    fresh = _fresh()
    seal = Seal.of(fresh)
    # What a timer does first: look at torch's timing functions once, which keeps the links
    # `intact` then compares (alone, this test would otherwise start with none kept).
    assert bound.binding_failure("after the test") is None
    assert bound.intact(*seal.kept)
    verify_bindings(fresh, seal)  # intact: nothing raised
    assert fresh.ends is not None
    if attack == "plan":
        fresh._plan = ()
    elif attack == "targets":
        fresh._targets = ()
    elif attack == "layout":
        fresh._layout = ()
    elif attack == "storages":
        fresh._storages = frozenset()
    elif attack == "flat":
        fresh._flat = not fresh._flat
    elif attack == "used":
        fresh._used = set()
    elif attack == "weights_in_place":
        with pytest.raises(TypeError):  # sealed as a tuple: nothing to replace in place
            fresh.weights[0] = fresh.weights[0].clone()  # type: ignore[index]
        fresh.weights = [fresh.weights[0].clone(), *fresh.weights[1:]]
    elif attack == "ends_in_place":
        with pytest.raises(TypeError):
            fresh.ends[1][0] = fresh.ends[1][0].clone()  # type: ignore[index]
        fresh.ends = (fresh.ends[0], [fresh.ends[1][0].clone(), *fresh.ends[1][1:]])
    elif attack == "namespace":
        fresh.__dict__ = {**vars(fresh), "before": lambda: (0, None)}
    elif attack == "deleted":
        del fresh.mode
    else:
        fresh.__dict__[attack] = lambda *a, **k: None
    assert not bound.intact(*seal.kept)
    assert seal.changed(fresh)
    with pytest.raises(DishonestTiming, match="the timer's own state"):
        verify_bindings(fresh, seal)


def test_a_torch_timing_function_rebound_after_it_was_seen_intact_is_caught() -> None:
    """The torch functions are compared by identity with the ones seen as torch's own (the
    per-sample path); a replacement made after that (here `torch.equal`, which would pass
    every check) fails the fast check and is named by the full one, then put back."""
    assert bound.binding_failure("before") is None
    assert bound.intact()  # the links of every torch timing function are kept now
    original = torch.equal
    try:
        torch.equal = lambda a, b: True  # type: ignore[assignment]
        assert not bound.intact()
        failure = bound.binding_failure("while the kernel was timed") or ""
        assert "torch.equal" in failure
    finally:
        bound.restore()
        bound.patchers.clear()
    assert torch.equal is original
    assert bound.binding_failure("after") is None  # the full path keeps the links again
    assert bound.intact()


@pytest.mark.parametrize("how", ["module_attribute", "code", "defaults", "deleted", "method"])
def test_a_kept_name_of_the_timing_modules_changed_any_way_fails_the_fast_check(how: str) -> None:
    """`bound.intact` (run before and after every sample) sees a rebound module attribute, a
    function's code or defaults replaced, a kept name deleted, and a class's method swapped."""
    from pytest_kernelpro.measure.timing import fresh_inputs as module

    assert bound.intact()
    try:
        if how == "module_attribute":
            module.CHECK_RATE = 0.0  # type: ignore[misc]
        elif how == "code":
            module.survival.__code__ = (lambda rate, share, calls: 0.0).__code__
        elif how == "defaults":
            module.fresh_inputs.__kwdefaults__ = {"free_bytes": 0, "name": None}
        elif how == "deleted":
            del module.survival
        else:
            module.FreshInputs.after = lambda self, out, force=False: None  # type: ignore[method-assign]
        assert not bound.intact()
        assert bound.binding_failure("while the kernel was timed") is not None
    finally:
        bound.restore()
        bound.patchers.clear()
    assert bound.binding_failure("after") is None
    assert bound.intact()
    assert module.CHECK_RATE == CHECK_RATE
    assert survival(1.0, 0.5, 2) == 0.25


def test_a_module_replaced_in_sys_modules_after_torch_was_seen_is_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fast check keeps the torch module found in `sys.modules`: a different object there
    sends the next check down the full path, which reads the functions of the new one."""
    import sys
    import types

    assert bound.intact()
    fake = types.ModuleType("torch")
    fake.equal = lambda a, b: True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert not bound.intact()
    failure = bound.binding_failure("while the kernel was timed") or ""
    assert "torch.equal" in failure
    monkeypatch.undo()
    bound.patchers.clear()
    assert bound.binding_failure("after") is None
    assert bound.intact()


@pytest.mark.parametrize("attack", ["torch", "defer", "_pending"])
def test_the_timers_module_its_deferral_and_its_queue_are_sealed(attack: str) -> None:
    """A kernel that swaps the timer's torch (a fake whose `equal` passes everything), turns
    on the GPU's deferral on the CPU (checks queued, then dropped with the queue) or swaps the
    queue is refused at the sample it did it in."""
    fresh = _fresh()
    seal = Seal.of(fresh)
    if attack == "torch":
        fresh.torch = type("FakeTorch", (), {"equal": staticmethod(lambda a, b: True)})
    elif attack == "defer":
        fresh.defer = True
    else:
        fresh._pending = []
    with pytest.raises(DishonestTiming, match="the timer's own state"):
        verify_bindings(fresh, seal)


@pytest.mark.parametrize("mode", ["mix", "maker"])
def test_a_kernel_that_points_the_check_at_an_earlier_calls_content_is_refused(mode: str) -> None:
    """The memo attack through the timer's object: the kernel returns the output it stored for
    an earlier call and rewrites which content the timer believes it was given (the mix's
    offset, the maker's draw), so that a check would compare the memo with the reference on
    the old content. The timer hands `after` what `before` returned, and refuses the call."""
    fresh = _fresh()
    if mode == "maker":
        fresh.mode, fresh.ends, fresh.weights, fresh._plan = "maker", None, [], None
        fresh.make_draw = _draw
    first = fresh.before()
    fresh.after(fresh.call(), force=True, content=first)
    stale = (fresh._offset, fresh._draw)
    second = fresh.before()
    out = fresh.call()
    fresh._offset, fresh._draw = stale  # what a kernel finding the object could write
    with pytest.raises(DishonestTiming, match="which content the call was given"):
        fresh.after(out, force=True, content=second)


@pytest.mark.parametrize(
    "attack",
    [
        "shadow_after",
        "shadow_before",
        "shadow_before_any_call",
        "class_before",
        "pools_swapped",
        "namespace",
        "clock",
        "check_rate",
    ],
)
def test_a_kernel_that_rewrites_the_timer_mid_round_is_refused_at_that_sample(
    attack: str,
) -> None:
    """The CPU timer binds its helpers once per round (`CpuSampler.take`) and checks the kept
    bindings and the seal between samples: a kernel that finds the timer's objects (gc) and
    rewrites one at its 30th call, inside a sampling round, is refused, and no result of
    that timing comes back (the kernel is handed the object gc would find)."""
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel
    from pytest_kernelpro.measure.timing import cpu as cpu_module
    from pytest_kernelpro.measure.timing import fresh_inputs as fresh_module

    calls = {"n": 0}
    found: list[FreshInputs] = []
    real_before = fresh_module.FreshInputs.before

    def kernel(x: Any, index: Any, mask: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 30:
            timer = found[0]
            if attack == "shadow_after":
                timer.__dict__["after"] = lambda out, **k: None
            elif attack == "shadow_before":
                timer.__dict__["before"] = lambda: (0, None)
            elif attack == "shadow_before_any_call":  # the refill and a check's rebuild alike
                timer.__dict__["before"] = lambda *a, **k: (True, None) if a else (0, None)
            elif attack == "class_before":  # every instance's refill and rebuild
                fresh_module.FreshInputs.before = lambda self, *a, **k: (True, None)  # type: ignore[method-assign]
            elif attack == "pools_swapped":
                timer.weights = [torch.zeros_like(w) for w in timer.weights]
            elif attack == "namespace":
                timer.__dict__ = {**vars(timer), "drain": lambda: None}
            elif attack == "clock":
                cpu_module.bound = type("FakeBound", (), {})  # type: ignore[attr-defined]
            else:
                fresh_module.CHECK_RATE = 0.0  # type: ignore[misc]
        return _gather(x, index, mask)

    fresh = _fresh(kernel)
    found.append(fresh)
    # A budget no load can end before the 30th call: on the CPU `min_samples` gives way to
    # the time budget past its floor of 5, and a cold process under load took 17 samples
    # in 0.2 s, so the attack never ran and nothing was refused.
    budget = TimingBudget(warmup_ms=0.0, max_time_s=30.0, min_samples=60, max_samples=80)
    try:
        with pytest.raises(DishonestTiming):
            time_kernel(None, device="cpu", budget=budget, fresh=fresh)  # type: ignore[arg-type]
    finally:
        fresh_module.FreshInputs.before = real_before  # type: ignore[method-assign]
        bound.restore()
        bound.patchers.clear()
    assert calls["n"] == 30  # refused at the sample it did it in: no later call
    assert fresh_module.CHECK_RATE == CHECK_RATE
    assert cpu_module.bound is bound


def _fake_clock() -> float:
    return 0.0


def _always_equal(a: Any, b: Any) -> bool:
    return True


@pytest.mark.parametrize("name", ["time.perf_counter", "torch.equal"])
def test_a_kernel_that_rebinds_a_kept_function_for_one_call_is_refused_at_that_sample(
    name: str,
) -> None:
    """The CPU timer compares the kept bindings after every sample in its own frame (no call
    to `bound.intact`): a kernel that rebinds a kept function (a clock, a check's comparison)
    at its 30th call and puts it back at its 31st, so that a check made once per round would
    find everything in place, is refused at the 30th sample."""
    import time

    calls = {"n": 0}
    module, attr = (time, "perf_counter") if name.startswith("time") else (torch, "equal")
    original, fake = getattr(module, attr), _fake_clock if module is time else _always_equal

    def kernel(x: Any, index: Any, mask: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 30:
            setattr(module, attr, fake)
        elif calls["n"] == 31:
            setattr(module, attr, original)
        return _gather(x, index, mask)

    fresh = _fresh(kernel)
    # As in the test above: no load ends the timing before the 30th call.
    budget = TimingBudget(warmup_ms=0.0, max_time_s=30.0, min_samples=60, max_samples=80)
    try:
        with pytest.raises(DishonestTiming, match=name.replace(".", "\\.")):
            time_kernel(None, device="cpu", budget=budget, fresh=fresh)  # type: ignore[arg-type]
    finally:
        setattr(module, attr, original)
        bound.restore()
        bound.patchers.clear()
    assert calls["n"] == 30  # refused at the sample it did it in: no later call
    assert bound.intact()


def _tanh2(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x) * 2


def _square(seed: int) -> tuple[torch.Tensor]:
    return (torch.randn(64, 64, generator=torch.Generator().manual_seed(seed)),)


def _timed_on_a_mix(
    kernel: Any, refused: str, draw: Any = _square, reference: Any = _tanh2, found: Any = None
) -> None:
    """Time `kernel` with fresh inputs mixed from `draw` (handed to `found` first, as a kernel
    finding the timer through gc would have it) and expect the refusal `refused` names."""
    fresh = fresh_inputs(
        torch, kernel, list(draw(1)), device="cpu", make_draw=draw, reference=reference,
        check=_check,
    )  # fmt: skip
    assert fresh.mode == "mix"
    if found is not None:
        found.append(fresh)
    budget = TimingBudget(warmup_ms=0.0, max_time_s=0.3, min_samples=30, max_samples=60)
    with pytest.raises(DishonestTiming, match=refused):
        time_kernel(None, device="cpu", budget=budget, fresh=fresh)  # type: ignore[arg-type]


def _repointing_memo(how: str) -> tuple[Any, dict[str, int]]:
    """A kernel that, from its 3rd call, points its timed input at content of its own (the
    refill then writes tensors the kernel no longer reads) and answers from a memo of it."""
    state: dict[str, Any] = {"calls": 0, "hits": 0, "frozen": None}
    memo: dict[Any, torch.Tensor] = {}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        state["calls"] += 1
        if state["calls"] < 3:
            return _tanh2(x)
        if state["frozen"] is None:
            state["frozen"] = x.detach().clone()
        frozen = state["frozen"]
        if how == "set_storage" and x.data_ptr() != frozen.data_ptr():
            x.set_(frozen.untyped_storage(), 0, x.shape, x.stride())
        elif how == "set_stride0" and x.stride() != (0, 0):
            x.set_(x.untyped_storage(), 0, x.shape, (0, 0))  # every element reads one value
        elif how == "data" and x.data_ptr() != frozen.data_ptr():
            x.data = frozen
        key = (x.data_ptr(), x.stride(), float(x[0, 0]))
        state["hits"] += key in memo
        memo.setdefault(key, _tanh2(x))
        return memo[key].clone()

    return kernel, state


@pytest.mark.parametrize("how", ["set_storage", "set_stride0", "data"])
def test_a_kernel_that_repoints_its_timed_input_at_its_own_content_is_refused(how: str) -> None:
    """`x.set_(...)` or `x.data = ...` inside the kernel: the mix's refill writes the views it
    made of the timed tensors once, so the kernel would read its own frozen content every call
    (and the check's reference the same), a memo hitting on every call. The timed tensors'
    storage, offset, strides, shape and dtype are compared after every call."""
    kernel, state = _repointing_memo(how)
    _timed_on_a_mix(kernel, "re-pointed a timed input")
    assert state["calls"] == 3  # refused at the call that did it
    assert state["hits"] == 0


@pytest.mark.parametrize("where", ["flat", "nested"])
def test_a_kernel_that_swaps_the_timers_inputs_for_its_checks_is_refused(where: str) -> None:
    """The reference of a check reads the timed tensors the timer sealed, not a list a kernel
    can edit in place: a kernel that puts a frozen tensor into the timer's `storage` (flat) or
    into a list argument (nested), and answers from the reference on it, is refused."""
    frozen = _square(7)[0]
    answer = _tanh2(frozen)
    found: list[FreshInputs] = []

    def reference(x: Any, rest: Any = None) -> torch.Tensor:
        return _tanh2(x if where == "flat" else rest[0])

    def kernel(x: Any, rest: Any = None) -> torch.Tensor:
        if not found:  # honest until it has the timer (the mix's validity trial)
            return reference(x, rest)
        try:
            if where == "flat":
                found[0].storage[0] = frozen  # type: ignore[index]
            else:
                rest[0] = frozen
        except TypeError:
            pass  # a sealed tuple: the answer below is then wrong
        return answer.clone()

    def draw(seed: int) -> tuple[Any, ...]:
        x = _square(seed)[0]
        return (x,) if where == "flat" else (x.clone(), [x])

    _timed_on_a_mix(kernel, "returned a wrong output", draw, reference, found)


def test_a_kernel_that_repoints_its_input_only_during_its_call_fails_a_check() -> None:
    """Re-pointed for the call and put back before it returns, the layout after the call is
    the kept one: the call read the kernel's frozen content, and the first checked call
    compares its output with the reference on the content the timer made (rebuilt into the
    timed tensor's own storage)."""
    frozen = _square(7)[0]
    answer = _tanh2(frozen)
    calls = {"n": 0}

    def kernel(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] < 3:
            return _tanh2(x)
        storage, offset, size, stride = x.untyped_storage(), x.storage_offset(), x.shape, x.stride()
        x.set_(frozen.untyped_storage(), 0, frozen.shape, frozen.stride())
        out = answer.clone() if torch.equal(x, frozen) else _tanh2(x)  # the memo's hit
        x.set_(storage, offset, size, stride)
        return out

    _timed_on_a_mix(kernel, "returned a wrong output")
