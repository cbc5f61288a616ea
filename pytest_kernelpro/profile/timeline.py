"""Timeline of a kernel's runs: kernel count, launch overhead, sync calls, idle gaps.

`summarize_events` is a pure function over Chrome-trace-style events (kineto's
`export_chrome_trace` format: `cat`, `name`, `ts`/`dur` in µs); nsys' CSV reports are
converted to the same shape (`events_from_nsys_csv`). Gaps are measured on the GPU's busy
intervals (kernels, memcpy, memset merged across streams) and flagged when longer than
max(`gap_fraction` of end-to-end, `min_gap_us`), by default max(1 %, 5 µs).

`trace_callable` records N runs of a callable with torch.profiler (kineto); nsys is used
only where `nsys_status()` says it can make a report (it could not on the H200 machine).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pytest_kernelpro.profile.binaries import find_tool, run_tool
from pytest_kernelpro.profile.model import NotCollected, TimelineGap, TimelineSummary

SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
    }
)
KERNEL_CATS = frozenset({"kernel"})
GPU_BUSY_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
HOST_CATS = frozenset({"cuda_runtime", "cuda_driver", "cpu_op"})
KEPT_CATS = GPU_BUSY_CATS | HOST_CATS


def _interval(event: Mapping[str, Any]) -> tuple[float, float] | None:
    try:
        start = float(event["ts"])
        duration = float(event.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return None
    return start, start + max(0.0, duration)


def _complete_events(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    kept = []
    for event in events:
        if event.get("ph", "X") != "X" or event.get("cat") not in KEPT_CATS:
            continue
        if _interval(event) is not None:
            kept.append(event)
    return kept


def _merge(intervals: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Merge overlapping (start, end, first_name) intervals, sorted by start."""
    merged: list[tuple[float, float, str]] = []
    for start, end, name in sorted(intervals):
        if merged and start <= merged[-1][1]:
            last = merged[-1]
            merged[-1] = (last[0], max(last[1], end), last[2])
        else:
            merged.append((start, end, name))
    return merged


def summarize_events(
    events: Iterable[Mapping[str, Any]],
    *,
    source: str = "kineto",
    gap_fraction: float = 0.01,
    min_gap_us: float = 5.0,
) -> TimelineSummary:
    """Kernel count, end-to-end span, kernel busy time, launch-overhead share, sync calls and
    flagged GPU idle gaps of a trace."""
    complete = _complete_events(events)
    kernels = [e for e in complete if e.get("cat") in KERNEL_CATS]
    if not complete:
        return TimelineSummary(source, 0, 0.0, 0.0, 0.0, 0, (), min_gap_us, ())
    spans = [_interval(e) for e in complete]
    t0 = min(s[0] for s in spans if s)
    t1 = max(s[1] for s in spans if s)
    end_to_end = max(0.0, t1 - t0)

    kernel_busy = _merge([(*_interval(e), str(e.get("name", ""))) for e in kernels])  # type: ignore[misc]
    kernel_time = sum(end - start for start, end, _ in kernel_busy)
    gpu_busy = _merge(
        [(*_interval(e), str(e.get("name", ""))) for e in complete if e.get("cat") in GPU_BUSY_CATS]  # type: ignore[misc]
    )
    threshold = max(gap_fraction * end_to_end, min_gap_us)
    gaps: list[TimelineGap] = []
    for (_, end, _), (start, _, name) in zip(gpu_busy, gpu_busy[1:], strict=False):
        if start - end > threshold:
            gaps.append(TimelineGap(start_us=end - t0, duration_us=start - end, before_kernel=name))
    sync_calls = sum(
        1
        for e in complete
        if e.get("cat") in {"cuda_runtime", "cuda_driver"} and e.get("name") in SYNC_CALLS
    )
    names = tuple(dict.fromkeys(str(e.get("name", "")) for e in sorted(kernels, key=_ts)))
    share = 0.0 if end_to_end <= 0 else min(1.0, max(0.0, 1.0 - kernel_time / end_to_end))
    return TimelineSummary(
        source=source,
        kernel_count=len(kernels),
        end_to_end_us=end_to_end,
        kernel_time_us=kernel_time,
        launch_overhead_share=share,
        sync_calls=sync_calls,
        gaps=tuple(gaps),
        gap_threshold_us=threshold,
        kernel_names=names,
    )


def _ts(event: Mapping[str, Any]) -> float:
    return float(event.get("ts", 0.0))


def kernel_time_by_name(events: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Total GPU time (µs) per kernel name, largest first."""
    totals: dict[str, float] = {}
    for event in _complete_events(events):
        if event.get("cat") in KERNEL_CATS:
            name = str(event.get("name", ""))
            totals[name] = totals.get(name, 0.0) + float(event.get("dur", 0.0))
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def dominant_kernels(
    times: Mapping[str, float], *, coverage: float = 0.9, max_kernels: int = 4
) -> list[str]:
    """The fewest kernels (at most `max_kernels`) that take `coverage` of the kernel time."""
    total = sum(times.values())
    chosen: list[str] = []
    running = 0.0
    for name, time_us in sorted(times.items(), key=lambda item: -item[1]):
        if len(chosen) >= max_kernels or (total > 0 and running >= coverage * total):
            break
        chosen.append(name)
        running += time_us
    return chosen


# --- kineto -------------------------------------------------------------------------------


def trace_callable(
    fn: Callable[[], Any], *, runs: int = 10, warmup: int = 2
) -> list[dict[str, Any]] | NotCollected:
    """Chrome-trace events of `runs` back-to-back calls of `fn` (one sync at the end)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return NotCollected("timeline", "torch is not installed")
    if not torch.cuda.is_available():
        return NotCollected("timeline", "no CUDA device (torch.cuda.is_available() is False)")
    for _ in range(max(0, warmup)):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(max(1, runs)):
            fn()
        torch.cuda.synchronize()
    fd, path = tempfile.mkstemp(prefix="kernelpro-trace-", suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as handle:
            trace = json.load(handle)
    finally:
        os.unlink(path)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [dict(e) for e in _complete_events(events)]


def timeline_of_callable(
    fn: Callable[[], Any], *, runs: int = 10, warmup: int = 2
) -> TimelineSummary | NotCollected:
    """`summarize_events` of `trace_callable`."""
    events = trace_callable(fn, runs=runs, warmup=warmup)
    if isinstance(events, NotCollected):
        return events
    if not any(e.get("cat") in KERNEL_CATS for e in events):
        return NotCollected("timeline", "kineto recorded no GPU kernels (CUPTI unavailable?)")
    return summarize_events(events, source="kineto")


# --- nsys ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def nsys_status(*, timeout_s: float = 60.0) -> str | None:
    """None when nsys can make a report here, else why not (checked once per process)."""
    nsys = find_tool("nsys")
    if nsys is None:
        return "nsys not found on PATH, $CUDA_HOME/bin or KERNELPRO_NSYS"
    version = run_tool("timeline", [nsys, "--version"], timeout_s=timeout_s)
    if isinstance(version, NotCollected):
        return version.why
    status = run_tool("timeline", [nsys, "status", "--environment"], timeout_s=timeout_s)
    if isinstance(status, NotCollected):
        return f"nsys status --environment failed: {status.why}"
    text = (status.stdout + status.stderr).lower()
    if "fail" in text and "cuda" in text:
        return "nsys status --environment reports that CUDA tracing is not possible"
    return None


def events_from_nsys_csv(gpu_trace_csv: str, api_trace_csv: str = "") -> list[dict[str, Any]]:
    """Chrome-trace-style events from `nsys stats --format csv` reports
    `cuda_gpu_trace` (kernels, memcpy, memset) and `cuda_api_trace` (runtime calls)."""
    events: list[dict[str, Any]] = []
    for text, host in ((gpu_trace_csv, False), (api_trace_csv, True)):
        if not text.strip():
            continue
        for row in csv.DictReader(io.StringIO(text)):
            try:
                start_ns = float(row["Start (ns)"])
                duration_ns = float(row["Duration (ns)"])
            except (KeyError, TypeError, ValueError):
                continue
            name = row.get("Name", "")
            if host:
                cat = (
                    "cuda_driver"
                    if name.startswith("cu") and not name.startswith("cuda")
                    else "cuda_runtime"
                )
            elif "memcpy" in name.lower():
                cat = "gpu_memcpy"
            elif "memset" in name.lower():
                cat = "gpu_memset"
            else:
                cat = "kernel"
            events.append(
                {
                    "ph": "X",
                    "cat": cat,
                    "name": name,
                    "ts": start_ns / 1e3,
                    "dur": duration_ns / 1e3,
                }
            )
    return events


def nsys_timeline(
    command: list[str], *, timeout_s: float = 300.0
) -> TimelineSummary | NotCollected:
    """Profile `command` with nsys between its cudaProfilerStart/Stop calls and summarize
    the `cuda_gpu_trace` and `cuda_api_trace` reports."""
    nsys = find_tool("nsys")
    if nsys is None:
        return NotCollected("timeline", "nsys not found")
    with tempfile.TemporaryDirectory(prefix="kernelpro-nsys-") as tmp:
        out = os.path.join(tmp, "trace")
        profile = run_tool(
            "timeline",
            [
                nsys,
                "profile",
                "--trace=cuda,nvtx",
                "--sample=none",
                "--cpuctxsw=none",
                "--capture-range=cudaProfilerApi",
                "--capture-range-end=stop",
                "--force-overwrite=true",
                "-o",
                out,
                *command,
            ],
            timeout_s=timeout_s,
        )
        if isinstance(profile, NotCollected):
            return profile
        stats = run_tool(
            "timeline",
            [
                nsys,
                "stats",
                "--report",
                "cuda_gpu_trace",
                "--report",
                "cuda_api_trace",
                "--format",
                "csv",
                "--force-export=true",
                "--output",
                out,
                out + ".nsys-rep",
            ],
            timeout_s=timeout_s,
        )
        if isinstance(stats, NotCollected):
            return stats
        texts = []
        for report in ("cuda_gpu_trace", "cuda_api_trace"):
            path = f"{out}_{report}.csv"
            texts.append(open(path, encoding="utf-8").read() if os.path.exists(path) else "")
    events = events_from_nsys_csv(texts[0], texts[1])
    if not any(e["cat"] == "kernel" for e in events):
        return NotCollected("timeline", "nsys recorded no kernels between cudaProfilerStart/Stop")
    return summarize_events(events, source="nsys")
