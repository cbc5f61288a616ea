"""The CUDA timer: events, L2 flush, sleep pre-roll, NVML clocks, CUDA graphs.

As `triton.testing.do_bench` and nvbench do it: one call to load/compile, an estimate of the
per-call time from 5 flushed calls, warm-up for `warmup_ms`, then rounds of samples until
`budget.adaptive_rounds` stops them. Each sample is: write a buffer of twice the L2 size
(evicting the kernel's inputs), record a CUDA event, call the kernel, record a second event;
a round enqueues many samples and synchronizes once, behind a short `torch.cuda._sleep` so
the CPU is ahead of the GPU and the events bracket GPU work only, not Python launch overhead.
NVML clocks and clock-event reasons are read while each round runs; samples of a round with a
throttle reason are counted. CUDA-graph mode captures k calls in one graph and times replays
(per call = replay / k). NVML is read while the warm-up runs too: with `clock_anchor="on"`, a
kernel whose warm-up ran mostly under a clock limit (the power cap) is timed in pairs with
the clock anchor (`anchor.py`).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from operator import attrgetter, is_not
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
    DEFAULT_FLUSH_BYTES,
    RoundLog,
    TimingBudget,
    TimingResult,
    adaptive_rounds,
    kernel_failed,
)
from pytest_kernelpro.measure.timing.fresh_inputs import (
    PENDING_BYTES,
    PENDING_CHECKS,
    REWRITES_TIMER,
    CheckKey,
    DishonestTiming,
    FreshInputs,
    Seal,
    verify_bindings,
)
from pytest_kernelpro.measure.timing.streams import (
    MATCHED_WAIT_MAX_S,
    EscapeProbe,
    StreamWatch,
    escape_message,
)

# NVML readings while a round runs, every 10 ms: their mean SM clock and reasons decide
# whether a comparison is clock-limited (gate/verdict_basis.py).
CLOCK_READ_INTERVAL_S = 0.01
PREROLL_CAP_S = 0.05  # longest GPU sleep put ahead of a round
GRAPH_TARGET_S = 5e-4  # a graph replay should last about this long (k calls per replay)
_SLEEP_CYCLES_PER_S: dict[int, float] = {}  # torch.cuda._sleep calibration per device
# One flush buffer per (device, size), kept for the process like triton's cache buffer, so
# each kernel does not pay an allocation.
_FLUSH_BUFFERS: dict[tuple[int, int], Any] = {}


class CudaEvents:
    """CUDA events on one stream through the C type `torch._C._CudaEventBase`, whose methods
    (unlike `torch.cuda.Event`'s) cannot be replaced; synchronize is the C function, taken
    when this is made."""

    def __init__(self, torch: Any, stream: Any) -> None:
        self._base = torch._C._CudaEventBase
        self._record = self._base.record
        self._elapsed = self._base.elapsed_time
        self.synchronize_device: Callable[[], None] = torch._C._cuda_synchronize
        self.stream = stream

    def event(self) -> Any:
        return self._base(enable_timing=True)

    def record(self, event: Any) -> Any:
        self._record(event, self.stream)
        return event

    def mark(self) -> Any:
        """A new event recorded now on the timed stream."""
        return self.record(self.event())

    def elapsed_s(self, start: Any, end: Any) -> float:
        return float(self._elapsed(start, end)) * 1e-3


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
        throttled_samples=sum(log.throttled),
        clocks=summarize_readings(extra.pop("readings")),
        rounds=log.rounds,
        budget=asdict(budget),
        **extra,
    )


@dataclass(slots=True)  # no instance dict: a method cannot be shadowed on the object
class _CudaRun:
    """What the phases of one CUDA timing share: the timed stream's events, the flush, the
    call timed (`body`, `calls` calls per sample) and what the rounds collect. A kernel can
    find this object through gc: its fields are compared with the timer's own copy before
    and after every sample (`_verify`), and the fresh inputs' seal, that copy and the keys of
    queued checks are not here but in the phases' frames (arguments and locals)."""

    torch: Any
    idx: int
    budget: TimingBudget
    monitor: Any
    fresh: FreshInputs | None
    watch: StreamWatch
    events: Any  # CudaEvents on the timed stream
    probe: EscapeProbe
    buf: Any  # the L2 flush buffer, or None
    # streams="any": the kernel's work may still run on its own streams when it returns, so
    # its outputs are read after a device-wide synchronize (the default reads them on the
    # timed stream right after the end event: what is not done there escaped it).
    own_streams: bool
    body: Callable[[], object]
    calls: int = 1
    anchor: Callable[[], object] | None = None  # set when the warm-up ran clock-limited
    readings: list[Any] = field(default_factory=list)
    anchor_s: list[float] = field(default_factory=list)  # the anchor's time per sample
    sampled: list[float] = field(default_factory=list)  # the samples of the rounds so far
    flush_s: float = 0.0
    host_s: float = 0.0  # CPU time to enqueue one sample
    per_call: float = 0.0
    runs: int = 0  # calls of fn made before sampling (reported as warm-up runs)
    warm_flags: list[bool] = field(default_factory=list)

    def flush(self) -> None:
        if self.buf is not None:
            self.buf.zero_()

    def refill(self) -> tuple[int, Any] | None:
        """New content for the next call, then the flush; the content's token (None without
        fresh inputs), which the caller keeps in its frame and hands to `observe`."""
        content = self.fresh.before() if self.fresh is not None else None
        self.flush()
        return content

    def observe(self, out: Any, content: Any, force: bool = False) -> CheckKey | None:
        """The call given `content` returned `out`: checked or not (`FreshInputs.after`);
        the key of a check queued for `drain`, or None."""
        if self.fresh is None or out is None:  # a graph replay returns None
            return None
        if self.own_streams:
            self.events.synchronize_device()
        return self.fresh.after(out, force=force, content=content)

    def drain(self, queued: tuple[CheckKey, ...]) -> None:
        """Compare the queued checks, which must be exactly `queued` (`FreshInputs.drain`)."""
        if self.fresh is not None:
            self.fresh.drain(queued)

    def elapsed(self, pairs: list[Any], marks: list[Any]) -> list[float]:
        (marks or pairs)[-1][1].synchronize()
        self.anchor_s.extend(self.events.elapsed_s(s, e) for s, e in marks)
        return [self.events.elapsed_s(s, e) / self.calls for s, e in pairs]

    def gpu_wait(self, seconds: float) -> Callable[[], object] | None:
        """A GPU sleep of about `seconds` on the timed stream (the calibration's stand-in for
        a call), or None without the sleep's calibration."""
        if seconds > MATCHED_WAIT_MAX_S:
            return None
        cycles = int(seconds * (_SLEEP_CYCLES_PER_S.get(self.idx) or 0.0))
        if cycles <= 0:
            return None
        torch = self.torch
        return lambda: torch.cuda._sleep(cycles)


# The fields of a `_CudaRun` that decide what is timed, how a sample is divided and which
# checks run; a `Guard` holds their values (and the fresh inputs' seal) as the timer set them.
RUN_FIELDS = tuple(
    "torch idx budget monitor fresh watch events probe buf own_streams body calls anchor "
    "readings anchor_s sampled flush_s host_s per_call warm_flags".split()
)
_run_state = attrgetter(*RUN_FIELDS)  # the fields' values in one tuple, read in C
Guard = tuple[Seal | None, tuple[Any, ...]]


def _guard(run: _CudaRun, seal: Seal | None, **values: Any) -> Guard:
    """`values` set on the run by the timer (no kernel call in between), and the new guard."""
    for name, value in values.items():
        setattr(run, name, value)
    return seal, _run_state(run)


def _verify(run: _CudaRun, guard: Guard) -> None:
    """The kept bindings and the fresh inputs' seal (`verify_bindings`), and every field of
    the run as the timer set it (identity, compared in C): raises `DishonestTiming` naming
    what a kernel rewrote."""
    seal, state = guard
    try:
        intact = not any(map(is_not, _run_state(run), state))
    except AttributeError:  # a field deleted
        intact = False
    if not intact:
        missing = object()  # a deleted field is changed, whatever it held
        changed = [
            name
            for name, value in zip(RUN_FIELDS, state, strict=True)
            if getattr(run, name, missing) is not value
        ]
        raise DishonestTiming(
            f"the timer's own state ({', '.join(changed)} of its CUDA run) was changed while "
            f"the kernel was timed: {REWRITES_TIMER}"
        )
    verify_bindings(run.fresh, seal)


def _queued(
    queued: tuple[CheckKey, ...], key: CheckKey | None, run: _CudaRun
) -> tuple[CheckKey, ...]:
    """`queued` with `key`; compared at once (`_CudaRun.drain`) when `PENDING_CHECKS` are, or
    when their copies hold `PENDING_BYTES` of device memory (a large output's copies are not
    piled up for a round: one at a time)."""
    if key is None:
        return queued
    queued = (*queued, key)
    fresh = run.fresh
    held = fresh.queued_bytes() if fresh is not None else 0
    if len(queued) >= PENDING_CHECKS or held >= PENDING_BYTES:
        run.drain(queued)
        return ()
    return queued


def _enqueue(
    run: _CudaRun, guard: Guard, k: int, sleep_cycles: int = 0, sync_each: bool = False
) -> tuple[list[Any], list[Any], tuple[CheckKey, ...]]:
    """Enqueue k samples (new content, flush, event, body, event), each followed by the
    anchor's own flush and bracketed anchor call when anchored; returns both lists of event
    pairs and the keys of the checks queued (for the caller's `drain`)."""
    torch, events, anchor = run.torch, run.events, run.anchor
    pairs = [(events.event(), events.event()) for _ in range(k)]
    marks = [] if anchor is None else [(events.event(), events.event()) for _ in range(k)]
    queued: tuple[CheckKey, ...] = ()
    if sleep_cycles and not sync_each:
        torch.cuda._sleep(sleep_cycles)  # keeps the GPU busy while the CPU enqueues
    for i, (start, end) in enumerate(pairs):
        if sleep_cycles and sync_each:
            torch.cuda._sleep(sleep_cycles)
        _verify(run, guard)  # before and after every sample
        content = run.refill()  # enqueued ahead of the start event: not timed
        events.record(start)
        out = run.body()
        events.record(end)
        key = run.observe(out, content)
        out = None  # dropped before a check compares (its copy is queued)
        queued = _queued(queued, key, run)
        _verify(run, guard)
        if anchor is not None:
            run.flush()
            events.record(marks[i][0])
            anchor()
            events.record(marks[i][1])
        if sync_each:
            if run.monitor is not None and i == k // 2:
                run.readings.append(run.monitor.read())
            (marks[i] if marks else (start, end))[1].synchronize()
    return pairs, marks, queued


def _checked(run: _CudaRun, guard: Guard, k: int) -> list[float]:
    """k checked calls (streams.EscapeProbe): per-call device-wide times; their outputs'
    checks compared before returning."""
    times = []
    queued: tuple[CheckKey, ...] = ()
    for _ in range(k):
        content = run.refill()
        wide, key = run.probe.checked_call(
            run.body, run.observe, own_streams=run.own_streams, content=content
        )
        _verify(run, guard)
        times.append(wide / run.calls)
        queued = _queued(queued, key, run)
    run.drain(queued)
    return times


def _first_call(run: _CudaRun, guard: Guard, fn: Callable[[], object]) -> None:
    """The first call (load, lazy init), on new content, always checked."""
    content = run.fresh.before() if run.fresh is not None else None
    out = fn()
    _verify(run, guard)
    first = run.observe(out, content, force=True)
    out = None
    run.events.synchronize_device()
    run.drain(() if first is None else (first,))


def _estimate(run: _CudaRun, guard: Guard) -> Guard:
    """The flush's time and the estimate of a call from 5 flushed samples (`per_call`,
    `host_s`: the CPU time to enqueue one); the guard of the run with them."""
    events = run.events
    flush_pairs = []
    for _ in range(3):
        start, end = events.event(), events.event()
        events.record(start)
        run.flush()
        events.record(end)
        flush_pairs.append((start, end))
    flush_s = sorted(run.elapsed(flush_pairs, []))[1] if run.buf is not None else 0.0
    t0 = bound.perf_counter()
    pairs, marks, queued = _enqueue(run, guard, 5)
    host_s = (bound.perf_counter() - t0) / 5
    per_call = sorted(run.elapsed(pairs, marks))[2]
    run.drain(queued)
    run.runs = 6
    return _guard(run, guard[0], flush_s=flush_s, host_s=host_s, per_call=per_call)


def _graph_body(run: _CudaRun, guard: Guard, fn: Callable[[], object]) -> Guard:
    """CUDA-graph mode: the graph of `calls` calls replayed as the body (the graph lives as
    long as `body` holds its replay); the guard of the run with them."""
    calls = max(1, min(1000, math.ceil(GRAPH_TARGET_S / max(run.per_call, 1e-7))))
    run.watch.active = False  # the capture's own side stream is ours
    graph = _capture(run.torch, fn, calls)
    run.watch.active = True
    _verify(run, guard)
    guard = _guard(run, guard[0], calls=calls, body=graph.replay)
    pairs, marks, _ = _enqueue(run, guard, 3)  # a replay returns None: nothing checked
    per_call = sorted(run.elapsed(pairs, marks))[1]  # one replay, divided by calls
    run.runs += 3 + 3 * calls  # side-stream warm-up + the replays just timed
    return _guard(run, guard[0], per_call=per_call)


def _warm_up(run: _CudaRun, guard: Guard) -> Guard:
    """Flushed calls for `warmup_ms` on fresh inputs, as every other call (on unchanged
    inputs a memo by `_version` hits: the warm-up and its clock readings would see no work);
    NVML read while they run (`warm_flags`)."""
    n_warm = warmup_count(run.budget.warmup_ms, run.flush_s + run.per_call * run.calls)
    for _ in range(n_warm):
        run.refill()
        run.body()
    warm_flags = _read_while_busy(run.torch, run.monitor)
    run.events.synchronize_device()
    _verify(run, guard)
    run.runs += n_warm * run.calls
    return _guard(run, guard[0], warm_flags=warm_flags)


def _start_anchor(run: _CudaRun, guard: Guard) -> tuple[TimingBudget, Guard]:
    """The clock anchor loaded for paired rounds; the budget those rounds sample on and the
    guard of the run with the anchor."""
    anchor = anchor_launch(run.torch, run.idx)
    for _ in range(2):  # load its module (and cuBLAS's choice for it) before sampling
        anchor()
    run.events.synchronize_device()
    budget = run.budget
    sampling = replace(
        budget, min_samples=anchored_min_samples(budget.min_samples, budget.max_samples)
    )
    # A pair enqueues a second flush and the anchor: twice the host time per sample.
    return sampling, _guard(run, guard[0], anchor=anchor, host_s=run.host_s * 2)


def _run_round(run: _CudaRun, guard: Guard, k: int) -> tuple[list[float], bool]:
    """One round of k samples (`adaptive_rounds`), its checks compared after its last event;
    the samples and whether an NVML reading of the round saw a throttle reason."""
    budget, monitor, readings = run.budget, run.monitor, run.readings
    seen_before = len(readings)
    if budget.streams == "any":  # every sample a checked call: its real cost
        times = _checked(run, guard, k)
        run.sampled.extend(times)
        return times, False
    # Keep the GPU busy until the CPU has enqueued the whole round, with margin: Python's
    # enqueue time jitters, and a GPU that catches up with the CPU records the start event
    # early, so launch latency would land inside a sample.
    host_s = run.host_s
    ahead_s = host_s if budget.sync_per_sample else host_s + 1.5 * k * host_s
    cycles_per_s = _SLEEP_CYCLES_PER_S.get(run.idx) or 0.0
    sleep = int(min(PREROLL_CAP_S, ahead_s) * cycles_per_s)
    pairs, marks, queued = _enqueue(run, guard, k, sleep, budget.sync_per_sample)
    last = (marks or pairs)[-1][1]
    if monitor is not None and not budget.sync_per_sample:
        _read_until(monitor, last, readings)  # the GPU is busy with the round now
    times = run.elapsed(pairs, marks)
    run.sampled.extend(times)
    run.drain(queued)  # the round's checked outputs, after its last event
    _checked(run, guard, 1)  # one checked call per round, after it (not a sample)
    return times, any(r.throttled for r in readings[seen_before:])


def _refuse_escape(run: _CudaRun, guard: Guard, log: RoundLog) -> None:
    """Refuse a kernel whose checked calls saw device work outside the timed stream,
    measured again first beside calibrations as long as the calls."""
    median_s = sorted(log.samples)[len(log.samples) // 2] if log.samples else 0.0
    probe = run.probe
    if run.budget.streams == "any" or not probe.escaped(median_s * run.calls):
        return
    wide = sorted(probe.device_wide_s)[len(probe.device_wide_s) // 2]
    queued = probe.confirm(run.body, run.observe, run.gpu_wait(wide), before=run.refill)
    _verify(run, guard)
    run.drain(queued)
    if probe.escaped(median_s * run.calls):
        raise DishonestTiming(escape_message(probe, median_s * run.calls, run.watch.events))


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
    # Events of the C type on the stream current now (a kernel that patches torch.cuda.Event
    # cannot change them), and the checked calls that see work escaping it.
    timed_stream = torch.cuda.current_stream()
    events = CudaEvents(torch, timed_stream)
    watch.watch(timed_stream.stream_id)
    if fresh is not None:
        fresh.defer = True  # checked copies compared after each round (`drain`); sealed
    seal = fresh.seal() if fresh is not None else None  # passed down, held by no object
    run = _CudaRun(
        torch, idx, budget, monitor, fresh, watch, events, EscapeProbe(events),
        _flush_buffer(torch, idx, nbytes) if nbytes else None, budget.streams == "any",
        fresh.call if fresh is not None else fn,
    )  # fmt: skip
    fn = run.body
    guard = _guard(run, seal)  # the run as the timer set it: a local, passed down
    phase = "the first call"
    pairs_summary = None
    try:
        _first_call(run, guard, fn)
        phase = "the estimate"
        guard = _estimate(run, guard)
        if budget.cuda_graph:
            phase = "CUDA-graph capture"
            guard = _graph_body(run, guard, fn)
        phase = "warm-up"
        guard = _warm_up(run, guard)
        phase = "the checked calls (device work outside the timed stream)"
        _sleep_cycles_per_s(torch, idx)  # calibrated once per device (`_SLEEP_CYCLES_PER_S`)
        run.probe.calibrate(run.gpu_wait(run.per_call * run.calls))
        _checked(run, guard, 1)  # and one after every round of samples
        sampling = budget
        if warmup_capped(budget.clock_anchor, run.warm_flags):
            phase = "the clock anchor's first call"
            sampling, guard = _start_anchor(run, guard)
        phase = "sampling"

        # An anchored timing stops on the CI of the ratios the gate compares (anchor.py).
        def ratios() -> list[float]:
            pairs = zip(run.sampled, run.anchor_s, strict=True)
            return [k / a for k, a in pairs if k > 0 and a > 0]

        log = adaptive_rounds(
            lambda k: _run_round(run, guard, k),
            sampling,
            converge_on=ratios if run.anchor is not None else None,
        )
        if run.anchor is not None:
            reason = (
                f"{sum(run.warm_flags)} of {len(run.warm_flags)} NVML readings during the "
                "warm-up under a clock limit"
            )
            pairs_summary = summarize_pairs(
                anchor_name(torch), log.samples, run.anchor_s, reason,
                throttled=log.throttled, flush_s=run.flush_s,
            )  # fmt: skip
        phase = "checking the timed outputs"
        _refuse_escape(run, guard, log)
        _verify(run, guard)
        run.drain(())  # every queued check was compared: nothing may be left
    except BaseException as exc:
        if run.fresh is not None:
            run.fresh.abandon()
        if isinstance(exc, KernelproError) or not isinstance(exc, Exception):
            raise
        raise kernel_failed(device, phase, exc) from exc
    finally:
        run.body = fn  # drop the graph's replay: its private memory pool is freed
    return log, _side_facts(run, nbytes, pairs_summary)


def _side_facts(run: _CudaRun, nbytes: int, pairs: dict[str, Any] | None) -> dict[str, Any]:
    """The `TimingResult` fields `time_cuda` reports beside the samples, and the NVML
    readings it summarizes."""
    fresh = run.fresh
    return {
        "warmup_runs": run.runs,
        "readings": run.readings,
        "calls_per_sample": run.calls,
        "flushed_l2": nbytes > 0,
        "flush_bytes": nbytes,
        "anchor": pairs,
        "warmup_throttled": warmup_capped("on", run.warm_flags) if run.warm_flags else None,
        "honesty": {
            **(fresh.to_dict() if fresh is not None else {}),
            **run.probe.to_dict(),
            "streams": run.budget.streams,
            "stream_switches": list(run.watch.events),
        },
    }


def _read_until(monitor: Any, done: Any, readings: list[Any]) -> None:
    """NVML readings appended to `readings` now and every `CLOCK_READ_INTERVAL_S` until the
    event `done` has completed."""
    readings.append(monitor.read())
    next_read = bound.perf_counter() + CLOCK_READ_INTERVAL_S
    while not done.query():
        if bound.perf_counter() >= next_read:
            readings.append(monitor.read())
            next_read += CLOCK_READ_INTERVAL_S
        time.sleep(0.0005)


def _read_while_busy(torch: Any, monitor: Any) -> list[bool]:
    """Throttle flags of NVML readings taken every `CLOCK_READ_INTERVAL_S` until the work
    enqueued so far is done (the warm-up): readings of a busy GPU only, unless none was."""
    if monitor is None:
        return []
    done = torch.cuda.Event()
    done.record()
    seen: list[Any] = []
    _read_until(monitor, done, seen)
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
