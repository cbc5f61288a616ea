"""The CUDA timer: events, L2 flush, sleep pre-roll, NVML clocks, CUDA graphs.

The way `triton.testing.do_bench` and nvbench do it): one call to load/compile, an
estimate of the per-call time from 5 flushed calls, warm-up for `warmup_ms`, then rounds of
samples. Each sample is: write a buffer of twice the L2 size (evicting the kernel's inputs),
record a CUDA event, call the kernel, record a second event; a round enqueues many samples
and synchronizes once, behind a short `torch.cuda._sleep` so the CPU is ahead of the GPU and
the events bracket GPU work only, not Python launch overhead. After each round the 95%
bootstrap CI of the median decides: stop when its relative half-width is under the target,
or the time budget is spent, or `max_samples` is reached. NVML clocks and clock-event reasons
are read while each round runs; samples of a round with a throttle reason are counted.
CUDA-graph mode captures k calls in one graph and times replays (per call = replay / k).
NVML is read while the warm-up runs too: with `clock_anchor="on"`, a kernel whose warm-up ran
mostly under a clock limit (the power cap) is timed in pairs (`anchor.py`): every sample is
followed in its round by a flush and the anchor GEMM, each bracketed by events, so the gate can
compare kernel / anchor per pair, which cancels the clock the cap allowed at that moment.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError, KernelproError
from pytest_kernelpro.measure import bound
from pytest_kernelpro.measure.timing.anchor import (
    anchor_launch,
    anchor_name,
    anchored_min_samples,
    summarize_pairs,
    warmup_capped,
)
from pytest_kernelpro.measure.timing.budget import (
    GRAPH_TARGET_S,
    PREROLL_CAP_S,
    RoundLog,
    TimingBudget,
    TimingResult,
    adaptive_rounds,
    flush_size,
    kernel_failed,
    warmup_count,
)
from pytest_kernelpro.measure.timing.fresh_inputs import (
    DishonestTiming,
    FreshInputs,
    verify_bindings,
)
from pytest_kernelpro.measure.timing.streams import (
    MATCHED_WAIT_MAX_S,
    EscapeProbe,
    StreamWatch,
    escape_message,
)

# NVML readings while a round runs, every 10 ms: their mean SM clock and reasons decide
# whether a comparison is clock-limited (gate/verdict_basis.py). Reading every 2 ms (to scale
# times by the clock) did not make the mean clock follow the kernel's time on the H200.
CLOCK_READ_INTERVAL_S = 0.01
_SLEEP_CYCLES_PER_S: dict[int, float] = {}  # torch.cuda._sleep calibration per device
# One flush buffer per (device, size), kept for the process like triton's cache buffer, so
# each kernel does not pay an allocation.
_FLUSH_BUFFERS: dict[tuple[int, int], Any] = {}


def _flush_buffer(torch: Any, idx: int, nbytes: int) -> Any:
    key = (idx, nbytes)
    if key not in _FLUSH_BUFFERS:
        _FLUSH_BUFFERS[key] = torch.empty(nbytes // 4, dtype=torch.int32, device=f"cuda:{idx}")
    return _FLUSH_BUFFERS[key]


def flush_buffers_bytes() -> int:
    """Bytes the session keeps in flush buffers (an item's memory report leaves them out)."""
    return sum(int(b.numel()) * int(b.element_size()) for b in _FLUSH_BUFFERS.values())


def _sleep_cycles_per_s(torch: Any, index: int) -> float | None:
    """Cycles of `torch.cuda._sleep` per second on this device (measured once), or None."""
    if index in _SLEEP_CYCLES_PER_S:
        return _SLEEP_CYCLES_PER_S[index]
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    cycles = 1_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sleep(cycles // 10)  # load the sleep kernel's module outside the measurement
    start.record()
    sleep(cycles)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) * 1e-3
    _SLEEP_CYCLES_PER_S[index] = cycles / seconds if seconds > 0 else 0.0
    return _SLEEP_CYCLES_PER_S[index] or None


@dataclass(frozen=True)
class CudaTimer:
    """The `Timer` of one CUDA device (`index` None: the current one)."""

    index: int | None = None

    def time(
        self, fn: Callable[[], object], budget: TimingBudget, fresh: FreshInputs | None = None
    ) -> TimingResult:
        return time_cuda(fn, self.index, budget, fresh)


def time_cuda(
    fn: Callable[[], object],
    index: int | None,
    budget: TimingBudget,
    fresh: FreshInputs | None = None,
) -> TimingResult:
    """CUDA timing with events (see the module docstring); with `fresh`, `fresh.call` on
    inputs refilled before every sample, its outputs checked (`fresh_inputs.py`)."""
    import torch

    t_start = bound.perf_counter()
    if not torch.cuda.is_available():
        raise KernelproError(
            f"timing device 'cuda' requested but torch.cuda.is_available() is False "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); run on a machine "
            "with an NVIDIA GPU or time on 'cpu'"
        )
    idx = torch.cuda.current_device() if index is None else index
    if idx >= torch.cuda.device_count():
        raise KernelproConfigError(
            f"timing device 'cuda:{idx}' does not exist: this machine shows "
            f"{torch.cuda.device_count()} CUDA device(s) (CUDA_VISIBLE_DEVICES applies)"
        )
    from pytest_kernelpro.measure.clocks import open_monitor, summarize_readings

    with torch.cuda.device(idx):
        props = torch.cuda.get_device_properties(idx)
        monitor = open_monitor(idx, str(getattr(props, "uuid", "") or "") or None)
        watch = StreamWatch().install(torch)
        try:
            result = _time_cuda_on(torch, fn, idx, props, budget, monitor, fresh, watch)
        finally:
            watch.uninstall()
            if monitor is not None:
                monitor.close()
    log, extra = result
    assert log.stats is not None
    return TimingResult(
        samples_s=tuple(log.samples),
        stats=log.stats,
        method="cuda-graph" if budget.cuda_graph else "cuda-events",
        device=str(props.name),
        stop_reason=log.stop_reason,
        wall_s=bound.perf_counter() - t_start,
        warmup_runs=extra["warmup_runs"],
        throttled_samples=sum(log.throttled),
        clocks=summarize_readings(extra["readings"]),
        anchor=extra["anchor"],
        warmup_throttled=extra["warmup_throttled"],
        flushed_l2=extra["flush_bytes"] > 0,
        calls_per_sample=extra["calls_per_sample"],
        flush_bytes=extra["flush_bytes"],
        rounds=log.rounds,
        budget=budget.to_dict(),
        honesty=extra["honesty"],
    )


def _time_cuda_on(
    torch: Any,
    fn: Callable[[], object],
    idx: int,
    props: Any,
    budget: TimingBudget,
    monitor: Any,
    fresh: FreshInputs | None = None,
    watch: StreamWatch | None = None,
) -> tuple[RoundLog, dict[str, Any]]:
    """The CUDA measurement proper, on the current device; returns the log and side facts.
    `watch`: an installed `StreamWatch` (None: switches are not recorded)."""
    watch = watch if watch is not None else StreamWatch()
    device = f"cuda:{idx} ({props.name})"
    nbytes = flush_size(budget, getattr(props, "L2_cache_size", None)) if budget.flush_l2 else 0
    buf = _flush_buffer(torch, idx, nbytes) if nbytes else None
    # Events of the C type on the stream current now (measure.bound: a kernel that patches
    # torch.cuda.Event cannot change them), and the checked calls that see work escaping it.
    timed_stream = torch.cuda.current_stream()
    events = bound.CudaEvents(torch, timed_stream)
    probe = EscapeProbe(events)
    watch.watch(timed_stream.stream_id)

    def event(enable_timing: bool = True) -> Any:
        return events.event()

    if fresh is not None:
        fn = fresh.call
        fresh.defer = True  # checked copies compared after each round (`drain`); sealed
    seal = fresh.seal() if fresh is not None else None  # a local: no object the kernel finds
    # streams="any": the kernel's work may still run on its own streams when it returns, so
    # its outputs are read after a device-wide synchronize (the default reads them on the
    # timed stream right after the end event: what is not done there escaped it).
    own_streams = budget.streams == "any"

    def observe(out: Any, force: bool = False) -> None:
        if fresh is None or out is None:  # a graph replay returns None
            return
        if own_streams:
            events.synchronize_device()
        fresh.after(out, force=force)

    readings: list[Any] = []
    body: Callable[[], object] = fn
    calls = 1
    graph = None

    def flush() -> None:
        if buf is not None:
            buf.zero_()

    anchor: Callable[[], object] | None = None  # set when the warm-up ran clock-limited
    anchor_s: list[float] = []  # the anchor's time after each sample (anchored rounds)
    sampled: list[float] = []  # the samples of the rounds so far

    def enqueue(k: int, sleep_cycles: int = 0, sync_each: bool = False) -> tuple[list, list]:
        """Enqueue k samples (flush, event, body, event), each followed by the anchor's own
        flush and bracketed anchor call when anchored; returns both lists of event pairs."""
        pairs = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(k)]
        marks = [] if anchor is None else [(event(enable_timing=True), event(enable_timing=True)) for _ in range(k)]  # fmt: skip
        if sleep_cycles and not sync_each:
            torch.cuda._sleep(sleep_cycles)  # keeps the GPU busy while the CPU enqueues
        for i, (start, end) in enumerate(pairs):
            if sleep_cycles and sync_each:
                torch.cuda._sleep(sleep_cycles)
            verify_bindings(fresh, seal)  # the kept bindings before and after every sample
            if fresh is not None:
                fresh.before()  # enqueued ahead of the flush and the start event: not timed
            flush()
            events.record(start)
            out = body()
            events.record(end)
            observe(out)
            out = None
            verify_bindings(fresh, seal)
            if anchor is not None:
                flush()
                events.record(marks[i][0])
                anchor()
                events.record(marks[i][1])
            if sync_each:
                if monitor is not None and i == k // 2:
                    readings.append(monitor.read())
                (marks[i] if marks else (start, end))[1].synchronize()
        return pairs, marks

    def elapsed(enqueued: tuple[list, list]) -> list[float]:
        pairs, marks = enqueued
        (marks or pairs)[-1][1].synchronize()
        anchor_s.extend(events.elapsed_s(s, e) for s, e in marks)
        return [events.elapsed_s(s, e) / calls for s, e in pairs]

    def gpu_wait(seconds: float) -> Callable[[], object] | None:
        """A GPU sleep of about `seconds` on the timed stream (the calibration's stand-in for
        a call), or None without the sleep's calibration."""
        if seconds > MATCHED_WAIT_MAX_S:
            return None
        cycles = int(seconds * (_SLEEP_CYCLES_PER_S.get(idx) or 0.0))
        if cycles <= 0:
            return None
        return lambda: torch.cuda._sleep(cycles)

    def checked(k: int) -> list[float]:
        """k checked calls (streams.EscapeProbe): per-call device-wide times."""
        times = []
        for _ in range(k):
            if fresh is not None:
                fresh.before()
            flush()
            times.append(probe.checked_call(body, observe, own_streams=own_streams) / calls)
        return times

    phase = "the first call"
    runs = 0  # calls of fn made before sampling (reported as warm-up runs)
    try:
        if fresh is not None:
            fresh.before()
        out = fn()
        observe(out, force=True)
        out = None
        events.synchronize_device()
        phase = "the estimate"
        flush_pairs = []
        for _ in range(3):
            start, end = event(enable_timing=True), event(enable_timing=True)
            events.record(start)
            flush()
            events.record(end)
            flush_pairs.append((start, end))
        flush_s = sorted(elapsed((flush_pairs, [])))[1] if buf is not None else 0.0
        t0 = bound.perf_counter()
        estimate = enqueue(5)
        host_s = (bound.perf_counter() - t0) / 5  # CPU time to enqueue one sample
        per_call = sorted(elapsed(estimate))[2]
        runs = 6
        if budget.cuda_graph:
            phase = "CUDA-graph capture"
            calls = max(1, min(1000, math.ceil(GRAPH_TARGET_S / max(per_call, 1e-7))))
            watch.active = False  # the capture's own side stream is ours
            graph = _capture(torch, fn, calls)
            watch.active = True
            body = graph.replay
            per_call = sorted(elapsed(enqueue(3)))[1]  # one replay, divided by calls
            runs += 3 + 3 * calls  # side-stream warm-up + the replays just timed
        phase = "warm-up"
        n_warm = warmup_count(budget.warmup_ms, flush_s + per_call * calls)
        for _ in range(n_warm):
            # Fresh inputs before every call, as for every other call (and the CPU timer's
            # warm-up): on unchanged inputs a memo by `_version` hits, and the warm-up (and
            # its clock readings) would see no work.
            if fresh is not None:
                fresh.before()
            flush()
            body()
        warm_flags = _read_while_busy(torch, monitor)
        events.synchronize_device()
        runs += n_warm * calls
        phase = "the checked calls (device work outside the timed stream)"
        cycles_per_s = _sleep_cycles_per_s(torch, idx) or 0.0
        probe.calibrate(gpu_wait(per_call * calls))
        checked(1)  # and one after every round of samples
        sampling = budget
        if warmup_capped(budget.clock_anchor, warm_flags):
            phase = "the clock anchor's first call"
            anchor = anchor_launch(torch, idx)
            for _ in range(2):  # load its module (and cuBLAS's choice for it) before sampling
                anchor()
            events.synchronize_device()
            host_s *= 2  # a pair enqueues a second flush and the anchor
            sampling = replace(
                budget,
                min_samples=anchored_min_samples(budget.min_samples, budget.max_samples),
            )

        def run_round(k: int) -> tuple[list[float], bool]:
            seen_before = len(readings)
            if budget.streams == "any":  # every sample a checked call: its real cost
                times = checked(k)
                sampled.extend(times)
                return times, False
            # Keep the GPU busy until the CPU has enqueued the round: one sample's enqueue
            # time, plus what the CPU loses per sample when enqueueing is slower than running.
            # The whole round's enqueue time, with margin, not only the shortfall per sample:
            # Python's enqueue time jitters, and a GPU that catches up with the CPU records
            # the start event early, so launch latency lands inside a sample (seen on the
            # H200 for a 4 us kernel: medians of 6 and 11 us in two runs vs do_bench's 5).
            ahead_s = host_s if budget.sync_per_sample else host_s + 1.5 * k * host_s
            sleep = int(min(PREROLL_CAP_S, ahead_s) * cycles_per_s)
            enqueued = enqueue(k, sleep, budget.sync_per_sample)
            last = (enqueued[1] or enqueued[0])[-1][1]
            if monitor is not None and not budget.sync_per_sample:
                readings.append(monitor.read())  # the GPU is busy with the round now
                next_read = bound.perf_counter() + CLOCK_READ_INTERVAL_S
                while not last.query():
                    if bound.perf_counter() >= next_read:
                        readings.append(monitor.read())
                        next_read += CLOCK_READ_INTERVAL_S
                    time.sleep(0.0005)
            times = elapsed(enqueued)
            sampled.extend(times)
            checked(1)  # one checked call per round, after it (not a sample)
            if fresh is not None:
                fresh.drain()  # the round's checked outputs, after its last event
            return times, any(r.throttled for r in readings[seen_before:])

        phase = "sampling"

        # An anchored timing stops on the CI of the ratios the gate compares: the kernel's own
        # time is noisier in paired rounds and converges many times later than the ratios
        # (bench/results/2026-12-01-gate-accuracy-h200.md).
        def ratios() -> list[float]:
            return [k / a for k, a in zip(sampled, anchor_s, strict=True) if k > 0 and a > 0]

        log = adaptive_rounds(
            run_round, sampling, converge_on=ratios if anchor is not None else None
        )
        pairs_summary = None
        if anchor is not None:
            reason = (
                f"{sum(warm_flags)} of {len(warm_flags)} NVML readings during the warm-up "
                "under a clock limit"
            )
            pairs_summary = summarize_pairs(
                anchor_name(torch), log.samples, anchor_s, reason,
                throttled=log.throttled, flush_s=flush_s,
            )  # fmt: skip
        phase = "checking the timed outputs"
        median_s = sorted(log.samples)[len(log.samples) // 2] if log.samples else 0.0
        if budget.streams != "any" and probe.escaped(median_s * calls):
            # Measured again before refusing, beside calibrations as long as the calls.
            wide = sorted(probe.device_wide_s)[len(probe.device_wide_s) // 2]
            refill = (lambda: (fresh.before(), flush())) if fresh is not None else flush
            probe.confirm(body, observe, gpu_wait(wide), before=refill)
            if probe.escaped(median_s * calls):
                raise DishonestTiming(escape_message(probe, median_s * calls, watch.events))
        if fresh is not None:
            fresh.finish()
    except KernelproError:
        raise
    except Exception as exc:
        raise kernel_failed(device, phase, exc) from exc
    finally:
        graph = None  # free the graph's private memory pool
    extra = {
        "warmup_runs": runs,
        "readings": readings,
        "calls_per_sample": calls,
        "flush_bytes": nbytes,
        "anchor": pairs_summary,
        "warmup_throttled": warmup_capped("on", warm_flags) if warm_flags else None,
        "honesty": {
            **(fresh.to_dict() if fresh is not None else {}),
            **probe.to_dict(),
            "streams": budget.streams,
            "stream_switches": list(watch.events),
        },
    }
    return log, extra


def _read_while_busy(torch: Any, monitor: Any) -> list[bool]:
    """Throttle flags of NVML readings taken every `CLOCK_READ_INTERVAL_S` until the work
    enqueued so far is done (the warm-up): readings of a busy GPU only, unless none was."""
    if monitor is None:
        return []
    done = torch.cuda.Event()
    done.record()
    seen = [monitor.read()]
    next_read = time.perf_counter() + CLOCK_READ_INTERVAL_S
    while not done.query():
        if time.perf_counter() >= next_read:
            seen.append(monitor.read())
            next_read += CLOCK_READ_INTERVAL_S
        time.sleep(0.0005)
    busy = [r for r in seen if "gpu_idle" not in r.reasons] or seen
    return [r.throttled for r in busy]


def _capture(torch: Any, fn: Callable[[], object], calls: int) -> Any:
    """A CUDA graph of `calls` back-to-back calls of `fn` (warmed up on a side stream)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # capture needs the kernels' modules and workspaces created first
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception as exc:
        raise KernelproError(
            f"the kernel could not be captured in a CUDA graph ({type(exc).__name__}: {exc}); "
            "graph timing needs a kernel without host synchronization or CPU-GPU copies: "
            "time it without cuda_graph"
        ) from exc
    return graph


bound.keep_module(sys.modules[__name__])
