"""The CPU timer's pairs with the CPU anchor (measure/timing/on_cpu.py): on-CPU time is
wall time less the run-queue wait, never below the thread's CPU time; a kernel that blocks is
still charged for the wait; every sample of the rounds gets its anchor."""

from __future__ import annotations

import sys
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure.timing import TimingBudget  # noqa: E402
from pytest_kernelpro.measure.timing.cpu import CacheFlush, CpuSampler, time_cpu  # noqa: E402
from pytest_kernelpro.measure.timing.on_cpu import (  # noqa: E402
    CPU_LAYOUT,
    CpuPairs,
    RunQueueClock,
    on_cpu_seconds,
    summarize_cpu_pairs,
)


def test_on_cpu_is_wall_less_the_run_queue_wait_never_below_the_cpu_time() -> None:
    assert on_cpu_seconds(10e-3, 8_000_000, 1.5e-3, True) == pytest.approx(2e-3)
    # A wait read just outside the window can exceed what the window held: the CPU time floors it.
    assert on_cpu_seconds(10e-3, 12_000_000, 1.5e-3, True) == pytest.approx(1.5e-3)
    # Without schedstat the thread's CPU time is all there is.
    assert on_cpu_seconds(10e-3, 0, 1.5e-3, False) == pytest.approx(1.5e-3)


class _ScriptedWait:
    """A run-queue clock whose schedstat says the thread waited `per_read_ns` between two
    reads (`raw`, the file's bytes, as the pairs read it)."""

    available = True

    def __init__(self, per_read_ns: int) -> None:
        self.per_read_ns = per_read_ns
        self.reads = 0

    def raw(self) -> bytes:
        self.reads += 1
        return f"123 {self.reads * self.per_read_ns} 7\n".encode()

    def close(self) -> None:
        pass


def test_a_preemption_is_not_charged_to_the_kernel_or_the_anchor() -> None:
    """Each timed call waits 5 ms of wall time on the run queue (scripted) around a 1 ms
    sleep-free body: the pair records the body's time, not the wait."""
    ticks = iter(float(i) * 6e-3 for i in range(1000))  # every clock read: +6 ms of wall
    anchors: list[int] = []
    pairs = CpuPairs(anchor=lambda: anchors.append(1), name="cpu anchor: test")
    pairs.rq = _ScriptedWait(5_000_000)  # type: ignore[assignment]
    pairs.recording = True
    pairs.threads = 2  # on one, the anchor is charged its CPU time (the test below)
    outputs: list[str] = []

    def kernel() -> str:
        outputs.append("out")
        return "out"

    sampler = CpuSampler(kernel, lambda: next(ticks), CacheFlush(0), None, pairs)
    assert sampler.take(1) == [pytest.approx(6e-3)]  # the sample's wall time, per call
    assert (outputs, anchors) == (["out"], [1, 1])  # the kernel once, the anchor twice after
    assert pairs.kernel_s == [pytest.approx(1e-3)]
    assert pairs.anchor_s == [pytest.approx(1e-3)]
    summary = pairs.summary()
    assert summary["run_queue_share"] == pytest.approx(5 / 6)
    assert summary["ratios"] == [pytest.approx(1.0)]
    assert summary["memory_s"] == []  # no memory anchor given: none recorded


def test_the_memory_anchor_runs_after_the_gemm_and_is_charged_its_own_on_cpu_time() -> None:
    ticks = iter(float(i) * 6e-3 for i in range(1000))
    order: list[str] = []
    pairs = CpuPairs(
        anchor=lambda: order.append("gemm"), name="cpu anchor: test",
        memory=lambda: order.append("memory"),
    )  # fmt: skip
    pairs.rq = _ScriptedWait(5_000_000)  # type: ignore[assignment]
    pairs.recording = True
    sampler = CpuSampler(lambda: order.append("kernel"), lambda: next(ticks), CacheFlush(0),
                         None, pairs)  # fmt: skip
    pairs.threads = 2  # torch's workers: the anchors' blocked time is theirs (wall less wait)
    sampler.take(2)
    assert order == ["kernel", "gemm", "gemm", "memory"] * 2
    assert pairs.memory_s == [pytest.approx(1e-3)] * 2  # wall less the scripted wait
    assert pairs.summary()["memory_s"] == [pytest.approx(1e-3)] * 2


def test_on_one_thread_the_anchors_are_charged_their_cpu_time_only() -> None:
    """The scripted clock says each call took 1 ms beyond its run-queue wait, time the thread
    spent blocked: the kernel is charged it (it may sleep or wait on its own thread), an
    anchor on one thread is not (it never blocks: what blocks it is a GIL another thread of
    the process holds, which would slow the anchor the kernel is compared against, or the
    host's steal), and that time is not gated (the host's steal would look the same)."""
    ticks = iter(float(i) * 6e-3 for i in range(1000))
    pairs = CpuPairs(anchor=lambda: None, name="cpu anchor: test", memory=lambda: None)
    pairs.rq = _ScriptedWait(5_000_000)  # type: ignore[assignment]
    pairs.recording = True
    sampler = CpuSampler(lambda: None, lambda: next(ticks), CacheFlush(0), None, pairs)
    sampler.take(2)
    assert pairs.kernel_s == [pytest.approx(1e-3)] * 2
    # Each anchor's thread CPU time: microseconds of a real call, far below the 1 ms.
    assert max(pairs.anchor_s + pairs.memory_s) < 1e-4
    assert sampler.between.failure(1) is None


def test_a_kernel_that_blocks_is_charged_for_the_wait() -> None:
    """The attack: sleep (or wait on another thread) inside the call so the thread's CPU time
    stays low. Blocked time is not run-queue wait, so on-CPU time keeps it. (The median: a
    preemption just outside the timed window, where the wait is read, can take a slice off
    one sample on a loaded machine.)"""
    if not RunQueueClock().available:
        pytest.skip("no /proc schedstat on this system")

    def sleeper() -> None:
        time.sleep(3e-3)

    def waits_on_a_thread() -> None:
        worker = threading.Thread(target=time.sleep, args=(3e-3,))
        worker.start()
        worker.join()

    budget = TimingBudget(max_time_s=0.2, min_samples=5, cpu_flush="off", clock_anchor="on")
    for kernel in (sleeper, waits_on_a_thread):
        result = time_cpu(kernel, budget)
        assert result.anchor is not None
        assert sorted(result.anchor["kernel_s"])[len(result.anchor["kernel_s"]) // 2] >= 3e-3


def test_every_sample_of_the_rounds_is_paired_with_the_anchor() -> None:
    a = torch.randn(256, 256)
    budget = TimingBudget(max_time_s=0.3, min_samples=8, cpu_flush="off", clock_anchor="on")
    result = time_cpu(lambda: torch.mm(a, a), budget)
    anchor = result.anchor
    assert anchor is not None
    assert anchor["layout"] == CPU_LAYOUT
    assert anchor["name"].startswith("cpu anchor: fp32 matmul 128x128x128")
    assert anchor["pairs"] == len(result.samples_s)
    assert len(anchor["kernel_s"]) == len(anchor["anchor_s"]) == len(anchor["ratios"])
    for on_cpu, ratio, anchor_s in zip(
        anchor["kernel_s"], anchor["ratios"], anchor["anchor_s"], strict=True
    ):
        assert ratio == pytest.approx(on_cpu / anchor_s)
    # The memory anchor after every sample, each a real sum of 8 MiB (tens of microseconds
    # at least on any CPU: more than the bare call's overhead).
    assert len(anchor["memory_s"]) == len(anchor["kernel_s"])
    assert min(anchor["memory_s"]) > 2e-5
    # Off: the kernel is timed alone, as before.
    plain = time_cpu(
        lambda: torch.mm(a, a), TimingBudget(max_time_s=0.1, min_samples=5, cpu_flush="off")
    )
    assert plain.anchor is None


def test_the_summary_leaves_out_non_positive_pairs() -> None:
    summary = summarize_cpu_pairs("cpu anchor: x", [2.0, 0.0, 4.0], [1.0, 1.0, 2.0])
    assert summary["pairs"] == 2
    assert summary["ratios"] == [2.0, 2.0]
    assert summary["kernel_median_s"] == 3.0
    assert summary["anchor_median_s"] == 1.5


_FAULTS_PER_ADD = """
import resource, sys
import torch
if sys.argv[1] == "steady":
    from pytest_kernelpro.measure.timing.cpu import steady_allocator
    print(steady_allocator())
else:
    print("")
a, b = torch.ones(1_000_000), torch.ones(1_000_000)
a + b  # the first call may fault in the heap once
if sys.argv[2] == "settle":
    # A warm-up, as the timer's, until three calls in a row faulted nothing (at most 50):
    # the heap settles within the first few calls, how many varies from run to run.
    quiet = 0
    for _ in range(50):
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        a + b
        quiet = quiet + 1 if resource.getrusage(resource.RUSAGE_SELF).ru_minflt == start else 0
        if quiet == 3:
            break
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    c = a + b  # a 4 MB output, freed at the next assignment
    del c
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 50)
"""


def _faults_per_add(mode: str, warm_up: str) -> tuple[str, float]:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _FAULTS_PER_ADD, mode, warm_up],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    note, faults = done.stdout.splitlines()[-2:]
    return note, float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator and rusage")
def test_the_steady_allocator_serves_a_4mb_output_without_page_faults() -> None:
    """Without the fixed thresholds glibc serves the 4 MB outputs after a first call with fresh
    pages that fault in again and again (how many depended on what the process freed before);
    with them, none once the heap settled (a few calls: the timer's warm-up; right after one
    call, in about one run of four, up to six more calls faulted their output in). Not shown
    here: on a settled heap glibc's own moving threshold also stops faulting in this small
    loop; the fix's effect on sessions (history-independent page faults) is measured in
    bench/results/2026-12-02-cpu-gate-cpu.md."""
    plain_note, plain = _faults_per_add("plain", "once")
    note, steady = _faults_per_add("steady", "settle")
    if not note:
        pytest.skip("the C library is not glibc: nothing to fix")
    assert plain_note == ""
    assert "mmap threshold fixed at 32 MiB" in note
    assert plain > 50, f"expected page faults on every call without the fix, saw {plain}"
    assert steady < 1, f"expected no page faults with the fix, saw {steady} a call"


def test_a_cpu_timing_records_what_it_did_to_the_allocator() -> None:
    from pytest_kernelpro.measure.timing.cpu import steady_allocator

    x = torch.ones(1000)
    result = time_cpu(
        lambda: x + 1, TimingBudget(max_time_s=0.05, min_samples=5, clock_anchor="on")
    )
    assert result.anchor is not None
    assert result.anchor["allocator"] == steady_allocator()
