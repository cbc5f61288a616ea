"""Builders for the tools tests: constructed metrics and the H200 probe capture (tests/data/tools)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from capture_folder import OfflineKernel, load_capture_dir, theoretical_class

from pytest_kernelpro.analysis import report_from_dict
from pytest_kernelpro.profile.model import (
    KernelMetrics,
    KernelProfile,
    LibraryLinkage,
    MetricValue,
    ProfileReport,
    PtxasReport,
    SassSummary,
    TimelineGap,
    TimelineSummary,
)
from pytest_kernelpro.tools.contract import ToolContext
from pytest_kernelpro.tools.registry import ToolRun, run_tools
from pytest_kernelpro.tools.signals import stall_metric
from pytest_kernelpro.tools.stage1 import Stage1, classify

PROBE_DIR = Path(__file__).resolve().parent.parent / "data" / "tools" / "h200-probe"
CAPTURE_DIR = PROBE_DIR.parent / "h200-capture"
EXAMPLE_RECORDS = PROBE_DIR.parent / "h200-example-repo" / "profile_records.json"
REQUIRED_STALLS = (
    "long_scoreboard",
    "short_scoreboard",
    "barrier",
    "branch_resolving",
    "mio_throttle",
)


def km(values: dict[str, float | str], name: str = "k(float*)") -> KernelMetrics:
    """KernelMetrics holding exactly `values`."""
    return KernelMetrics(name, {n: MetricValue(n, v) for n, v in values.items()})


def stall_values(**shares: float) -> dict[str, float]:
    """Per-warp-active stall percentages whose shares of stalled cycles are exactly `shares`:
    the five required reasons default to 0, `selected` is 0 and `not_selected` takes the rest."""
    values = dict.fromkeys(REQUIRED_STALLS, 0.0)
    values.update(shares)
    rest = 100.0 - sum(values.values())
    assert rest >= 0, "shares add up to more than 100"
    values["not_selected"] = rest
    values["selected"] = 0.0
    return {stall_metric(r): v for r, v in values.items()}


def sass(
    counts: dict[str, int] | None = None,
    loads: dict[int, int] | None = None,
    stores: dict[int, int] | None = None,
) -> SassSummary:
    counts = dict(counts or {})
    return SassSummary(
        function="k(float*)",
        mangled="_Z1kPf",
        counts=counts,
        total_instructions=sum(counts.values()),
        global_load_widths=dict(loads or {}),
        global_store_widths=dict(stores or {}),
    )


def ctx(
    values: dict[str, float | str] | None = None,
    *,
    name: str = "k(float*)",
    sass_summary: SassSummary | None = None,
    ptxas: PtxasReport | None = None,
    stage1: Stage1 | None = None,
    **kw: Any,
) -> ToolContext:
    """A ToolContext for one constructed kernel (metrics None when `values` is None)."""
    metrics = None if values is None else km(values, name)
    return ToolContext(
        kernel=KernelProfile(name, metrics, sass_summary, ptxas), stage1=stage1, **kw
    )


def report(
    values: dict[str, float | str] | None,
    *,
    name: str = "k(float*)",
    arch: str | None = "sm_90a",
    **kw: Any,
) -> ProfileReport:
    metrics = None if values is None else km(values, name)
    return ProfileReport(arch=arch, kernels=[KernelProfile(name, metrics)], **kw)


def timeline(
    overhead: float = 0.0,
    sync_calls: int = 0,
    gaps_us: tuple[float, ...] = (),
    e2e_us: float = 1000.0,
    kernels: int = 10,
) -> TimelineSummary:
    gaps = tuple(TimelineGap(10.0 * i, g, f"kernel_{i}") for i, g in enumerate(gaps_us))
    return TimelineSummary(
        source="kineto",
        kernel_count=kernels,
        end_to_end_us=e2e_us,
        kernel_time_us=e2e_us * (1.0 - overhead),
        launch_overhead_share=overhead,
        sync_calls=sync_calls,
        gaps=gaps,
        gap_threshold_us=max(0.01 * e2e_us, 5.0),
    )


def stage(cls: str | None) -> Stage1:
    """A Stage1 of class `cls` (as if theoretical and measured agreed)."""
    return Stage1(cls, "high" if cls else "none", cls, cls)


BLAS = LibraryLinkage(cublas=True, libraries=("libcublas.so.12",))


@functools.lru_cache(maxsize=1)
def probe() -> dict[str, OfflineKernel]:
    """The probe capture's kernels by base name (first launch of each name)."""
    return {k.base_name: k for k in load_capture_dir(PROBE_DIR)}


def _offline_ctx(k: OfflineKernel, extra: dict[str, Any], kw: dict[str, Any]) -> ToolContext:
    """A ToolContext for a captured kernel: its Stage 1 and roofline facts, then `extra`
    (what that capture records beyond the common facts), then the caller's overrides."""
    kernel = k.report.kernels[0]
    theo, _ = theoretical_class(k.meta, kernel.metrics.text("device__attribute_display_name"))
    defaults: dict[str, Any] = dict(
        arch=k.report.arch,
        stage1=classify(theo, kernel.metrics),
        op_category=k.meta.get("op"),
        min_bytes=k.meta.get("min_bytes"),
        dtype=k.meta.get("dtype"),
        **extra,
    )
    defaults.update(kw)
    return ToolContext(kernel=kernel, **defaults)


def probe_ctx(base: str, **kw: Any) -> ToolContext:
    """A ToolContext for one probe kernel, with its Stage 1 and roofline facts."""
    k = probe()[base]
    return _offline_ctx(k, {"linkage": k.report.linkage}, kw)


@functools.cache
def probe_run(base: str) -> ToolRun:
    """run_tools on one probe kernel with its Stage 1 and roofline facts."""
    k = probe()[base]
    c = probe_ctx(base)
    return run_tools(
        k.report, c.stage1, op_category=c.op_category, min_bytes=c.min_bytes, dtype=c.dtype
    )


@functools.lru_cache(maxsize=1)
def capture() -> dict[str, OfflineKernel]:
    """The profile-capture kernels (bench/profile_capture.py on the H200) by base name."""
    return {k.base_name: k for k in load_capture_dir(CAPTURE_DIR)}


def capture_ctx(base: str, **kw: Any) -> ToolContext:
    """A ToolContext for one profile-capture kernel, with its Stage 1 and roofline facts."""
    k = capture()[base]
    return _offline_ctx(k, {"flops": k.meta.get("flops")}, kw)


@functools.lru_cache(maxsize=1)
def example_records() -> dict[str, dict[str, Any]]:
    """Records of the example repository's `--kernelpro-profile` run on the H200, by name."""
    import json

    data = json.loads(EXAMPLE_RECORDS.read_text())
    return {r["name"]: r for r in data["records"]}


def example_run(name: str) -> ToolRun:
    """run_tools on one example record exactly as pytest_kernelpro.run.profile_stage.profile calls it."""
    record = example_records()[name]
    rep = report_from_dict(record["profile"])
    roofline = record["roofline"]
    main = next((k for k in rep.kernels if k.metrics is not None), None)
    s1 = classify(roofline.get("bound"), main.metrics if main else None)
    return run_tools(
        rep,
        s1,
        op_category=roofline.get("dominant_category"),
        min_bytes=roofline.get("min_bytes"),
        flops=roofline.get("flops"),
        roofline_fraction=record["efficiency"],
        timed_median_s=record["timing"]["stats"]["median_s"],
    )


def by_tool(run: ToolRun) -> dict[str, str]:
    """Tool name -> severity of its finding."""
    return {f.tool: f.severity for f in run.findings}
