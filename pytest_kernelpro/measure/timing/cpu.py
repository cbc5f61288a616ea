"""The CPU timer: `time.perf_counter` around each call, with the adaptive rounds and the
statistics of `budget.py`, and three differences from the CUDA timer:

- the time budget covers what `time_kernel` does after allocating the flush buffer once
  (first call, estimate, warm-up, samples and statistics) and is honoured within
  `BUDGET_TOLERANCE` (20%): the estimate is the first warm-up samples, the warm-up ends at a
  wall-clock deadline (at most `CPU_WARMUP_SHARE` of the budget, and never later than leaves
  room for the floor of samples), a round ends at the budget's deadline, and `min_samples`
  gives way to the budget once `CPU_MIN_SAMPLES_FLOOR` samples are in. A budget shorter
  than the first call, one estimate and those 5 samples cannot be honoured: the result's
  `budget_note` says so and how long a budget would be (see `time_cpu`). Checked against a
  simulated clock (tests/measure/test_timing_budget.py) and measured on the loaded 2-core
  VM (bench/results/2026-12-01-cpu-budget-cpu.md);
- the cache flush (`cpu_flush`): `on` writes the last-level cache plus the L2 of the CPU the
  process runs on before each sample; `off` never does; `auto` (the default) flushes only
  when the kernel's inputs fit in that cache (`working_set_bytes`), because inputs larger
  than the cache come from memory whether or not it was flushed, and the flush would only
  cost time (81 ms a sample on a machine with a 256 MiB last-level cache);
- the CPU's load over the sampling is measured (`cpuload.CpuLoadMonitor`): a timing taken
  while other processes held the cores the kernel's threads need is marked oversubscribed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
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
from pytest_kernelpro.measure.timing.cpu_anchor import cpu_pairs
from pytest_kernelpro.measure.timing.fresh_inputs import FreshInputs


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


def cpu_flush_bytes() -> int:
    """Bytes a CPU flush writes: the last-level cache plus the level below it (the L2 of this
    core), so every level that could hold the inputs is overwritten once; 256 MiB unknown."""
    levels = cpu_cache_levels()
    if levels:
        top = sorted(levels)[-2:]
        return sum(levels[level] for level in top)
    return last_level_cache_bytes() or DEFAULT_FLUSH_BYTES


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


def cpu_flush_decision(budget: TimingBudget) -> tuple[int, str]:
    """(bytes to write before each CPU sample, why) for the budget's `cpu_flush` mode."""
    if not budget.flush_l2 or budget.cpu_flush == "off":
        return 0, "off" if budget.flush_l2 else "flush disabled"
    nbytes = int(budget.flush_bytes) if budget.flush_bytes is not None else cpu_flush_bytes()
    if budget.cpu_flush == "on":
        return nbytes, "on"
    working = budget.working_set_bytes
    if working is not None and working > nbytes:
        return 0, (
            f"auto: the inputs ({working / 2**20:.0f} MiB) exceed the "
            f"{nbytes / 2**20:.0f} MiB of cache, so they come from memory anyway"
        )
    return nbytes, "auto: the inputs fit in the cache"


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

    from pytest_kernelpro.measure.cpuload import CpuLoadMonitor, torch_threads

    clock = clock or bound.perf_counter
    if fresh is not None:
        fn = fresh.call
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
    budget_start = clock()
    deadline = budget_start + budget.max_time_s
    floor = min(CPU_MIN_SAMPLES_FLOOR, budget.min_samples)
    fill = [0]

    def do_flush() -> None:
        if flush is not None:
            flush()
        elif buf is not None:
            fill[0] = (fill[0] + 1) & 0xFF  # a new value each time: no write can be skipped
            buf.fill(fill[0])

    pairs = cpu_pairs(budget, clock)

    def body_of(calls: int) -> Callable[[], object]:
        def body() -> object:
            out = None
            for _ in range(calls):
                out = fn()
            return out

        return body

    def sample(calls: int) -> float:
        if fresh is not None:
            fresh.before()
        if flushing:
            do_flush()
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
        return per_call

    try:
        out = fn()
        if fresh is not None:
            fresh.after(out, force=True)
        out = None
        # Estimate and warm-up in one: flushed single-call samples until the warm-up
        # deadline (5 at most for the estimate), each timed whole so the flush is priced.
        # On a loaded machine a call takes many times its estimate, so the warm-up ends at
        # a wall-clock deadline, never after a count of calls.
        warmup_s = min(budget.warmup_ms * 1e-3, CPU_WARMUP_SHARE * budget.max_time_s)
        warm_end = clock() + warmup_s  # after the first call: a compile is no warm-up
        per_calls: list[float] = []
        walls: list[float] = []
        while not per_calls or (len(per_calls) < 5 and clock() < warm_end):
            w0 = clock()
            per_calls.append(sample(1))
            walls.append(clock() - w0)
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
        while clock() < warm_end:
            sample(calls)
            n_warm += 1
        left = max(deadline - clock(), 0.0)
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
                if taken[0] >= floor and clock() >= deadline:
                    break
            return values, False

        monitor = CpuLoadMonitor(threads or 1)
        if pairs is not None:
            pairs.recording = True  # the anchor follows every sample from here on
        log = adaptive_rounds(
            run_round,
            sampling,
            floor_samples=floor,
            clock=clock,
            converge_on=None if pairs is None else pairs.ratios,
        )
        load = monitor.stop()
        if fresh is not None:
            fresh.finish()
    except KernelproError:
        raise
    except Exception as exc:
        raise kernel_failed(device, "timing", exc) from exc
    assert log.stats is not None
    t_end = clock()
    spent = t_end - budget_start
    budget_note = ""
    if spent > (1.0 + BUDGET_TOLERANCE) * budget.max_time_s:
        budget_note = (
            f"the time budget of {budget.max_time_s:g} s was overrun ({spent:.3g} s): the "
            f"first call, one estimate and the floor of {floor} samples need it "
            f"(a sample took {sample_wall * 1e3:.3g} ms"
            + (", flush included" if flushing else "")
            + "); raise the budget (--kernelpro-time-budget) to at least "
            f"{(2 + floor) * sample_wall * (1.0 + BUDGET_TOLERANCE):.2g} s"
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
        anchor=None if pairs is None else pairs.summary(),
        honesty=None if fresh is None else fresh.to_dict(),
    )
