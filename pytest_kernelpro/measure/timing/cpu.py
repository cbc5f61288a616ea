"""The CPU timer and what makes its numbers readable on a shared machine: the timer
(`time.perf_counter` around each call, with the adaptive rounds and the statistics of
`budget.py`), the CPU anchor timed after every sample, and the CPU's load over the sampling
with the thread policy of CPU timing.

The timer differs from the CUDA timer in four ways:

- the time budget covers what `time_kernel` does after allocating the flush buffer once
  (first call, estimate, warm-up, samples and statistics; not the new content made before
  each call nor the checked calls' reference runs, `fresh_inputs.py`) and is honoured within
  `BUDGET_TOLERANCE` (20%): the estimate is the first warm-up samples, the warm-up ends at a
  wall-clock deadline (at most `CPU_WARMUP_SHARE` of the budget, and never later than leaves
  room for the floor of samples), a round ends at the budget's deadline, and `min_samples`
  gives way to the budget once `CPU_MIN_SAMPLES_FLOOR` samples are in. A budget shorter
  than the first call, one estimate and those 5 samples cannot be honoured: the result's
  `budget_note` says so and how long a budget would be (see `time_cpu`). Checked against a
  simulated clock (tests/measure/test_timing_budget.py) and measured on the loaded 2-core
  VM (bench/results/2026-12-01-cpu-budget-cpu.md);
- the cache flush (`cpu_flush`): `on` writes the last-level cache (at most
  `CPU_FLUSH_LLC_CAP` of it) plus the L2 of the CPU the process runs on before each sample; `off` never does; `auto` (the default) flushes only
  when the kernel's inputs fit in that cache (`working_set_bytes`), because inputs larger
  than the cache come from memory whether or not it was flushed, and the flush would only
  cost time (81 ms a sample on a machine with a 256 MiB last-level cache);
- the CPU's load over the sampling is measured (`CpuLoadMonitor`): a timing taken
  while other processes held the cores the kernel's threads need is marked oversubscribed;
- the process's allocator is made steady before the first CPU timing (`steady_allocator`):
  glibc's moving mmap threshold otherwise decides per process whether a kernel's output
  buffers page-fault on every call, and the gate would compare two allocators, not two kernels.

The CPU anchor: a fixed workload timed right after every CPU sample, on-CPU time for both.
On a shared CPU a kernel's wall time is mostly other processes' time: on the project's
2-core VM beside two busy-looping processes, a ~1 ms kernel's median sample was 15-34 ms,
almost all of it spent waiting on the run queue; between two sessions the wall-clock
median of the same code moved by tens of percent, so the gate on times either called a
2x slowdown "suspect" (the oversubscription rule) or an unchanged kernel "improved" or
"slower" when the load changed between the baseline and the run
(bench/results/2026-12-02-cpu-gate-cpu.md has the numbers). Two things fix that, the same
way the GPU clock anchor cancels the power cap (`anchor.py`):

1. **On-CPU time.** Each timed call is charged its wall time minus the time its thread
   waited on the run queue while it ran (Linux's per-thread `schedstat`, read before and
   after, outside the timed window), and never less than the thread's CPU time: a
   preemption no longer counts as the kernel's time, while a kernel that sleeps, blocks
   or waits on another thread is still charged for the wait (it is not runnable then).
   Without `schedstat` (not Linux) the thread's CPU time is used.
2. **The anchor.** After each sample, a fixed fp32 GEMM of `CPU_ANCHOR_N`^3 on seeded data
   runs twice, each call timed the same way, and the faster of the two is the pair's anchor
   (the first call also brings its data back to the cache after the kernel's; one call that
   a neighbour disturbed is not the machine's speed). What still slows the kernel on a
   shared machine, the other vCPU's use of the shared cache and memory, the host's own
   scheduling (steal), the clock, slows the anchor next to it too, so the gate compares the per-pair kernel / anchor ratios
   (`gate/verdict_basis.py`) and reads the anchor's own change and scatter as the measure of
   how far the machine moved.

The kernel's reported samples stay its wall times (what a user waits for); the pairs go to
`TimingResult.anchor` with the same keys as the GPU's (`name`, `ratios`, `anchor_median_s`),
so a baseline keeps them the same way. A pair costs the anchor's two calls and six
`schedstat` reads (together well under a millisecond on the project's VM).

The CPU's load (how busy the CPU was while something was timed) and the thread policy of
CPU timing: a CPU timing is only as good as the cores it had. When other processes (or the hypervisor,
as steal time) take cores that the kernel's threads need, a parallel region waits for a
descheduled thread for whole scheduler slices: on a shared 2-core machine a 128x512
softmax at torch's default two threads measured 73 ms instead of ~0.1 ms. Such numbers are
not the kernel's, so they are marked "suspect" (reported, never failed) instead of gated.

What is measured, over exactly the interval that was timed:
- **other processes' CPU use**: the machine's busy time from `/proc/stat` (user, nice,
  system, irq, softirq and steal) minus this process's own CPU time (`os.times`), divided by
  the wall time: the average number of cores that something else used, capped at the
  machine's cores (both counters tick at 100 Hz, so over a short interval the difference can
  come out above the machine: "2.2 of 2 cores" means "all of them");
- the **1-minute load average** and the **runnable threads** of the machine at the end,
  for the summary line (they include this process, so they only describe, never decide);
- the **threads** the kernel ran with against the **cores** this process may use.

The interval is oversubscribed when the kernel's threads exceed the cores available to the
process, when the threads exceed the cores the other processes left free by more than
`OVERSUBSCRIBED_SLACK` of a thread each (10%: a quiet machine's background is ~1% of a
core), or when other processes used more than `SHARED_SHARE` of the machine's cores even if
a core was left for each thread: memory bandwidth and the last-level cache are shared too,
so a memory-bound kernel slows down beside a busy neighbour without losing its core.

Thread policy: CPU kernels are timed with a fixed number of torch intra-op threads,
`kernelpro_cpu_threads`: `auto` (the default) is ONE thread, a number N is N threads (at
most the cores this process may use, or the timing is marked oversubscribed). One thread by
default because a parallel region waits for its slowest thread: with another process on one
of two cores, a 256x1024 softmax measured 22 ms at two threads and 0.36 ms at one
(bench/results/2026-12-01-cpu-threads-cpu.md). Here the CPU run of a GPU kernel is a check
and a stand-in for the gate, so a number that other work cannot move by 60x is worth more
than the multi-core speedup; give N to time multi-threaded CPU code. The count is part of
the device name ("cpu (AMD EPYC, 1 thread)"), so timings with different thread counts are
never compared as if they came from the same machine, and ceilings are cached per count.
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure import bound
from pytest_kernelpro.measure.timing.budget import (
    BUDGET_TOLERANCE,
    CPU_MIN_SAMPLE_S,
    CPU_MIN_SAMPLES_FLOOR,
    CPU_WARMUP_SHARE,
    DEFAULT_FLUSH_BYTES,
    TimingBudget,
    TimingResult,
    adaptive_rounds,
    kernel_failed,
)
from pytest_kernelpro.measure.timing.fresh_inputs import (
    DishonestTiming,
    FreshInputs,
    verify_bindings,
)


@dataclass(frozen=True)
class CpuTimer:
    """The `Timer` of the CPU (`time_cpu` with the real clock)."""

    def time(
        self, fn: Callable[[], object], budget: TimingBudget, fresh: FreshInputs | None = None
    ) -> TimingResult:
        return time_cpu(fn, budget, fresh=fresh)


def cpu_model_name() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else `platform.processor()`."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _current_cpu() -> int:
    import os

    try:
        return min(os.sched_getaffinity(0))
    except (AttributeError, OSError, ValueError):
        return 0


def cpu_cache_levels() -> dict[int, int]:
    """Sizes of the data/unified caches of the CPU this process runs on, by level (sysfs)."""
    import glob

    sizes: dict[int, int] = {}
    for folder in glob.glob(f"/sys/devices/system/cpu/cpu{_current_cpu()}/cache/index*"):
        try:
            with open(f"{folder}/level", encoding="utf-8") as handle:
                level = int(handle.read())
            with open(f"{folder}/type", encoding="utf-8") as handle:
                kind = handle.read().strip()
            with open(f"{folder}/size", encoding="utf-8") as handle:
                text = handle.read().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes[level] = int(digits) * scale
    return sizes


# The most of the last-level cache a CPU flush writes. A flush costs time in every sample,
# and above the cache's size it costs a memory-speed write (on the project's 2-core VM with a
# 32 MiB LLC: 1.4 ms for 33 MiB, 10 ms for 66 MiB, bench/results/2026-12-05-first-run-cpu.md),
# while a VM can report its host's whole LLC: 480 MiB meant 482 MiB written, ~100 ms, before
# every sample, and the 1 s default budget overrun 2-5x. Above the cap a kernel's small inputs
# may stay partly cached from the sample before (the same for the baseline and the head on
# one machine, which is what the gate compares); the flush reason says when it applies.
CPU_FLUSH_LLC_CAP = 64 * 2**20


def cpu_flush_bytes() -> int:
    """Bytes a CPU flush writes: the L2 of this core plus the last-level cache, at most
    `CPU_FLUSH_LLC_CAP` of it, so every level that could hold the inputs is overwritten once
    where the LLC is of ordinary size; the cap when the cache sizes are unknown."""
    levels = cpu_cache_levels()
    if len(levels) >= 2:
        top = sorted(levels)[-2:]
        return levels[top[0]] + min(levels[top[1]], CPU_FLUSH_LLC_CAP)
    return min(last_level_cache_bytes() or DEFAULT_FLUSH_BYTES, CPU_FLUSH_LLC_CAP)


def cpu_flush_cap_note() -> str:
    """Why the flush writes less than the whole last-level cache ("" when it writes all)."""
    llc = last_level_cache_bytes()
    if llc is None:
        return f"; the cache sizes are unknown, so {CPU_FLUSH_LLC_CAP >> 20} MiB"
    if llc <= CPU_FLUSH_LLC_CAP:
        return ""
    return (
        f"; {CPU_FLUSH_LLC_CAP >> 20} MiB of the {llc >> 20} MiB last-level cache (the cap: "
        "a whole-cache write before every sample would not fit the time budget; small inputs "
        "may stay partly cached, the same for the baseline and the head)"
    )


def last_level_cache_bytes() -> int | None:
    """Size of the CPU's largest cache level (Linux sysfs, else sysconf), or None."""
    import glob

    best: tuple[int, int] | None = None
    for folder in glob.glob(f"/sys/devices/system/cpu/cpu{_current_cpu()}/cache/index*"):
        try:
            with open(f"{folder}/level", encoding="utf-8") as handle:
                level = int(handle.read())
            with open(f"{folder}/size", encoding="utf-8") as handle:
                text = handle.read().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit() and (best is None or level > best[0]):
            best = (level, int(digits) * scale)
    if best is not None:
        return best[1]
    import os

    try:
        value = os.sysconf("SC_LEVEL3_CACHE_SIZE")
    except (ValueError, OSError):
        return None
    return value if value > 0 else None


_CPU_FLUSH_BUFFERS: dict[int, Any] = {}

# glibc's allocator serves a request above its mmap threshold with fresh pages that fault in
# on first touch and go back to the OS on free, and it moves that threshold up to the size of
# the last such block freed. So whether a kernel's 4 MB output costs a thousand page faults on
# every call depended on what the process had freed before: unchanged kernels (a 1M-element add,
# a 2048x1024 bias+gelu) timed 2x apart in half the sessions. Fixing the threshold at its
# maximum (and the top-of-heap trim at twice it, glibc's own ratio) serves every block up to
# 32 MiB from reused heap pages in every process, what a long-running program sees.
GLIBC_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest allowed value on 64-bit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)


@functools.cache
def steady_allocator() -> str:
    """Fix glibc's mmap and trim thresholds for this process (once; see above) and say what
    was done: the note a CPU timing records, "" where the allocator is not glibc's."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        version = libc.gnu_get_libc_version
        version.restype = ctypes.c_char_p
        if libc.mallopt(_M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD) and libc.mallopt(
            _M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_THRESHOLD
        ):
            return (
                f"glibc {version().decode()}: mmap threshold fixed at "
                f"{GLIBC_MMAP_THRESHOLD >> 20} MiB, trim at {GLIBC_MMAP_THRESHOLD >> 19} MiB"
            )
    except (OSError, AttributeError, ValueError):  # not glibc (musl, macOS, Windows)
        pass
    return ""


def cpu_flush_decision(budget: TimingBudget) -> tuple[int, str]:
    """(bytes to write before each CPU sample, why) for the budget's `cpu_flush` mode."""
    if not budget.flush_l2 or budget.cpu_flush == "off":
        return 0, "off" if budget.flush_l2 else "flush disabled"
    capped = ""
    if budget.flush_bytes is not None:
        nbytes = int(budget.flush_bytes)
    else:
        nbytes, capped = cpu_flush_bytes(), cpu_flush_cap_note()
    if budget.cpu_flush == "on":
        return nbytes, "on" + capped
    working = budget.working_set_bytes
    if working is not None and working > nbytes:
        return 0, (
            f"auto: the inputs ({working / 2**20:.0f} MiB) exceed the "
            f"{nbytes / 2**20:.0f} MiB a flush writes, so "
            + ("they come from memory anyway" if not capped else "no flush makes them cold")
        )
    return nbytes, "auto: the inputs fit in the cache" + capped


def overrun_note(
    budget_s: float,
    spent_s: float,
    *,
    first_call_s: float,
    warmup_s: float,
    warmup_samples: int,
    sampling_s: float,
    samples: int,
    floor: int,
    sample_wall_s: float,
    kernel_s: float,
    flush_s: float,
    flush_bytes: int,
) -> str:
    """What took the time of a CPU timing that overran its budget, and the budget that fits:
    the first call, the estimate and warm-up, the samples (never fewer than `floor`), and a
    sample's parts (the kernel, the cache flush, the anchor and bookkeeping the rest)."""
    parts = [f"the kernel {kernel_s * 1e3:.3g} ms"]
    if flush_bytes:
        parts.append(f"the cache flush ({flush_bytes >> 20} MiB) {flush_s * 1e3:.3g} ms")
    rest = sample_wall_s - kernel_s - (flush_s if flush_bytes else 0.0)
    if rest > 0.05 * sample_wall_s:
        parts.append(f"the anchor and bookkeeping {rest * 1e3:.3g} ms")
    fix = (
        "--kernelpro-cpu-flush=off or a larger budget"
        if flush_bytes and flush_s > 0.5 * sample_wall_s
        else "a larger budget"
    )
    return (
        f"the time budget of {budget_s:g} s was overrun ({spent_s:.3g} s): the first call "
        f"took {first_call_s:.3g} s, the estimate and warm-up {warmup_s:.3g} s "
        f"({warmup_samples} sample{'' if warmup_samples == 1 else 's'}), {samples} samples "
        f"{sampling_s:.3g} s (never fewer than "
        f"{floor}); a sample took {sample_wall_s * 1e3:.3g} ms: {', '.join(parts)}. "
        f"Use {fix} (--kernelpro-time-budget of at least "
        f"{(2 + floor) * sample_wall_s * (1.0 + BUDGET_TOLERANCE) + first_call_s:.2g} s)"
    )


def time_cpu(
    fn: Callable[[], object],
    budget: TimingBudget,
    *,
    clock: Callable[[], float] | None = None,
    flush: Callable[[], None] | None = None,
    fresh: FreshInputs | None = None,
) -> TimingResult:
    """CPU timing with `clock` (`time.perf_counter` as it was when the plugin loaded,
    `measure.bound`: a kernel that rebinds it cannot change the timer's clock; see the
    module docstring). With `fresh`, each sample is one call of `fresh.call` on inputs
    refilled before it (`fresh_inputs.py`), its output checked after the end time.

    How the budget is spent, every step planned from the clock so the whole call stays
    within the budget: the first call (load, lazy init); flushed samples of one call each
    until the warm-up deadline (at least one: the per-call and per-sample estimate, also
    warm-up); more warm-up only while it leaves room for the floor of samples; then the
    adaptive rounds, cut at the deadline. The floor (`CPU_MIN_SAMPLES_FLOOR`) is never given
    up: with fewer samples the gate's Mann-Whitney test at alpha 0.01 could never reject
    (4 against 4 samples give p >= 1/70), so a budget too short for it is overrun and
    `budget_note` says by how much and why.

    `clock` and `flush` (called before each sample instead of writing the flush buffer,
    when the budget's flush decision is to flush) are for tests that check the plan against
    a simulated clock; timing uses the defaults.
    """
    import numpy as np

    clock = clock or bound.perf_counter
    if fresh is not None:
        fn = fresh.call
    allocator = steady_allocator()
    t_start = clock()
    device = f"cpu ({cpu_model_name()})"
    threads = torch_threads()
    nbytes, flush_reason = cpu_flush_decision(budget)
    buf = None
    if nbytes and flush is None:
        if nbytes not in _CPU_FLUSH_BUFFERS:  # kept for the process: page faults paid once
            _CPU_FLUSH_BUFFERS[nbytes] = np.ones(nbytes, dtype=np.uint8)
        buf = _CPU_FLUSH_BUFFERS[nbytes]
    flushing = bool(nbytes)

    # The budget starts after the one-time allocation above (wall_s still includes it).
    # The budget buys samples: honest measurement's own work (each call's new content, the
    # checked calls' reference runs) is wall time it does not charge (`fresh_inputs`), so a
    # check never costs the gate samples; the record's `timing.honesty` has what it took.
    def plan_clock() -> float:
        return clock() - (fresh.refill_s + fresh.check_s if fresh is not None else 0.0)

    budget_start = plan_clock()
    deadline = budget_start + budget.max_time_s
    floor = min(CPU_MIN_SAMPLES_FLOOR, budget.min_samples)
    fill = [0]
    flush_s: list[float] = []  # each flush's time, for the overrun note

    def do_flush() -> None:
        f0 = clock()
        if flush is not None:
            flush()
        elif buf is not None:
            fill[0] = (fill[0] + 1) & 0xFF  # a new value each time: no write can be skipped
            buf.fill(fill[0])
        flush_s.append(clock() - f0)

    pairs = cpu_pairs(budget, clock)
    seal = fresh.seal() if fresh is not None else None  # a local: no object the kernel finds
    between = OtherThreads()

    def body_of(calls: int) -> Callable[[], object]:
        def body() -> object:
            out = None
            for _ in range(calls):
                out = fn()
            return out

        return body

    def sample(calls: int) -> float:
        # The kept bindings before and after every sample (`measure.bound`): a kernel that
        # rebinds a clock is refused at the sample it did it in.
        verify_bindings(fresh, seal)
        between.start()
        if fresh is not None:
            fresh.before()
        if flushing:
            do_flush()
        between.stop()
        if pairs is not None:
            per_call, out = pairs.measure(body_of(calls), calls)
        else:
            out = None
            t0 = clock()
            for _ in range(calls):
                out = fn()
            t1 = clock()
            per_call = (t1 - t0) / calls
        if fresh is not None:
            fresh.after(out)
        verify_bindings(fresh, seal)
        between.kernel_s += per_call * calls
        return per_call

    try:
        if fresh is not None:
            fresh.before()
        out = fn()
        if fresh is not None:
            fresh.after(out, force=True)
        out = None
        first_call_s = plan_clock() - budget_start
        # Estimate and warm-up in one: flushed single-call samples until the warm-up
        # deadline (5 at most for the estimate), each timed whole so the flush is priced.
        # On a loaded machine a call takes many times its estimate, so the warm-up ends at
        # a wall-clock deadline, never after a count of calls.
        warmup_s = min(budget.warmup_ms * 1e-3, CPU_WARMUP_SHARE * budget.max_time_s)
        warm_end = plan_clock() + warmup_s  # after the first call: a compile is no warm-up
        per_calls: list[float] = []
        walls: list[float] = []
        while not per_calls or (len(per_calls) < 5 and plan_clock() < warm_end):
            w0 = plan_clock()
            per_calls.append(sample(1))
            walls.append(plan_clock() - w0)
        per_call = float(np.median(per_calls))
        sample_wall = float(np.median(walls))
        calls = 1
        # Not with fresh inputs: calls repeated inside a sample would see the same ones.
        if not flushing and per_call < CPU_MIN_SAMPLE_S and fresh is None:
            # Timer overhead (~100 ns) matters for microsecond calls: repeat inside a sample.
            calls = min(10_000, math.ceil(CPU_MIN_SAMPLE_S / max(per_call, 1e-9)))
            sample_wall = per_call * calls
        # More warm-up only while the floor of samples still fits before the deadline.
        warm_end = min(warm_end, deadline - floor * sample_wall)
        n_warm = 0
        while plan_clock() < warm_end:
            sample(calls)
            n_warm += 1
        sampling_start = plan_clock()
        left = max(deadline - sampling_start, 0.0)
        fit = int(left / sample_wall) if sample_wall > 0 else budget.min_samples
        min_samples = max(min(budget.min_samples, fit), floor)
        sampling = replace(
            budget,
            max_time_s=max(left, 1e-6),
            min_samples=min_samples,
            max_samples=max(budget.max_samples, min_samples),
        )

        taken = [0]

        def run_round(k: int) -> tuple[list[float], bool]:
            # A round ends at the deadline (once the floor is in): a round planned from the
            # rate so far must not overrun the budget when the machine gets busier.
            values = []
            for _ in range(k):
                values.append(sample(calls))
                taken[0] += 1
                if taken[0] >= floor and plan_clock() >= deadline:
                    break
            return values, False

        monitor = CpuLoadMonitor(threads or 1)
        if pairs is not None:
            pairs.recording = True  # the anchor follows every sample from here on
        log = adaptive_rounds(
            run_round,
            sampling,
            floor_samples=floor,
            clock=plan_clock,
            converge_on=None if pairs is None else pairs.ratios,
        )
        load = monitor.stop()
        if fresh is not None:
            fresh.finish()
        idle_work = between.failure(threads)
        if idle_work is not None:
            raise DishonestTiming(idle_work)
    except KernelproError:
        raise
    except Exception as exc:
        raise kernel_failed(device, "timing", exc) from exc
    assert log.stats is not None
    t_end = clock()
    spent = plan_clock() - budget_start
    budget_note = ""
    if spent > (1.0 + BUDGET_TOLERANCE) * budget.max_time_s:
        budget_note = overrun_note(
            budget.max_time_s,
            spent,
            first_call_s=first_call_s,
            warmup_s=sampling_start - budget_start - first_call_s,
            warmup_samples=len(per_calls) + n_warm,
            sampling_s=budget_start + spent - sampling_start,
            samples=len(log.samples),
            floor=floor,
            sample_wall_s=sample_wall,
            kernel_s=per_call * calls,
            flush_s=float(np.median(flush_s)) if flush_s else 0.0,
            flush_bytes=nbytes,
        )
    return TimingResult(
        samples_s=tuple(log.samples),
        stats=log.stats,
        method="cpu-perf-counter",
        device=device,
        stop_reason=log.stop_reason,
        wall_s=t_end - t_start,
        warmup_runs=1 + len(per_calls) + n_warm * calls,
        throttled_samples=0,
        clocks=None,
        flushed_l2=flushing,
        calls_per_sample=calls,
        flush_bytes=nbytes,
        rounds=log.rounds,
        budget=budget.to_dict(),
        threads=threads,
        cpu_load=load.to_dict(),
        flush_reason=flush_reason,
        budget_note=budget_note,
        anchor=None if pairs is None else {**pairs.summary(), "allocator": allocator},
        honesty=None if fresh is None else {**fresh.to_dict(), **between.to_dict()},
    )


# A kernel's thread could wait for the refill and compute the next output while the cache is
# flushed, outside the timed window. With one torch thread (the default policy) nothing else
# of this process should run then: CPU time of other threads there beyond this share of the
# kernel's own time (and `OTHER_THREADS_MIN_S`) refuses the timing.
OTHER_THREADS_SHARE = 0.5
OTHER_THREADS_MIN_S = 1e-3


@dataclass
class OtherThreads:
    """CPU time of this process's other threads between timed calls (refill and flush)."""

    other_s: float = 0.0
    gap_s: float = 0.0
    kernel_s: float = 0.0
    _start: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def start(self) -> None:
        self._start = (bound.process_time(), bound.thread_time(), bound.perf_counter())

    def stop(self) -> None:
        process0, thread0, wall0 = self._start
        mine = bound.thread_time() - thread0
        self.other_s += max(0.0, bound.process_time() - process0 - mine)
        self.gap_s += bound.perf_counter() - wall0

    def failure(self, threads: int | None) -> str | None:
        if (threads or 1) != 1:  # torch's own workers may spin after a parallel refill
            return None
        if self.other_s <= max(OTHER_THREADS_MIN_S, OTHER_THREADS_SHARE * self.kernel_s):
            return None
        return (
            f"other threads of the process used {self.other_s * 1e3:.1f} ms of CPU between "
            f"the timed calls (while inputs were refilled and the cache flushed, "
            f"{self.gap_s * 1e3:.1f} ms), against {self.kernel_s * 1e3:.1f} ms of timed calls: "
            "work done on another thread outside the timed window (a thread that computes "
            "the next output ahead) is not the kernel's time. Do the work inside the call"
        )

    def to_dict(self) -> dict[str, float]:
        return {"other_threads_between_calls_s": round(self.other_s, 6)}


# ----- the CPU anchor: a fixed GEMM after every sample, on-CPU time for both -----

CPU_ANCHOR_N = 128  # the anchor: fp32 (N x N) @ (N x N), ~4 MFLOP, about 0.1 ms on one core
CPU_LAYOUT = "cpu-pairs"  # each sample followed by the anchor, both in on-CPU time
_ANCHOR_SEED = 20261202
_ANCHOR_BUFFERS: dict[int, tuple[Any, Any, Any]] = {}  # by thread count: (a, b, out)


def cpu_anchor_name(torch: Any, threads: int | None) -> str:
    """The anchor's identity: ratios are comparable only under the same one (another torch
    build may pick another GEMM kernel; the thread count changes what it measures)."""
    return (
        f"cpu anchor: fp32 matmul {CPU_ANCHOR_N}x{CPU_ANCHOR_N}x{CPU_ANCHOR_N}, on-CPU time "
        f"(torch {torch.__version__}, {threads or 1} thread(s))"
    )


def cpu_anchor_launch(torch: Any) -> Callable[[], object]:
    """A zero-argument call of the anchor GEMM (buffers made once per process)."""
    threads = int(torch.get_num_threads())
    if threads not in _ANCHOR_BUFFERS:
        gen = torch.Generator().manual_seed(_ANCHOR_SEED)
        a, b = (torch.randn(CPU_ANCHOR_N, CPU_ANCHOR_N, generator=gen) for _ in range(2))
        _ANCHOR_BUFFERS[threads] = (a, b, torch.empty_like(a))
    a, b, out = _ANCHOR_BUFFERS[threads]
    return lambda: torch.mm(a, b, out=out)


class RunQueueClock:
    """Time this thread spent waiting on the run queue (ns), from /proc schedstat.

    `schedstat` holds "on-CPU ns, run-queue wait ns, timeslices" of one thread; the file is
    opened once and re-read with `pread` (about 15 us a read on the project's VM)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        try:
            tid = threading.get_native_id()
            self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            self.wait_ns()
        except (OSError, ValueError, IndexError, AttributeError):
            self.close()

    @property
    def available(self) -> bool:
        return self._fd is not None

    def wait_ns(self) -> int:
        """Run-queue wait so far; 0 when unavailable (then on-CPU time is the thread's)."""
        if self._fd is None:
            return 0
        return int(bound.os_pread(self._fd, 128, 0).split()[1])

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


def on_cpu_seconds(wall_s: float, wait_ns: int, cpu_s: float, use_wait: bool) -> float:
    """Wall time less the run-queue wait, never below the thread's CPU time (the wait is read
    just outside the timed window, so it can include a little time the window did not)."""
    if not use_wait:
        return cpu_s
    return max(wall_s - wait_ns * 1e-9, cpu_s, 1e-12)


@dataclass
class CpuPairs:
    """Collects (kernel, anchor) pairs in on-CPU time while the sampling rounds run.

    `measure(body)` times `body()` (the kernel's `calls` calls) and returns its wall time;
    when `recording`, it also charges the on-CPU time and then times the anchor.
    """

    anchor: Callable[[], object]
    name: str
    clock: Callable[[], float] = bound.perf_counter
    recording: bool = False
    kernel_s: list[float] = field(default_factory=list)  # on-CPU, per call
    kernel_wall_s: list[float] = field(default_factory=list)  # wall, per call
    anchor_s: list[float] = field(default_factory=list)  # on-CPU, per anchor call
    anchor_wall_s: list[float] = field(default_factory=list)
    added_s: float = 0.0  # wall time the anchor and the reads added
    rq: RunQueueClock = field(default_factory=RunQueueClock)

    def _timed(self, body: Callable[[], object]) -> tuple[float, float, object]:
        """(wall, on-CPU, what it returned) of one call of `body`."""
        w0 = self.rq.wait_ns()
        c0 = bound.thread_time()
        t0 = self.clock()
        out = body()
        t1 = self.clock()
        c1 = bound.thread_time()
        w1 = self.rq.wait_ns()
        wall = t1 - t0
        return wall, on_cpu_seconds(wall, w1 - w0, c1 - c0, self.rq.available), out

    def measure(self, body: Callable[[], object], calls: int) -> tuple[float, object]:
        """Time `body` (which makes `calls` calls of the kernel and returns the last output):
        (per-call wall seconds, the output)."""
        if not self.recording:
            t0 = self.clock()
            out = body()
            return (self.clock() - t0) / calls, out
        wall, on_cpu, out = self._timed(body)
        started = self.clock()
        # Two anchor calls, the faster one kept: the first brings its data back to the cache
        # after the kernel's, and a call disturbed by a neighbour is not the machine's speed.
        first, second = self._timed(self.anchor), self._timed(self.anchor)
        a_wall, a_cpu, _ = min(first, second, key=lambda x: x[1])
        self.added_s += self.clock() - started
        self.kernel_s.append(on_cpu / calls)
        self.kernel_wall_s.append(wall / calls)
        self.anchor_s.append(a_cpu)
        self.anchor_wall_s.append(a_wall)
        return wall / calls, out

    def ratios(self) -> list[float]:
        return pair_ratios(self.kernel_s, self.anchor_s)

    def summary(self) -> dict[str, Any]:
        """The `TimingResult.anchor` dict (see `summarize_cpu_pairs`)."""
        run_queue = self.rq.available
        self.rq.close()
        return summarize_cpu_pairs(
            self.name,
            self.kernel_s,
            self.anchor_s,
            kernel_wall_s=self.kernel_wall_s,
            anchor_wall_s=self.anchor_wall_s,
            run_queue=run_queue,
            added_s=self.added_s,
        )


def pair_ratios(kernel_s: Sequence[float], anchor_s: Sequence[float]) -> list[float]:
    """kernel / anchor per pair, pairs with a non-positive time left out."""
    return [k / a for k, a in zip(kernel_s, anchor_s, strict=True) if k > 0 and a > 0]


def summarize_cpu_pairs(
    name: str,
    kernel_s: Sequence[float],
    anchor_s: Sequence[float],
    *,
    kernel_wall_s: Sequence[float] = (),
    anchor_wall_s: Sequence[float] = (),
    run_queue: bool = True,
    added_s: float = 0.0,
) -> dict[str, Any]:
    """The pairs as `TimingResult.anchor` keeps them: the GPU anchor's keys (name, ratios,
    anchor_median_s, kernel_median_s) plus the on-CPU kernel times and the share of the
    kernel's wall time that was run-queue wait (how much of it other processes took)."""
    kept = [(k, a) for k, a in zip(kernel_s, anchor_s, strict=True) if k > 0 and a > 0]
    ratios = [k / a for k, a in kept]
    anchors = [a for _, a in kept]
    walls = [w for w in kernel_wall_s if w > 0]
    waited = None
    if walls and len(walls) == len(kernel_s):
        total = sum(walls)
        waited = max(0.0, 1.0 - sum(kernel_s) / total) if total > 0 else None
    return {
        "name": name,
        "layout": CPU_LAYOUT,
        "time": "on-CPU (wall less run-queue wait)" if run_queue else "thread CPU time",
        "pairs": len(kept),
        "anchor_s": anchors,
        "kernel_s": [k for k, _ in kept],
        "ratios": ratios,
        "ratio_median": statistics.median(ratios) if ratios else None,
        "kernel_median_s": statistics.median([k for k, _ in kept]) if kept else None,
        "anchor_median_s": statistics.median(anchors) if anchors else None,
        "anchor_wall_median_s": statistics.median(anchor_wall_s) if anchor_wall_s else None,
        "run_queue_share": waited,
        "added_s": added_s,
    }


def cpu_pairs(budget: Any, clock: Callable[[], float] = bound.perf_counter) -> CpuPairs | None:
    """The pairs collector of a CPU timing when `budget.clock_anchor` is "on" (the plugin's
    default), else None; the anchor's first call (its lazy initialisation) happens here."""
    if getattr(budget, "clock_anchor", "off") != "on":
        return None
    import torch

    launch = cpu_anchor_launch(torch)
    launch()
    return CpuPairs(
        anchor=launch, name=cpu_anchor_name(torch, int(torch.get_num_threads())), clock=clock
    )


# ----- the CPU's load over an interval, and the thread policy -----

OVERSUBSCRIBED_SLACK = 0.10  # threads may lose this fraction of a core each before it counts
SHARED_SHARE = 0.25  # other processes using more than this share of all cores: not quiet
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal (idle=3, iowait=4)


def available_cores() -> int:
    """CPUs this process may run on (its affinity mask), else the machine's count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def online_cpus() -> int:
    """CPUs of the machine (what /proc/stat's busy time is spread over)."""
    return max(1, os.cpu_count() or 1)


def torch_threads() -> int | None:
    """torch's intra-op thread count when torch is imported, else None (nothing to ask)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return int(torch.get_num_threads())
    except Exception:  # a half-initialised torch: report nothing rather than guess
        return None


def policy_threads(requested: int | None) -> int:
    """The thread count CPU kernels are timed with (see the module docstring).

    `requested` is the `cpu_threads` setting (None or 0: auto, one thread)."""
    return int(requested) if requested else 1


def _machine_busy_s() -> float | None:
    """Busy CPU seconds of the whole machine since boot (None without /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            first = handle.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        ticks = [int(v) for v in first[1:]]
        busy = sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks))
    except ValueError:
        return None
    return busy / float(os.sysconf("SC_CLK_TCK"))


def _runnable_threads() -> int | None:
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _self_cpu_s() -> float:
    times = os.times()
    return float(times.user + times.system)


@dataclass(frozen=True)
class CpuLoad:
    """The CPU's state over one timed interval (see the module docstring)."""

    cores: int  # CPUs this process may run on
    cpus: int  # CPUs of the machine
    threads: int  # threads the timed work ran with
    others_cores: float | None  # average cores used by other processes (None: unknown)
    loadavg_1m: float | None
    runnable_threads: int | None  # at the end, this process's running threads included
    wall_s: float

    @property
    def others_capped(self) -> float | None:
        """Other processes' cores within [0, cpus] (see the module docstring); records
        written before the cap may hold more."""
        if self.others_cores is None:
            return None
        return min(max(0.0, self.others_cores), float(self.cpus))

    @property
    def free_cores(self) -> float | None:
        others = self.others_capped
        if others is None:
            return None
        return max(0.0, self.cpus - others)

    @property
    def oversubscribed(self) -> bool:
        return bool(self.reasons())

    def reasons(self) -> list[str]:
        """Why the interval is oversubscribed; empty when it is not."""
        out = []
        if self.threads > self.cores:
            out.append(
                f"{self.threads} threads on {self.cores} available core(s) "
                "(set --kernelpro-cpu-threads to at most the cores)"
            )
        free, others = self.free_cores, self.others_capped
        if free is not None and others is not None:
            starved = self.threads > free + OVERSUBSCRIBED_SLACK * self.threads
            if starved or others > SHARED_SHARE * self.cpus:
                used = (
                    f"all {self.cpus}"
                    if others >= self.cpus - 0.05
                    else (f"{others:.1f} of {self.cpus}")
                )
                out.append(
                    f"other processes used {used} core(s) while {self.threads} thread(s) were timed"
                )
        return out

    def describe(self) -> str:
        """One line for the summary: the load and the reasons."""
        parts = []
        if self.loadavg_1m is not None:
            parts.append(f"load average {self.loadavg_1m:.1f} on {self.cpus} CPU(s)")
        if self.runnable_threads is not None:
            parts.append(f"{self.runnable_threads} runnable thread(s)")
        return "; ".join([*self.reasons(), *parts])

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["oversubscribed"] = self.oversubscribed
        data["reasons"] = self.reasons()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CpuLoad:
        names = ("cores", "cpus", "threads", "others_cores", "loadavg_1m", "runnable_threads")
        return cls(**{k: data.get(k) for k in names}, wall_s=float(data.get("wall_s") or 0.0))


class CpuLoadMonitor:
    """Measure other processes' CPU use between `start()` (the constructor) and `stop()`."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self._wall0 = time.perf_counter()
        self._busy0 = _machine_busy_s()
        self._self0 = _self_cpu_s()

    def stop(self) -> CpuLoad:
        wall = time.perf_counter() - self._wall0
        busy = _machine_busy_s()
        others = None
        if busy is not None and self._busy0 is not None and wall > 0:
            own = _self_cpu_s() - self._self0
            others = max(0.0, ((busy - self._busy0) - own) / wall)
            others = min(others, float(online_cpus()))  # tick rounding (module docstring)
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = None
        return CpuLoad(
            cores=available_cores(),
            cpus=online_cpus(),
            threads=self.threads,
            others_cores=None if others is None else round(others, 3),
            loadavg_1m=load,
            runnable_threads=_runnable_threads(),
            wall_s=wall,
        )


bound.keep_module(sys.modules[__name__])
