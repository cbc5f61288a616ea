"""Attacks on the CPU anchors from inside the process, through the real CPU timer
(`measure/timing/cpu.py`, `on_cpu.py`): a kernel that slows the anchors that follow each of
its calls hides its own slowdown behind them. The attack kernels:
`cpu_anchor_attack_kernels.py` beside this file (what each did before and after the guards:
bench/results/2026-12-06-cpu-anchor-threads-cpu.md)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import cpu_anchor_attack_kernels as attacks  # noqa: E402

from pytest_kernelpro.measure.timing import TimingBudget, on_cpu  # noqa: E402
from pytest_kernelpro.measure.timing.budget import CPU_MIN_SAMPLES_FLOOR  # noqa: E402
from pytest_kernelpro.measure.timing.cpu import CacheFlush, CpuSampler, time_cpu  # noqa: E402
from pytest_kernelpro.measure.timing.fresh_inputs import DishonestTiming  # noqa: E402
from pytest_kernelpro.measure.timing.on_cpu import OtherThreads  # noqa: E402

BUDGET = TimingBudget(max_time_s=1.0, min_samples=40, clock_anchor="on")
BESIDE = "while the CPU anchors ran after the timed calls"


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


def test_another_threads_cpu_beside_the_anchors_is_counted_in_the_real_sample_loop() -> None:
    """The reading itself, with the overlap made certain: each anchor call waits until a
    spinning thread of the process has used 0.5 ms more CPU (its own clock, read the way
    the kernel updates it), so at least 1.5 ms a sample ran beside the anchors whatever the
    machine's load, and the sample loop's reads count it."""
    import threading

    spinner_done = threading.Event()
    spinner = threading.Thread(target=lambda: _spin_until(spinner_done), daemon=True)
    spinner.start()
    clock = time.pthread_getcpuclockid(spinner.ident)

    def beside() -> None:
        end = time.clock_gettime(clock) + 5e-4
        while time.clock_gettime(clock) < end:
            pass

    pairs = on_cpu.CpuPairs(anchor=beside, name="cpu anchor: test", memory=beside)
    pairs.recording = True
    sampler = CpuSampler(attacks.kernel, time.perf_counter, CacheFlush(0), None, pairs)
    try:
        sampler.take(4)
    finally:
        spinner_done.set()
        spinner.join()
    assert sampler.between.anchors_other_s >= 4 * 3 * 5e-4
    assert BESIDE in (sampler.between.failure(1) or "")


def _spin_until(done: Any) -> None:
    big = torch.ones(1 << 20)
    while not done.is_set():
        big.sum()  # without the GIL: the timer's thread runs beside it


def test_an_anchor_is_charged_its_cpu_time_not_the_time_it_was_blocked() -> None:
    """A thread holding the GIL (or the host's steal) keeps an anchor's call from running
    without using its CPU: on one torch thread an anchor is charged its thread's CPU time, so
    the block does not slow it. Here each anchor sleeps 2 ms (a call blocked, microseconds of
    CPU); charged its wall time less its run-queue wait, as the kernel is, it read 2 ms."""

    def blocked() -> None:
        time.sleep(2e-3)

    pairs = on_cpu.CpuPairs(anchor=blocked, name="cpu anchor: test", memory=blocked)
    pairs.recording = True
    sampler = CpuSampler(attacks.kernel, time.perf_counter, CacheFlush(0), None, pairs)
    sampler.take(4)
    charged = [*pairs.anchor_s, *pairs.memory_s]
    assert len(charged) == 8
    assert max(charged) < 1e-3, charged  # a sleep's CPU time, never its 2 ms
    assert sampler.between.failure(1) is None  # blocked is not another thread's CPU


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
