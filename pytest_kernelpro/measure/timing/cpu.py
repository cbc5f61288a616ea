"""The CPU timer: `time.perf_counter` around each call, in the adaptive rounds of `budget.py`.

A sample is one call (or, for a microsecond kernel without fresh inputs, a repeat of calls):
the inputs refilled (`fresh_inputs.py`), the cache flushed (`CacheFlush`), the call timed
and followed by the CPU anchor in on-CPU time (`on_cpu.py`), its output checked, the kept
bindings verified before and after (`CpuSampler.take`). Load and threads: `cpu_load.py`.

The budget covers what `time_cpu` does after allocating the flush buffer (first call,
estimate, warm-up, samples, statistics; not the inputs' new content nor the checked calls'
reference runs) and is honoured within `BUDGET_TOLERANCE`: the warm-up ends at a wall-clock
deadline (at most `CPU_WARMUP_SHARE` of the budget, leaving room for the floor of samples), a
round ends at the budget's deadline, and `min_samples` gives way to the budget once
`CPU_MIN_SAMPLES_FLOOR` samples are in. A kernel whose own calls need more than the budget
for that floor takes the floor without a note; an overrun past that need gets a
`budget_note` saying what took the time and the budget that fits (`overrun_note`;
bench/results/2026-12-01-cpu-budget-cpu.md). The reported samples stay wall times (what a
user waits for); the anchor's pairs go to `TimingResult.anchor`.

What the CPU's memory holds when a timed call starts: the caches flushed or not by the
`cpu_flush` mode (`cpu_flush_decision`), and an allocator made steady before the first CPU
timing (`steady_allocator`).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import sys
from collections.abc import Callable, Iterator
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
    RoundLog,
    TimingBudget,
    TimingResult,
    adaptive_rounds,
    kernel_failed,
)
from pytest_kernelpro.measure.timing.cpu_load import (
    CpuLoadMonitor,
    cpu_model_name,
    torch_threads,
)
from pytest_kernelpro.measure.timing.fresh_inputs import (
    DishonestTiming,
    FreshInputs,
    Seal,
    verify_bindings,
)
from pytest_kernelpro.measure.timing.on_cpu import (
    CpuPairs,
    OtherThreads,
    anchor_state,
    anchors_changed,
    cpu_pairs,
)


def _current_cpu() -> int:
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


# The most of the last-level cache a CPU flush writes: above the cache's size a flush costs a
# memory-speed write every sample, and a VM can report its host's whole LLC (480 MiB: ~100 ms
# a sample, the default budget overrun 2-5x; bench/results/2026-12-05-first-run-cpu.md). Above
# the cap small inputs may stay partly cached (alike for baseline and head on one machine);
# the flush reason says when it applies.
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
    """Size of the CPU's largest cache level (`cpu_cache_levels`, else sysconf), or None."""
    levels = cpu_cache_levels()
    if levels:
        return levels[max(levels)]
    try:
        value = os.sysconf("SC_LEVEL3_CACHE_SIZE")
    except (ValueError, OSError):
        return None
    return value if value > 0 else None


_CPU_FLUSH_BUFFERS: dict[int, Any] = {}

# glibc serves a request above its mmap threshold with fresh pages (faulted in on first
# touch, returned on free) and raises the threshold to the last such block freed, so a
# kernel's page faults per call depended on what the process freed before (unchanged kernels
# timed 2x apart in half the sessions). The threshold fixed at its maximum (and the trim at
# twice it, glibc's ratio) serves every block up to 32 MiB from reused heap pages.
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
    """(bytes to write before each CPU sample, why) for the budget's `cpu_flush` mode: `on`
    writes `cpu_flush_bytes` before each sample, `off` never; `auto` (the default) only when
    the inputs (`working_set_bytes`) fit: larger ones come from memory, flushed or not."""
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


@dataclass
class CacheFlush:
    """The write before each sample that leaves no input in the caches (`nbytes` of a buffer
    kept for the process: page faults paid once), or a test's `flush` callable; `seconds`
    keeps each flush's time for the overrun note. The timer calls `write(next(fills))`: the
    buffer's C `fill` with a new byte value each time (no write is skipped), so a flush runs
    no Python frame; None when nothing is flushed."""

    nbytes: int
    flush: Callable[[], None] | None = None
    seconds: list[float] = field(default_factory=list)
    write: Callable[[int], object] | None = None
    fills: Iterator[int] = field(default_factory=lambda: itertools.cycle((*range(1, 256), 0)))

    def __post_init__(self) -> None:
        if not self.nbytes:
            return
        if self.flush is not None:
            test_flush = self.flush
            self.write = lambda _value: test_flush()
            return
        import numpy as np

        if self.nbytes not in _CPU_FLUSH_BUFFERS:
            _CPU_FLUSH_BUFFERS[self.nbytes] = np.ones(self.nbytes, dtype=np.uint8)
        self.write = _CPU_FLUSH_BUFFERS[self.nbytes].fill


@dataclass(frozen=True)
class CpuTimer:
    """The `Timer` of the CPU (`time_cpu` with the real clock)."""

    def time(
        self, fn: Callable[[], object], budget: TimingBudget, fresh: FreshInputs | None = None
    ) -> TimingResult:
        return time_cpu(fn, budget, fresh=fresh)


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


def sample_floor(budget: TimingBudget) -> int:
    """The samples a CPU timing never gives up for its budget."""
    return min(CPU_MIN_SAMPLES_FLOOR, budget.min_samples)


def _repeated(fn: Callable[[], object], calls: int) -> Callable[[], object]:
    """`fn` itself for one call a sample, else a body making `calls` calls (the last output)."""
    if calls == 1:
        return fn

    def body() -> object:
        out = None
        for _ in range(calls):
            out = fn()
        return out

    return body


@dataclass
class CpuSampler:
    """The CPU samples, and the clock the budget is planned on.

    The seal of the fresh inputs is held here, by the timer's own frame's object, never by
    `FreshInputs` (which the kernel can find)."""

    fn: Callable[[], object]
    clock: Callable[[], float]
    flush: CacheFlush
    fresh: FreshInputs | None
    pairs: CpuPairs | None
    seal: Seal | None = None
    between: OtherThreads = field(default_factory=OtherThreads)
    calls: int = 1
    body: Callable[[], object] | None = None
    taken: int = 0  # samples since the sampling rounds started (`take`'s floor counts these)

    def plan_clock(self) -> float:
        """The budget's clock: honest measurement's own work (each call's new content, the
        checked calls' reference runs) is wall time the budget does not charge, so a check
        never costs the gate samples; the record's `timing.honesty` has what it took."""
        fresh = self.fresh
        return self.clock() - (fresh.refill_s + fresh.check_s if fresh is not None else 0.0)

    def repeat(self, calls: int) -> None:
        self.calls, self.body = calls, _repeated(self.fn, calls)

    def take(self, count: int, floor: int = 0, deadline: float = math.inf) -> list[float]:
        """Time `count` samples, or stop once `taken` reached `floor` and the plan clock
        `deadline`; their per-call wall seconds. The kept bindings and the seal are verified
        (`measure.bound`) before the first sample and after each, so a kernel that rebinds a
        clock is refused at the sample it did it in. One frame, the helpers bound once and
        the pairs' timing written here: this loop runs every sample."""
        fresh, seal, between, calls, clock = (
            self.fresh,
            self.seal,
            self.between,
            self.calls,
            self.clock,
        )
        body = self.body or self.fn
        pairs = self.pairs if self.pairs is not None and self.pairs.recording else None
        write, fills, flush_s = self.flush.write, self.flush.fills, self.flush.seconds
        before = after = drain = None
        if fresh is not None:
            before, after, drain = fresh.before, fresh.after, fresh.drain
        sealed = seal.kept if seal is not None and fresh is not None else ()
        intact, perf_counter = bound.intact, bound.perf_counter
        thread_time, process_time = bound.thread_time, bound.process_time
        if not intact(*sealed):
            verify_bindings(fresh, seal)  # names what changed and raises
        values: list[float] = []
        for _ in range(count):
            # `OtherThreads`' reads nest (thread, process ... process, thread): this thread's
            # time between two reads never counts as another thread's (read the other way,
            # a microsecond a sample summed to milliseconds and refused honest kernels).
            thread0 = thread_time()
            process0, wall0 = process_time(), perf_counter()
            content = before() if before is not None else None
            if write is not None:
                flushed = clock()
                write(next(fills))
                flush_s.append(clock() - flushed)
            process = process_time() - process0
            between.other_s += max(0.0, process - (thread_time() - thread0))
            between.gap_s += perf_counter() - wall0
            if pairs is None:
                t0 = clock()
                out = body()
                wall = clock() - t0
            else:
                # The kernel, then the anchors (`CpuPairs.after_kernel`), each charged its
                # on-CPU time (`on_cpu.on_cpu_seconds`, inline), run-queue reads just outside.
                raw, use_wait = pairs.rq.raw, pairs.rq.available
                one_thread = pairs.threads == 1
                timed: list[tuple[float, float]] = []
                out, anchor_started, anchor_thread0, anchor_process0 = None, 0.0, 0.0, 0.0
                for index, target in enumerate((body, *pairs.after_kernel)):
                    if index == 1:
                        anchor_started = clock()  # the anchor's cost, kept apart
                        # Other threads' CPU beside the anchors, read nested as the gap's.
                        anchor_thread0 = thread_time()
                        anchor_process0 = process_time()
                    w0 = 0 if raw is None else int(raw().split()[1])
                    c0 = thread_time()
                    t0 = clock()
                    result = target()
                    t1 = clock()
                    c1 = thread_time()
                    w1 = 0 if raw is None else int(raw().split()[1])
                    wall, cpu = t1 - t0, c1 - c0
                    charged = max(wall - (w1 - w0) * 1e-9, cpu, 1e-12) if use_wait else cpu
                    if index and one_thread:
                        # An anchor on one thread never blocks: it is charged its CPU time,
                        # so a GIL another thread held does not slow it. The time it did
                        # not run is not gated: on a VM it also holds the host's steal.
                        charged = cpu
                    timed.append((wall, charged))
                    if index == 0:
                        out = result
                beside = process_time() - anchor_process0
                between.anchors_other_s += max(0.0, beside - (thread_time() - anchor_thread0))
                (wall, on_cpu), first, second = timed[:3]
                a_wall, a_cpu = first if first[1] <= second[1] else second
                window = clock() - anchor_started
                pairs.added_s += window
                between.anchors_s += window
                pairs.kernel_s.append(on_cpu / calls)
                pairs.kernel_wall_s.append(wall / calls)
                pairs.anchor_s.append(a_cpu)
                pairs.anchor_wall_s.append(a_wall)
                if len(timed) == 4:
                    pairs.memory_s.append(timed[3][1])
            per_call = wall / calls
            if after is not None:
                # The check's copy taken, the output dropped before it is compared: a checked
                # call holds the copy and the reference's output, not the call's output too.
                key = after(out, content=content, compare=False)
                out = None
                if key is not None and drain is not None:
                    drain((key,))
            out = None
            if not intact(*sealed):
                verify_bindings(fresh, seal)
            between.kernel_s += per_call * calls
            values.append(per_call)
            self.taken += 1
            # The plan clock (`plan_clock`), inline.
            honest_s = fresh.refill_s + fresh.check_s if fresh is not None else 0.0
            if self.taken >= floor and clock() - honest_s >= deadline:
                break
        return values


@dataclass
class Spent:
    """Where a timing's budget went, for the overrun note and the result."""

    start: float
    first_call_s: float = 0.0
    estimate_samples: int = 0
    warm_samples: int = 0
    sampling_start: float = 0.0
    per_call_s: float = 0.0
    sample_wall_s: float = 0.0


def _first_call_and_warm_up(sampler: CpuSampler, budget: TimingBudget, spent: Spent) -> None:
    """The first call (load, lazy init, always checked), then flushed single-call samples until
    the warm-up deadline (5 at most for the estimate), each timed whole so the flush is priced;
    more warm-up only while the floor of samples still fits before the deadline. On a loaded
    machine a call takes many times its estimate, so the warm-up ends at a wall-clock
    deadline, never after a count of calls."""
    import numpy as np

    fresh, plan_clock = sampler.fresh, sampler.plan_clock
    content = fresh.before() if fresh is not None else None
    out = sampler.fn()
    if fresh is not None:
        key = fresh.after(out, force=True, content=content, compare=False)
        out = None
        fresh.drain(() if key is None else (key,))
    out = None
    now = plan_clock()  # one reading for the first call's end and the warm-up's start
    spent.first_call_s = now - spent.start
    deadline = spent.start + budget.max_time_s
    floor = sample_floor(budget)
    warmup_s = min(budget.warmup_ms * 1e-3, CPU_WARMUP_SHARE * budget.max_time_s)
    warm_end = now + warmup_s  # after the first call: a compile is no warm-up
    per_calls: list[float] = []
    walls: list[float] = []
    while not per_calls or (len(per_calls) < 5 and now < warm_end):
        per_calls.append(sampler.take(1)[0])
        walls.append(plan_clock() - now)
        now += walls[-1]
    spent.estimate_samples = len(per_calls)
    per_call = float(np.median(per_calls))
    sample_wall = float(np.median(walls))
    # Not with fresh inputs: calls repeated inside a sample would see the same ones.
    if not sampler.flush.nbytes and per_call < CPU_MIN_SAMPLE_S and fresh is None:
        # Timer overhead (~100 ns) matters for microsecond calls: repeat inside a sample.
        sampler.repeat(min(10_000, math.ceil(CPU_MIN_SAMPLE_S / max(per_call, 1e-9))))
        sample_wall = per_call * sampler.calls
    spent.per_call_s, spent.sample_wall_s = per_call, sample_wall
    warm_end = min(warm_end, deadline - floor * sample_wall)
    if plan_clock() < warm_end:
        spent.warm_samples += len(sampler.take(sys.maxsize, 0, warm_end))


def _sampling_rounds(sampler: CpuSampler, budget: TimingBudget, spent: Spent) -> RoundLog:
    """The adaptive rounds within what is left of the budget; a round ends at the deadline
    once the floor is in (a round planned from the rate so far must not overrun the budget
    when the machine gets busier)."""
    plan_clock = sampler.plan_clock
    deadline = spent.start + budget.max_time_s
    floor = sample_floor(budget)
    spent.sampling_start = plan_clock()
    left = max(deadline - spent.sampling_start, 0.0)
    sample_wall = spent.sample_wall_s
    fit = int(left / sample_wall) if sample_wall > 0 else budget.min_samples
    min_samples = max(min(budget.min_samples, fit), floor)
    sampling = replace(
        budget,
        max_time_s=max(left, 1e-6),
        min_samples=min_samples,
        max_samples=max(budget.max_samples, min_samples),
    )
    sampler.taken = 0

    def run_round(k: int) -> tuple[list[float], bool]:
        return sampler.take(k, floor, deadline), False

    pairs = sampler.pairs
    if pairs is not None:
        pairs.recording = True  # the anchor follows every sample from here on
    return adaptive_rounds(
        run_round,
        sampling,
        floor_samples=floor,
        clock=plan_clock,
        converge_on=None if pairs is None else pairs.ratios,
    )


def _budget_note(
    sampler: CpuSampler, budget: TimingBudget, spent: Spent, log: RoundLog, nbytes: int
) -> str:
    """The overrun note when the budget was overrun beyond its tolerance and beyond the
    kernel's own calls' need (the first, an estimate, a warm-up sample and the floor: a slow
    kernel is no condition to warn about; module docstring), else ""."""
    import numpy as np

    used = sampler.plan_clock() - spent.start
    floor = sample_floor(budget)
    own_need_s = spent.first_call_s + (2 + floor) * spent.per_call_s * sampler.calls
    if used <= (1.0 + BUDGET_TOLERANCE) * max(budget.max_time_s, own_need_s):
        return ""
    flush_s = sampler.flush.seconds
    return overrun_note(
        budget.max_time_s,
        used,
        first_call_s=spent.first_call_s,
        warmup_s=spent.sampling_start - spent.start - spent.first_call_s,
        warmup_samples=spent.estimate_samples + spent.warm_samples,
        sampling_s=spent.start + used - spent.sampling_start,
        samples=len(log.samples),
        floor=floor,
        sample_wall_s=spent.sample_wall_s,
        kernel_s=spent.per_call_s * sampler.calls,
        flush_s=float(np.median(flush_s)) if flush_s else 0.0,
        flush_bytes=nbytes,
    )


def time_cpu(
    fn: Callable[[], object],
    budget: TimingBudget,
    *,
    clock: Callable[[], float] | None = None,
    flush: Callable[[], None] | None = None,
    fresh: FreshInputs | None = None,
) -> TimingResult:
    """CPU timing (module docstring) with `clock`, `measure.bound`'s kept `perf_counter` by
    default; with `fresh`, each sample one call on inputs refilled before it, its output
    checked after the end time. The floor (`CPU_MIN_SAMPLES_FLOOR`) is never given up: with fewer
    samples the gate's Mann-Whitney test at alpha 0.01 could never reject (4 against 4 give
    p >= 1/70). `clock` and `flush` (called before each sample instead of writing the flush
    buffer) let tests check the plan against a simulated clock."""
    clock = clock or bound.perf_counter
    allocator = steady_allocator()
    t_start = clock()
    device = f"cpu ({cpu_model_name()})"
    threads = torch_threads()
    nbytes, flush_reason = cpu_flush_decision(budget)
    cache_flush = CacheFlush(nbytes, flush)  # the budget starts after its one allocation
    # With fresh inputs, the kernel on the timed tensors (the `FreshInputs.call` the seal holds,
    # bound now: C code between the timer and the kernel).
    timed = functools.partial(fresh.kernel, *fresh.storage) if fresh is not None else fn
    sampler = CpuSampler(timed, clock, cache_flush, fresh, None)
    spent = Spent(start=sampler.plan_clock())
    sampler.pairs = cpu_pairs(budget)
    made = () if sampler.pairs is None else anchor_state(sampler.pairs)  # a local: see Seal
    sampler.seal = fresh.seal() if fresh is not None else None
    try:
        _first_call_and_warm_up(sampler, budget, spent)
        monitor = CpuLoadMonitor(threads or 1)
        sampler.between.reset()
        log = _sampling_rounds(sampler, budget, spent)
        load = monitor.stop()
        if fresh is not None:
            fresh.finish()
        idle_work = anchors_changed(sampler.pairs, made) or sampler.between.failure(threads)
        if idle_work is not None:
            raise DishonestTiming(idle_work)
    except KernelproError:
        raise
    except Exception as exc:
        raise kernel_failed(device, "timing", exc) from exc
    assert log.stats is not None
    wall_s = clock() - t_start
    pairs = sampler.pairs
    return TimingResult(
        samples_s=tuple(log.samples),
        stats=log.stats,
        method="cpu-perf-counter",
        device=device,
        stop_reason=log.stop_reason,
        wall_s=wall_s,
        warmup_runs=1 + spent.estimate_samples + spent.warm_samples * sampler.calls,
        throttled_samples=0,
        clocks=None,
        flushed_l2=bool(nbytes),
        calls_per_sample=sampler.calls,
        flush_bytes=nbytes,
        rounds=log.rounds,
        budget=asdict(budget),
        threads=threads,
        cpu_load=load.to_dict(),
        flush_reason=flush_reason,
        budget_note=_budget_note(sampler, budget, spent, log, nbytes),
        anchor=None if pairs is None else {**pairs.summary(), "allocator": allocator},
        honesty=None if fresh is None else {**fresh.to_dict(), **sampler.between.to_dict()},
    )


bound.keep_module(sys.modules[__name__])
