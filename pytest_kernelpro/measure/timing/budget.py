"""What every timer shares: the budget, the result, the adaptive rounds and their stop rule,
and the statistics of a set of samples.

`TimingBudget` says how long and how precisely to time one kernel; `adaptive_rounds` takes
samples in rounds until the median's 95% bootstrap CI (`summarize`) is within the target
(nvbench's "stdrel", on the median: robust against the outliers GPU and shared-runner
timings always have), the budget is spent or `max_samples` is reached; `TimingResult` is what
a timer returns, `Timer` the interface the CPU and CUDA timers implement.
"""

from __future__ import annotations

import gc
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from pytest_kernelpro.errors import KernelproConfigError, KernelproError
from pytest_kernelpro.measure import bound

DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024  # triton's buffer, used when the L2/LLC size is unknown
MAX_ROUND_S = 0.25  # longest planned round: bounds how coarse the throttle attribution gets
MAX_ROUND_SAMPLES = 1000  # events allocated per round
CPU_MIN_SAMPLE_S = 20e-6  # unflushed CPU samples repeat the call until a sample lasts this
CPU_WARMUP_SHARE = 0.2  # CPU warm-up takes at most this share of the time budget
CPU_MIN_SAMPLES_FLOOR = 5  # CPU: fewer samples than this are never taken, budget or not
CPU_FLUSH_MODES = ("auto", "on", "off")
CLOCK_ANCHOR_MODES = ("off", "on")  # GPU: "on" pairs each sample of a capped kernel with the anchor
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
    clock_anchor: str = "off"  # GPU: "on" pairs a capped kernel's samples with the anchor
    # GPU: "current": work left on another stream fails the kernel; "any": every sample ends
    # with a device-wide synchronize (its real cost, host launch time included; streams.py).
    streams: str = "current"

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
        if self.clock_anchor not in CLOCK_ANCHOR_MODES:
            problems.append(
                f"clock_anchor={self.clock_anchor!r} (use one of {', '.join(CLOCK_ANCHOR_MODES)})"
            )
        if self.streams not in ("current", "any"):
            problems.append(f"streams={self.streams!r} (use current or any)")
        if problems:
            raise KernelproConfigError("invalid TimingBudget: " + "; ".join(problems))


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
    cpu_load: dict[str, Any] | None = None  # CPU: cpu.CpuLoad.to_dict() of the sampling
    flush_reason: str = ""  # CPU: why the cache was (not) flushed
    budget_note: str = ""  # CPU: why the time budget could not be honoured ("" when it was)
    anchor: dict[str, Any] | None = None  # GPU: the anchor's pairs (anchor.py), when anchored
    # GPU: half or more of the NVML readings during the warm-up had a clock-lowering reason
    # (what decides anchoring, anchor.py); None without NVML or on the CPU.
    warmup_throttled: bool | None = None
    # What was done so no call could look faster than its work (fresh inputs, checked
    # outputs, device-wide checked calls): `fresh_inputs.FreshInputs.to_dict` and
    # `streams.EscapeProbe.to_dict`; None when timed without them.
    honesty: dict[str, Any] | None = None

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


class Timer(Protocol):
    """Times `fn()` (a kernel launch on pre-built inputs) under a budget, on one device."""

    def time(
        self, fn: Callable[[], object], budget: TimingBudget, fresh: Any = None
    ) -> TimingResult: ...


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
    clock: Callable[[], float] = bound.perf_counter,
    converge_on: Callable[[], list[float]] | None = None,
) -> RoundLog:
    """Run rounds of `run_round(k)` → (k per-call times, throttled?) until a stop rule fires.

    The first round takes `min_samples`; each later one doubles the count (bounded by the
    time left, `max_samples`, `MAX_ROUND_SAMPLES` and `MAX_ROUND_S`), so the CI check, O(n)
    per bootstrap row, runs only O(log n) times. `floor_samples`: the budget wins over
    `min_samples` once that many samples are in (the CPU's rule). `converge_on`: the values
    whose CI stops the rounds (an anchored timing's kernel / anchor ratios), not the samples'.
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
            rel_ci = log.stats.rel_ci_halfwidth
            if converge_on is not None:
                rel_ci = summarize(converge_on()).rel_ci_halfwidth
            if rel_ci <= budget.target_rel_ci:
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


def kernel_failed(device: str, phase: str, exc: BaseException) -> KernelproError:
    """The error for a kernel that raised while being timed."""
    return KernelproError(
        f"the kernel raised {type(exc).__name__} during {phase} on {device}: {exc}. "
        "Timing runs only after the correctness check passed, so this points at state the "
        "kernel keeps between calls (or an asynchronous CUDA error from earlier work)."
    )


# ----- statistics of a set of samples -----

CI_LEVEL = 0.95  # two-sided level of the bootstrap interval of the median


@dataclass(frozen=True)
class SampleStats:
    """Statistics of one set of per-call times, in seconds.

    Quartiles use numpy's default ("linear") interpolation. `ci_low_s`/`ci_high_s` bound the
    median with 95% confidence (percentile bootstrap); `rel_ci_halfwidth` is that interval's
    half-width over the median. `stdev_s` is the sample standard deviation (ddof=1, 0 for one
    sample) and `rel_stdev` its ratio to the mean: nvbench's "stdev/relative".
    """

    n: int
    median_s: float
    mean_s: float
    min_s: float
    max_s: float
    q1_s: float
    q3_s: float
    iqr_s: float
    ci_low_s: float
    ci_high_s: float
    rel_ci_halfwidth: float
    stdev_s: float = 0.0
    rel_stdev: float = 0.0
    n_boot: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-safe dict; the one possible non-finite value (`rel_ci_halfwidth` of an
        all-zero-median set with spread) becomes None."""
        data = asdict(self)
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in data.items()
        }


def bootstrap_median_ci(
    sorted_samples: Any, *, seed: int = 0, n_boot: int = 1000, level: float = CI_LEVEL
) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of already sorted samples.

    Because the samples are sorted, the median of a resample `x[idx]` is `x` at the median of
    the resampled indices: partitioning integer index rows replaces gathering and sorting
    floats (about 6x faster at n=5000, identical result), which keeps the check cheap enough
    to run after every sampling round.
    """
    import numpy as np

    x = np.asarray(sorted_samples, dtype=np.float64)
    n = int(x.size)
    if n == 1 or n_boot <= 0:  # no resampling possible or wanted: a zero-width interval
        mid = float(np.median(x))
        return mid, mid
    rng = np.random.default_rng(seed)
    lo_k, hi_k = (n - 1) // 2, n // 2
    # Rows of resampled indices, in chunks so n=5000 x n_boot=1000 stays ~20 MB.
    medians = np.empty(n_boot, dtype=np.float64)
    chunk = max(1, 4_000_000 // n)
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        idx = rng.integers(0, n, size=(rows, n), dtype=np.int32)
        part = np.partition(idx, (lo_k, hi_k), axis=1)
        medians[start : start + rows] = 0.5 * (x[part[:, lo_k]] + x[part[:, hi_k]])
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(medians, [alpha, 1.0 - alpha])
    return float(low), float(high)


def summarize(samples_s: Sequence[float], *, seed: int = 0, n_boot: int = 1000) -> SampleStats:
    """Summarize per-call times (seconds): median, mean, extremes, quartiles, IQR, 95% CI.

    Deterministic for a given `seed`. Raises `KernelproError` on an empty set or a
    non-finite or negative sample (a timer bug, never a real time).
    """
    import numpy as np

    x = np.sort(np.asarray(list(samples_s), dtype=np.float64))
    if x.size == 0:
        raise KernelproError(
            "summarize() got no timing samples; the timer must record at least one call"
        )
    if not np.all(np.isfinite(x)) or x[0] < 0:
        bad = x[~np.isfinite(x) | (x < 0)][:3].tolist()
        raise KernelproError(
            f"summarize() got invalid timing samples {bad}: times must be finite and >= 0"
        )
    n = int(x.size)
    median = float(np.median(x))
    mean = float(np.mean(x))
    q1, q3 = map(float, np.percentile(x, [25.0, 75.0]))
    ci_low, ci_high = bootstrap_median_ci(x, seed=seed, n_boot=n_boot)
    # The percentile interval can, for tiny n, sit off the median; widen it to include it so
    # "the CI contains the median" always holds.
    ci_low, ci_high = min(ci_low, median), max(ci_high, median)
    if median > 0:
        rel_ci = (ci_high - ci_low) / 2.0 / median
    else:
        rel_ci = 0.0 if ci_high == ci_low else math.inf
    stdev = float(np.std(x, ddof=1)) if n > 1 else 0.0
    return SampleStats(
        n=n,
        median_s=median,
        mean_s=mean,
        min_s=float(x[0]),
        max_s=float(x[-1]),
        q1_s=q1,
        q3_s=q3,
        iqr_s=q3 - q1,
        ci_low_s=ci_low,
        ci_high_s=ci_high,
        rel_ci_halfwidth=float(rel_ci),
        stdev_s=stdev,
        rel_stdev=stdev / mean if mean > 0 else 0.0,
        n_boot=n_boot if n > 1 else 0,
    )


bound.keep_module(sys.modules[__name__])
