"""Render a `ProfileReport` as the compact text section of a kernel item's pytest report."""

from __future__ import annotations

from collections.abc import Iterable

from pytest_kernelpro.profile.metrics_catalog import (
    STALL_REASONS,
    CatalogMetric,
    metrics_by_category,
    stall_metric,
)
from pytest_kernelpro.profile.model import (
    KernelMetrics,
    KernelProfile,
    ProfileReport,
    PtxasReport,
    SassSummary,
    TimelineSummary,
)

# Categories shown per kernel, with the stall reasons condensed to the largest few.
_SHOWN_CATEGORIES = ("sol", "memory", "occupancy", "launch", "scheduler", "pipes")
_TOP_STALLS = 4
_SASS_CLASSES = (
    "WGMMA",
    "MMA_SYNC",
    "TMA",
    "CP_ASYNC",
    "LOCAL",
    "SHARED_LD",
    "SHARED_ST",
    "BARRIER",
    "MUFU",
    "SHFL",
    "FFMA",
    "DFMA",
)


def format_value(value: float, unit: str) -> str:
    """A human-sized value: ns -> µs/ms, bytes -> kB/MB/GB, % with one decimal."""
    if unit == "ns":
        if abs(value) >= 1e6:
            return f"{value / 1e6:.3g} ms"
        if abs(value) >= 1e3:
            return f"{value / 1e3:.3g} us"
        return f"{value:.0f} ns"
    if unit.startswith("byte"):
        for scale, name in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(value) >= scale:
                return f"{value / scale:.3g} {name}"
        return f"{value:.0f} B"
    if unit == "%":
        return f"{value:.1f}%"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:.3g}"


def _metric_items(kernel: KernelMetrics, metrics: Iterable[CatalogMetric]) -> list[str]:
    items = []
    for metric in metrics:
        value = kernel.get(metric.name)
        if value is not None:
            items.append(f"{metric.label} {format_value(value, metric.unit)}")
    return items


def derived_metrics(kernel: KernelMetrics) -> dict[str, float]:
    """FLOP counts and sectors per request computed from the raw counters, where present."""
    derived: dict[str, float] = {}

    def op(name: str) -> float | None:
        return kernel.get(f"smsp__sass_thread_inst_executed_op_{name}_pred_on.sum")

    for label, weights in (
        ("FP32 FLOP", {"fadd": 1, "fmul": 1, "ffma": 2}),
        ("FP64 FLOP", {"dadd": 1, "dmul": 1, "dfma": 2}),
        ("FP16 FLOP", {"hadd": 2, "hmul": 2, "hfma": 4}),  # packed half2
    ):
        values = {k: op(k) for k in weights}
        if all(v is not None for v in values.values()):
            derived[label] = sum(weights[k] * float(v) for k, v in values.items() if v is not None)
    for kind in ("ld", "st"):
        sectors = kernel.get(f"l1tex__t_sectors_pipe_lsu_mem_global_op_{kind}.sum")
        requests = kernel.get(f"l1tex__t_requests_pipe_lsu_mem_global_op_{kind}.sum")
        if sectors is not None and requests:
            derived[f"sectors/request ({kind})"] = sectors / requests
    return derived


def _kernel_lines(profile: KernelProfile) -> list[str]:
    lines = [f"kernel {profile.name}"]
    kernel = profile.metrics
    if kernel is not None:
        groups = metrics_by_category()
        for category in _SHOWN_CATEGORIES:
            items = _metric_items(kernel, groups.get(category, []))
            if items:
                lines.append(f"  {category}: " + " | ".join(items))
        stalls = [(r, kernel.get(stall_metric(r))) for r in STALL_REASONS]
        top = sorted(((r, v) for r, v in stalls if v), key=lambda rv: -rv[1])[:_TOP_STALLS]
        if top:
            lines.append(
                "  stalls (% of warp cycles): " + " | ".join(f"{r} {v:.1f}%" for r, v in top)
            )
        derived = derived_metrics(kernel)
        if derived:
            lines.append(
                "  derived: " + " | ".join(f"{k} {format_value(v, '')}" for k, v in derived.items())
            )
        if kernel.missing:
            lines.append(
                f"  missing metrics: {len(kernel.missing)} ({', '.join(kernel.missing[:4])}...)"
            )
    if profile.sass is not None:
        lines.append("  " + _sass_line(profile.sass))
        if profile.sass_source:
            lines.append(f"  sass read from {profile.sass_source}")
    if profile.ptxas is not None:
        lines.append("  " + _ptxas_line(profile.ptxas))
    return lines


def _widths(widths: dict[int, int] | object) -> str:
    items = dict(widths).items() if isinstance(widths, dict) else []
    return ",".join(f"{bits}b x{count}" for bits, count in items) or "-"


def _sass_line(sass: SassSummary) -> str:
    classes = " ".join(f"{c} {sass.count(c)}" for c in _SASS_CLASSES if sass.count(c))
    return (
        f"sass: {sass.total_instructions} inst; {classes or 'no tracked classes'}; "
        f"LDG {_widths(dict(sass.global_load_widths))}; STG {_widths(dict(sass.global_store_widths))}"
    )


def _ptxas_line(ptxas: PtxasReport) -> str:
    return (
        f"ptxas ({ptxas.arch}): {ptxas.registers} regs, smem {ptxas.shared_bytes} B, "
        f"stack {ptxas.stack_frame_bytes} B, spill st/ld {ptxas.spill_store_bytes}/"
        f"{ptxas.spill_load_bytes} B"
    )


def _timeline_line(timeline: TimelineSummary) -> str:
    text = (
        f"timeline ({timeline.source}): {timeline.kernel_count} kernels in "
        f"{format_value(timeline.end_to_end_us * 1e3, 'ns')}, kernels busy "
        f"{format_value(timeline.kernel_time_us * 1e3, 'ns')}, launch overhead "
        f"{timeline.launch_overhead_share:.0%}, {timeline.sync_calls} sync calls, "
        f"{len(timeline.gaps)} gaps > {timeline.gap_threshold_us:.1f} us"
    )
    if timeline.gaps:
        worst = max(timeline.gaps, key=lambda g: g.duration_us)
        text += f" (largest {worst.duration_us:.1f} us before {worst.before_kernel[:60]})"
    return text


def render_profile_section(report: ProfileReport) -> str:
    """The per-item text: kernels (metrics by category, SASS, ptxas), timeline, linkage,
    and what was not collected and why."""
    header = f"profile ({report.arch or 'arch unknown'}, {report.wall_s:.1f} s)"
    lines = [header]
    for profile in report.kernels:
        lines += _kernel_lines(profile)
    if not report.kernels:
        lines.append("no kernel profiled")
    if report.timeline is not None:
        lines.append(_timeline_line(report.timeline))
    if report.linkage is not None and (
        report.linkage.cublas or report.linkage.cublaslt or report.linkage.cudnn
    ):
        used = [
            name
            for name, flag in (
                ("cuBLAS", report.linkage.cublas),
                ("cuBLASLt", report.linkage.cublaslt),
                ("cuDNN", report.linkage.cudnn),
            )
            if flag
        ]
        lines.append("libraries: " + ", ".join(used))
    for item in report.not_collected:
        lines.append(f"not collected: {item.what}: {item.why}")
    return "\n".join(lines)
