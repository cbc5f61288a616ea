"""Attacks on the CPU anchors from inside the process, through the real CPU timer
(`measure/timing/cpu.py`, `on_cpu.py`): a kernel that slows the anchors that follow each of
its calls hides its own slowdown behind them. The attack kernels:
`cpu_anchor_attack_kernels.py` beside this file (what each did before and after the guards:
bench/results/2026-12-06-cpu-anchor-threads-cpu.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import cpu_anchor_attack_kernels as attacks  # noqa: E402

from pytest_kernelpro.measure.timing import TimingBudget, on_cpu  # noqa: E402
from pytest_kernelpro.measure.timing.budget import CPU_MIN_SAMPLES_FLOOR  # noqa: E402
from pytest_kernelpro.measure.timing.cpu import time_cpu  # noqa: E402
from pytest_kernelpro.measure.timing.fresh_inputs import DishonestTiming  # noqa: E402
from pytest_kernelpro.measure.timing.on_cpu import OtherThreads  # noqa: E402

# Pairs enough that the attacking thread's CPU beside the anchors clears the 1 ms floor on a
# loaded machine (2.2-14 ms at a load of 13 on two cores, from 16-21 pairs).
BUDGET = TimingBudget(max_time_s=1.0, min_samples=40, clock_anchor="on")
BESIDE = "held the GIL, while the CPU anchors ran after the timed calls"


@pytest.fixture(autouse=True)
def one_thread_and_fresh_anchors() -> Iterator[None]:
    """The default policy (one torch thread: the rule gates it); the anchors' cached buffers
    made again after each test (an attack here tampers with them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        on_cpu._ANCHOR_BUFFERS.clear()
        on_cpu._MEMORY_BUFFER.clear()


ATTACKERS = {
    "memory_streamer": attacks.memory_streamer,
    "compute_burner": attacks.compute_burner,
    "gil_holder": attacks.gil_holder,
    "lean_gil_holder": lambda: attacks.gil_holder(lean=True),
}


@pytest.mark.parametrize("attacker", sorted(ATTACKERS))
def test_a_thread_working_beside_the_anchors_is_refused(attacker: str) -> None:
    """The thread wakes as each call returns and works (streams 64 MiB, multiplies
    matrices, or holds the GIL without CPU) until the timer records the sample's memory
    anchor: little of it falls in the gaps the older rule counted (the holder's GIL, none),
    so only the anchors' window sees it."""
    thread = ATTACKERS[attacker]()
    with (
        attacks.switch_interval(5e-4),
        thread.running(),
        pytest.raises(DishonestTiming, match=BESIDE) as caught,
    ):
        time_cpu(thread.wrap(attacks.kernel), BUDGET)
    assert thread.woken >= CPU_MIN_SAMPLES_FLOOR  # it ran after the sampled calls
    counted_ms = float(str(caught.value).split("used ")[1].split(" ms")[0])
    assert counted_ms > on_cpu.OTHER_THREADS_MIN_S * 1e3


def test_an_honest_kernel_beside_an_idle_thread_is_timed() -> None:
    """The control: the same kernel, the thread woken the same way but doing nothing."""
    thread = attacks.AnchorWindowThread(lambda: None)
    thread_window = attacks.WINDOW_S
    attacks.WINDOW_S = 0.0  # wakes, counts, works not at all
    try:
        with thread.running():
            result = time_cpu(thread.wrap(attacks.kernel), BUDGET)
    finally:
        attacks.WINDOW_S = thread_window
    assert result.anchor is not None
    assert thread.woken >= min(CPU_MIN_SAMPLES_FLOOR, len(result.samples_s))


def test_the_kernels_own_time_buys_no_allowance_beside_the_anchors() -> None:
    """Between the calls a share of the kernel's time is allowed (its refill may wake torch's
    machinery); beside the anchors only the background rate and the floor."""
    slow_kernel = OtherThreads(kernel_s=1.0, anchors_other_s=0.03, anchors_s=0.1)
    assert BESIDE in (slow_kernel.failure(1) or "")
    background = OtherThreads(kernel_s=1.0, anchors_other_s=0.0009, anchors_s=0.05)
    assert background.failure(1) is None  # under the 1 ms floor
    long_run = OtherThreads(kernel_s=1.0, anchors_other_s=0.004, anchors_s=0.5)
    assert long_run.failure(1) is None  # under 1% of half a second of anchors
    assert slow_kernel.failure(2) is None  # torch's own workers run beside them then
    assert slow_kernel.to_dict()["other_threads_beside_anchors_s"] == 0.03
    slow_kernel.reset()
    assert slow_kernel.failure(1) is None


def test_a_kernel_that_rebinds_what_the_anchors_call_does_not_reach_them() -> None:
    """`torch.mm` and `torch.sum` replaced by wrappers that run the original three times: the
    anchors call torch's own functions from its read-only table, never the names."""
    calls: list[int] = []
    with attacks.patched_torch(calls):
        result = time_cpu(attacks.kernel, BUDGET)
    assert result.anchor is not None
    assert calls == []  # the kernel calls neither name; the anchors did not either


@pytest.mark.parametrize("how", ["bigger_buffer", "strided_gemm_input", "resized_memory"])
def test_a_kernel_that_changes_the_anchors_buffers_is_refused(how: str) -> None:
    """Through the module's cache: a 1.45x longer memory buffer put in before the timing, or,
    from the kernel's first call on, a GEMM input re-pointed at a strided view (`set_`) or the
    memory buffer resized in place."""
    kernel: Any = attacks.kernel
    if how == "strided_gemm_input":

        def kernel() -> object:
            a = on_cpu._ANCHOR_BUFFERS[1][0]
            if a.is_contiguous():
                a.set_(torch.zeros(a.shape[0], 2 * a.shape[1])[:, : a.shape[1]])
            return attacks.kernel()

    elif how == "resized_memory":

        def kernel() -> object:
            buffer = on_cpu._MEMORY_BUFFER[0]
            if buffer.numel() == on_cpu.MEMORY_ANCHOR_BYTES // 4:
                buffer.resize_(int(1.45 * buffer.numel())).fill_(1.0)
            return attacks.kernel()

    if how == "bigger_buffer":
        with attacks.bigger_buffer(), pytest.raises(DishonestTiming, match="anchors' buffers"):
            time_cpu(kernel, BUDGET)
    else:
        with pytest.raises(DishonestTiming, match="anchors' buffers"):
            time_cpu(kernel, BUDGET)
