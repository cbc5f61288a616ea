"""Timeline summaries of synthetic kineto and nsys traces; the CPU-only paths."""

from __future__ import annotations

import pytest

from pytest_kernelpro.profile.model import NotCollected
from pytest_kernelpro.profile.timeline import (
    dominant_kernels,
    events_from_nsys_csv,
    kernel_time_by_name,
    nsys_status,
    summarize_events,
    timeline_of_callable,
    trace_callable,
)


def ev(cat: str, name: str, ts: float, dur: float, ph: str = "X") -> dict:
    return {"ph": ph, "cat": cat, "name": name, "ts": ts, "dur": dur}


def launch_bound_trace() -> list[dict]:
    """Three 2 µs kernels, each launched 10 µs after the previous one ended, then a sync."""
    events = []
    for i in range(3):
        start = 100.0 + 12.0 * i
        events.append(ev("cuda_runtime", "cudaLaunchKernel", start - 8.0, 4.0))
        events.append(ev("kernel", f"k{i}", start, 2.0))
    events.append(ev("cuda_runtime", "cudaDeviceSynchronize", 128.0, 2.0))
    events.append(ev("python_function", "ignored", 0.0, 1000.0))
    events.append(ev("ac2g", "flow", 95.0, 0.0, ph="s"))
    return events


def test_launch_bound_trace() -> None:
    summary = summarize_events(launch_bound_trace())
    assert summary.source == "kineto"
    assert summary.kernel_count == 3
    assert summary.kernel_names == ("k0", "k1", "k2")
    assert summary.end_to_end_us == pytest.approx(130.0 - 92.0)
    assert summary.kernel_time_us == pytest.approx(6.0)
    assert summary.launch_overhead_share == pytest.approx(1 - 6.0 / 38.0)
    assert summary.sync_calls == 1
    # 10 µs idle before k1 and k2: above max(1% of 38 µs, 5 µs)
    assert summary.gap_threshold_us == 5.0
    assert [(g.before_kernel, g.duration_us) for g in summary.gaps] == [("k1", 10.0), ("k2", 10.0)]
    assert summary.gaps[0].start_us == pytest.approx(102.0 - 92.0)


def test_gap_threshold_scales_with_end_to_end() -> None:
    # 10 ms end to end: the threshold is 100 µs, so an 80 µs gap is not flagged, 150 µs is
    events = [
        ev("kernel", "a", 0.0, 4000.0),
        ev("kernel", "b", 4080.0, 3000.0),
        ev("kernel", "c", 7230.0, 2770.0),
    ]
    summary = summarize_events(events)
    assert summary.gap_threshold_us == pytest.approx(100.0)
    assert [(g.before_kernel, round(g.duration_us)) for g in summary.gaps] == [("c", 150)]
    assert summary.launch_overhead_share == pytest.approx(230.0 / 10000.0)


def test_overlapping_streams_and_copies_are_not_gaps() -> None:
    events = [
        ev("kernel", "a", 0.0, 50.0),
        ev("kernel", "b", 20.0, 60.0),  # another stream, overlapping a
        ev("gpu_memcpy", "Memcpy DtoD", 80.0, 40.0),  # fills what would be a gap
        ev("kernel", "c", 120.0, 10.0),
        ev("cuda_runtime", "cudaStreamSynchronize", 131.0, 1.0),
        ev("cuda_driver", "cuEventSynchronize", 133.0, 1.0),
    ]
    summary = summarize_events(events)
    assert summary.gaps == ()
    assert summary.kernel_time_us == pytest.approx(90.0)  # union of a and b, plus c
    assert summary.sync_calls == 2


def test_empty_trace() -> None:
    summary = summarize_events([ev("python_function", "f", 0.0, 10.0)])
    assert (summary.kernel_count, summary.end_to_end_us, summary.gaps) == (0, 0.0, ())


def test_kernel_times_and_dominant_kernels() -> None:
    events = [
        ev("kernel", "gemm", 0, 80),
        ev("kernel", "add", 90, 5),
        ev("kernel", "gemm", 100, 80),
    ]
    events += [ev("kernel", "softmax", 200, 30), ev("kernel", "tiny", 240, 1)]
    times = kernel_time_by_name(events)
    assert list(times) == ["gemm", "softmax", "add", "tiny"]
    assert times["gemm"] == 160
    assert dominant_kernels(times) == ["gemm", "softmax"]  # 190 of 196 µs
    assert dominant_kernels(times, coverage=0.5) == ["gemm"]
    assert dominant_kernels(times, coverage=1.0, max_kernels=3) == ["gemm", "softmax", "add"]


def test_nsys_reports_convert_to_events() -> None:
    gpu = (
        "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),"
        "DymSMem (MB),Bytes (MB),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,Strm,Name\n"
        "1000,2000,1,1,1,1,128,1,1,32,0,0,,,,,0,1,7,k0\n"
        "3000,500,2,,,,,,,,,,4,8000,Device,Device,0,1,7,[CUDA memcpy Device-to-Device]\n"
        "20000,2000,3,1,1,1,128,1,1,32,0,0,,,,,0,1,7,k1\n"
    )
    api = (
        "Start (ns),Duration (ns),Name,Result,CorrID,Pid,Tid,T-Pri,Thread Name\n"
        "500,400,cudaLaunchKernel,0,1,1,1,0,python\n"
        "22500,800,cudaDeviceSynchronize,0,4,1,1,0,python\n"
        "900,100,cuLaunchKernel,0,5,1,1,0,python\n"
    )
    events = events_from_nsys_csv(gpu, api)
    assert [e["cat"] for e in events] == [
        "kernel",
        "gpu_memcpy",
        "kernel",
        "cuda_runtime",
        "cuda_runtime",
        "cuda_driver",
    ]
    summary = summarize_events(events, source="nsys")
    assert summary.source == "nsys"
    assert summary.kernel_count == 2
    assert summary.sync_calls == 1
    assert [(g.before_kernel, g.duration_us) for g in summary.gaps] == [("k1", 16.5)]


def test_cpu_only_machine_reports_not_collected() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    result = trace_callable(lambda: None)
    assert isinstance(result, NotCollected)
    assert result.what == "timeline"
    assert "no CUDA device" in result.why
    assert isinstance(timeline_of_callable(lambda: None), NotCollected)


def test_nsys_status_without_nsys(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delenv("KERNELPRO_NSYS", raising=False)
    monkeypatch.setattr("pytest_kernelpro.profile.binaries._DEFAULT_CUDA_ROOTS", ())
    nsys_status.cache_clear()  # checked once per process; re-check under this PATH
    reason = nsys_status()
    nsys_status.cache_clear()
    assert reason is not None
    assert "nsys not found" in reason
