"""Time one kernel: warm-up, cache flush before every sample, adaptive sample count.

GPU (the way `triton.testing.do_bench` and nvbench do it): one call to load/compile, an
estimate of the per-call time from 5 flushed calls, warm-up for `warmup_ms`, then rounds of
samples. Each sample is: write a buffer of twice the L2 size (evicting the kernel's inputs),
record a CUDA event, call the kernel, record a second event; a round enqueues many samples
and synchronizes once, behind a short `torch.cuda._sleep` so the CPU is ahead of the GPU and
the events bracket GPU work only, not Python launch overhead. After each round the 95%
bootstrap CI of the median decides: stop when its relative half-width is under the target,
or the time budget is spent, or `max_samples` is reached. NVML clocks and clock-event reasons
are read while each round runs; samples of a round with a throttle reason are counted.
CUDA-graph mode captures k calls in one graph and times replays (per call = replay / k).

CPU: `time.perf_counter` around each call and the same adaptive rounds and statistics, with
three differences:
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

import gc
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from ..errors import KernelproConfigError, KernelproError
from .stats import SampleStats, summarize

DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024  # triton's buffer, used when the L2/LLC size is unknown
MAX_ROUND_S = 0.25  # longest planned round: bounds how coarse the throttle attribution gets
MAX_ROUND_SAMPLES = 1000  # events allocated per round
PREROLL_CAP_S = 0.05  # longest GPU sleep put ahead of a round
GRAPH_TARGET_S = 5e-4  # a graph replay should last about this long (k calls per replay)
CPU_MIN_SAMPLE_S = 20e-6  # unflushed CPU samples repeat the call until a sample lasts this
CPU_WARMUP_SHARE = 0.2  # CPU warm-up takes at most this share of the time budget
CPU_MIN_SAMPLES_FLOOR = 5  # CPU: fewer samples than this are never taken, budget or not
CPU_FLUSH_MODES = ("auto", "on", "off")
BUDGET_TOLERANCE = 0.2  # CPU: the time budget is honoured within this fraction


@dataclass(frozen=True)
class TimingBudget:
    """How long and how precisely to time one kernel (see the module docstring)."""

    warmup_ms: float = 25.0  # warm-up time before sampling
    max_time_s: float = 2.0  # sampling budget per kernel; min_samples is honoured beyond it
    min_samples: int = 20
    max_samples: int = 5000
    target_rel_ci: float = 0.005  # stop when the median's CI half-width / median is below
    flush_l2: bool = True  # GPU: L2; CPU: last-level cache
    cuda_graph: bool = False  # time CUDA-graph replays (launch-bound kernels)
    flush_bytes: int | None = None  # None: twice the L2 (GPU) or last-level cache (CPU)
    sync_per_sample: bool = False  # GPU: synchronize after every sample (GPU idles between)
    cpu_flush: str = "auto"  # CPU cache flush: auto | on | off (see the module docstring)
    working_set_bytes: int | None = None  # bytes of the kernel's inputs (cpu_flush=auto)

    def __post_init__(self) -> None:
        problems = []
        if not self.warmup_ms >= 0:
            problems.append(f"warmup_ms={self.warmup_ms!r} (must be >= 0)")
        if not self.max_time_s > 0:
            problems.append(f"max_time_s={self.max_time_s!r} (must be > 0)")
        if not 1 <= self.min_samples <= self.max_samples:
            problems.append(
                f"min_samples={self.min_samples!r}, max_samples={self.max_samples!r} "
                "(need 1 <= min_samples <= max_samples)"
            )
        if not self.target_rel_ci >= 0:
            problems.append(f"target_rel_ci={self.target_rel_ci!r} (must be >= 0)")
        if self.flush_bytes is not None and self.flush_bytes <= 0:
            problems.append(f"flush_bytes={self.flush_bytes!r} (must be > 0 or None)")
        if self.cpu_flush not in CPU_FLUSH_MODES:
            problems.append(
                f"cpu_flush={self.cpu_flush!r} (use one of {', '.join(CPU_FLUSH_MODES)})"
            )
        if problems:
            raise KernelproConfigError("invalid TimingBudget: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict."""
        return asdict(self)


@dataclass(frozen=True)
class TimingResult:
    """Per-call times of one kernel and how they were taken."""

    samples_s: tuple[float, ...]
    stats: SampleStats
    method: str  # "cuda-events" | "cuda-graph" | "cpu-perf-counter"
    device: str  # "NVIDIA H200" | "cpu (<model name>)"
    stop_reason: str  # "converged" | "time-budget" | "max-samples"
    wall_s: float  # everything time_kernel spent, warm-up and statistics included
    warmup_runs: int  # calls made before the first sample (first call, estimate, warm-up)
    throttled_samples: int  # samples in rounds where NVML reported throttling (0 on CPU)
    clocks: dict[str, Any] | None  # clocks.summarize_readings(); None without NVML or on CPU
    flushed_l2: bool
    calls_per_sample: int = 1  # > 1 for CUDA graphs and very fast unflushed CPU calls
    flush_bytes: int = 0
    rounds: int = 0
    budget: dict[str, Any] = field(default_factory=dict)
    threads: int | None = None  # CPU: torch intra-op threads while timing
    cpu_load: dict[str, Any] | None = None  # CPU: cpuload.CpuLoad.to_dict() of the sampling
    flush_reason: str = ""  # CPU: why the cache was (not) flushed
    budget_note: str = ""  # CPU: why the time budget could not be honoured ("" when it was)

    @property
    def oversubscribed(self) -> bool:
        """True when the CPU was oversubscribed while the samples were taken."""
        return bool((self.cpu_load or {}).get("oversubscribed"))

    @property
    def median_s(self) -> float:
        """The median per-call time (the number reports and the gate use)."""
        return self.stats.median_s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict including the raw samples and the statistics."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["samples_s"] = list(self.samples_s)
        data["stats"] = self.stats.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimingResult:
        """Inverse of `to_dict` (a stored result or baseline back into an object)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["samples_s"] = tuple(float(x) for x in values["samples_s"])
        values["stats"] = SampleStats.from_dict(values["stats"])
        return cls(**values)


def parse_device(device: str) -> tuple[str, int | None]:
    """`"cpu"` → ("cpu", None); `"cuda"` → ("cuda", None); `"cuda:1"` → ("cuda", 1)."""
    kind, _, index = str(device).partition(":")
    if kind == "cpu" and not index:
        return "cpu", None
    if kind == "cuda" and (not index or index.isdigit()):
        return "cuda", int(index) if index else None
    raise KernelproConfigError(
        f"unknown timing device {device!r}: use 'cpu', 'cuda' or 'cuda:<index>'"
    )


def time_kernel(
    fn: Callable[[], object], *, device: str, budget: TimingBudget | None = None
) -> TimingResult:
    """Time `fn()` (a kernel launch on pre-built inputs) on `device` and summarize.

    Raises `KernelproError` (with the original exception chained) if `fn` raises, if CUDA is
    requested but unavailable, or if CUDA-graph capture fails.
    """
    budget = budget or TimingBudget()
    kind, index = parse_device(device)
    if kind == "cpu":
        return _time_cpu(fn, budget)
    from .timing_cuda import time_cuda

    return time_cuda(fn, index, budget)


@dataclass
class RoundLog:
    """What the adaptive loop collected: samples, per-sample throttle flags, rounds."""

    samples: list[float] = field(default_factory=list)
    throttled: list[bool] = field(default_factory=list)
    rounds: int = 0
    stats: SampleStats | None = None
    stop_reason: str = ""


def adaptive_rounds(
    run_round: Callable[[int], tuple[list[float], bool]],
    budget: TimingBudget,
    *,
    floor_samples: int | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> RoundLog:
    """Run rounds of `run_round(k)` → (k per-call times, throttled?) until a stop rule fires.

    The first round takes `min_samples`; each later one doubles the count (bounded by the
    time left, `max_samples`, `MAX_ROUND_SAMPLES` and `MAX_ROUND_S`), so the CI check, which
    costs O(n) per bootstrap row, runs only O(log n) times. The wall time per sample is
    measured over the rounds so far, statistics included. With `floor_samples`, the budget
    wins over `min_samples` once that many samples are in (the CPU's budget rule).
    """
    log = RoundLog()
    start = clock()
    want = budget.min_samples
    while True:
        want = max(1, min(want, budget.max_samples - len(log.samples)))
        gc_was_enabled = gc.isenabled()
        gc.disable()  # a collection inside a CPU sample would be timed
        try:
            values, throttled = run_round(want)
        finally:
            if gc_was_enabled:
                gc.enable()
        log.samples.extend(values)
        log.throttled.extend([throttled] * len(values))
        log.rounds += 1
        n = len(log.samples)
        elapsed = clock() - start
        out_of_time = floor_samples is not None and n >= floor_samples
        out_of_time = out_of_time and elapsed >= budget.max_time_s
        if n >= budget.min_samples or out_of_time:
            log.stats = summarize(log.samples)
            if log.stats.rel_ci_halfwidth <= budget.target_rel_ci:
                log.stop_reason = "converged"
            elif n >= budget.max_samples:
                log.stop_reason = "max-samples"
            elif elapsed >= budget.max_time_s:
                log.stop_reason = "time-budget"
            if log.stop_reason:
                return log
            per_sample_s = elapsed / n
            left = budget.max_time_s - elapsed
            want = min(n, int(left / per_sample_s), MAX_ROUND_SAMPLES)
            want = min(want, max(1, int(MAX_ROUND_S / max(per_sample_s, 1e-9))))
        else:
            want = budget.min_samples - n


def flush_size(budget: TimingBudget, cache_bytes: int | None) -> int:
    """Bytes to write before each sample: the budget's, else twice the cache, else 256 MiB."""
    if budget.flush_bytes is not None:
        return int(budget.flush_bytes)
    if cache_bytes and cache_bytes > 0:
        return 2 * int(cache_bytes)
    return DEFAULT_FLUSH_BYTES


def warmup_count(warmup_ms: float, per_call_s: float) -> int:
    """Calls that fill `warmup_ms`, at least 1 (do_bench's `max(1, warmup / estimate)`)."""
    if per_call_s <= 0:
        return 1
    return max(1, min(100_000, math.ceil(warmup_ms * 1e-3 / per_call_s)))


def kernel_failed(device: str, phase: str, exc: BaseException) -> KernelproError:
    """The error for a kernel that raised while being timed."""
    return KernelproError(
        f"the kernel raised {type(exc).__name__} during {phase} on {device}: {exc}. "
        "Timing runs only after the correctness check passed, so this points at state the "
        "kernel keeps between calls (or an asynchronous CUDA error from earlier work)."
    )


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


def _time_cpu(fn: Callable[[], object], budget: TimingBudget) -> TimingResult:
    return time_cpu(fn, budget)


def time_cpu(
    fn: Callable[[], object],
    budget: TimingBudget,
    *,
    clock: Callable[[], float] = time.perf_counter,
    flush: Callable[[], None] | None = None,
) -> TimingResult:
    """CPU timing with `clock` (`time.perf_counter`; see the module docstring).

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

    from .cpuload import CpuLoadMonitor, torch_threads

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

    def sample(calls: int) -> float:
        if flushing:
            do_flush()
        t0 = clock()
        for _ in range(calls):
            fn()
        return (clock() - t0) / calls

    try:
        fn()
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
        if not flushing and per_call < CPU_MIN_SAMPLE_S:
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
        log = adaptive_rounds(run_round, sampling, floor_samples=floor, clock=clock)
        load = monitor.stop()
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
    )
