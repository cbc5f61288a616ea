"""Attack kernels on the CPU anchors from inside the process (tests/measure/timing/
test_cpu_anchor_attacks.py; the measurements of what each did before and after the guards:
bench/results/2026-12-06-cpu-anchor-threads-cpu.md).

A kernel slowed by a factor hides behind the anchors if it slows them by the same factor:
the gate reads its change against them (docs/cpu-gate.md). Each attack is an honest kernel
(a sum of 4 MiB) plus one way of slowing the anchors that follow every sampled call
(`AnchorWindowThread`: a thread woken as each call returns, which finds the timer's `CpuPairs`
in its caller's frame and works until the sample's memory anchor is recorded). The threads
that streamed memory, multiplied matrices or held the GIL beside the anchors were measured
by a one-off script (its results file names it):

- `patched_torch`: `torch.mm` and `torch.sum` replaced by wrappers that run the original
  three times (what the anchors called, through the names);
- `bigger_buffer`: the memory anchor's cached buffer replaced by one 1.45x as long.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from pytest_kernelpro.measure.timing import on_cpu

WINDOW_S = 5e-3  # the longest the attacking thread works after a call returns
KERNEL_INPUT = torch.randn(1 << 20)  # 4 MiB: the kernel's own work is a sum over it


def kernel() -> object:
    return KERNEL_INPUT.sum()  # the method: `patched_torch` slows the anchors, not this


class AnchorWindowThread:
    """A thread woken by the kernel as each sampled call returns (`wrap`: the call waits
    until the thread runs, so it is on a core when the anchors start), working with `work`
    (torch calls release the GIL, so it runs beside the timer's anchors) until the timer
    records that sample's memory anchor (or `WINDOW_S` passed); `woken` counts the calls it
    woke for, `cpu_s` its CPU seconds."""

    def __init__(self, work: Callable[[], object]) -> None:
        self.work = work
        self.go, self.started = threading.Event(), threading.Event()
        self.done = False
        self.woken = 0
        self.cpu_s = 0.0
        self.seen = 0  # the memory anchor times recorded when the call returned
        self.recorded: list[float] = []
        self.before_each: Callable[[], object] = lambda: None  # run at each wake
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done:
            if not self.go.wait(0.05):
                continue
            self.go.clear()
            self.woken += 1
            self.before_each()
            self.started.set()
            recorded, seen, end = self.recorded, self.seen, time.perf_counter() + WINDOW_S
            cpu0 = time.thread_time()
            while len(recorded) == self.seen == seen and time.perf_counter() < end:
                self.work()
            self.cpu_s += time.thread_time() - cpu0

    def wrap(self, fn: Callable[[], object]) -> Callable[[], object]:
        def timed() -> object:
            out = fn()
            pairs = timer_pairs()
            if pairs is not None:  # the sampling rounds: the anchors follow
                self.recorded, self.seen = pairs.memory_s, len(pairs.memory_s)
                self.started.clear()
                self.go.set()
                self.started.wait(0.05)
            return out

        return timed

    @contextmanager
    def running(self) -> Iterator[AnchorWindowThread]:
        self.thread.start()
        try:
            yield self
        finally:
            self.done = True
            self.thread.join()


def timer_pairs() -> on_cpu.CpuPairs | None:
    """The running timer's pairs, found as a kernel can: the sample loop's frame that called
    it (`CpuSampler.take`, its local `pairs`; None while the pairs do not record)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name != "take":
        frame = frame.f_back
    return None if frame is None else frame.f_locals.get("pairs")


@contextmanager
def patched_torch(calls: list[int]) -> Iterator[None]:
    """`torch.mm` and `torch.sum` replaced by wrappers running the original three times."""
    mm, total = torch.mm, torch.sum

    def slow(original: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(1)
            original(*args, **kwargs)
            original(*args, **kwargs)
            return original(*args, **kwargs)

        return wrapper

    torch.mm, torch.sum = slow(mm), slow(total)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.mm, torch.sum = mm, total  # type: ignore[assignment]


@contextmanager
def bigger_buffer() -> Iterator[None]:
    """The memory anchor's cached buffer (a module attribute) swapped for a 1.45x longer one."""
    kept = list(on_cpu._MEMORY_BUFFER)
    on_cpu._MEMORY_BUFFER[:] = [torch.ones(int(1.45 * on_cpu.MEMORY_ANCHOR_BYTES / 4))]
    try:
        yield
    finally:
        on_cpu._MEMORY_BUFFER[:] = kept
