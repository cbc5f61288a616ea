"""Timeline tools (once per item): launch overhead and host synchronization.

They read the `TimelineSummary` the profiler built from nsys or kineto: the share of
end-to-end time not covered by kernels, the sync calls, and the gaps the profiler flagged
(larger than max(1% of end-to-end time, 5 us), design §3.3).
"""

from __future__ import annotations

from pytest_kernelpro.tools.advice import action, example
from pytest_kernelpro.tools.contract import (
    Evidence,
    Finding,
    ProfilingTool,
    Recommendation,
    ToolContext,
    pct,
)
from pytest_kernelpro.tools.signals import SECONDS_PER_UNIT


def _graded(value: float, critical: float, high: float) -> str:
    return "critical" if value >= critical else "high" if value >= high else "medium"


def _gpu_busy_share(ctx: ToolContext) -> float | None:
    """Sum of the item's kernel durations (ncu, one call) over its timed median, or None."""
    if not ctx.timed_median_s or not ctx.kernels:
        return None
    seconds = []
    for kernel in ctx.kernels:
        entry = kernel.metrics.metrics.get("gpu__time_duration.sum") if kernel.metrics else None
        scale = SECONDS_PER_UNIT.get(entry.unit if entry else "", None)
        if entry is None or scale is None or isinstance(entry.value, str):
            return None
        seconds.append(float(entry.value) * scale)
    return min(1.0, sum(seconds) / ctx.timed_median_s)


class LaunchOverheadTool(ProfilingTool):
    """End-to-end time dominated by launch overhead rather than kernel execution."""

    name = "launch_overhead"
    description = "Share of end-to-end time not covered by kernels (launch overhead)"
    affinity = "timeline"
    scope = "item"
    required_inputs = ("timeline",)
    TRIGGER_PCT = 20.0
    HIGH_PCT = 40.0
    CRITICAL_PCT = 60.0
    # When the item's timed loop (CUDA events, calls back to back) already reaches this share
    # of its roofline, the GPU did not wait for the host there: the timeline's idle share is
    # host time between the profiled calls (the profiler's own overhead included).
    TIMED_ROOFLINE_PCT = 80.0

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        tl = ctx.timeline
        if tl is None:
            return None
        share = 100.0 * tl.launch_overhead_share
        if share < self.TRIGGER_PCT:
            return None
        severity = _graded(share, self.CRITICAL_PCT, self.HIGH_PCT)
        notes = []
        timed = None if ctx.roofline_fraction is None else 100.0 * ctx.roofline_fraction
        if timed is not None and timed >= self.TIMED_ROOFLINE_PCT:
            notes.append(
                f"Severity lowered from {severity} to low: timed with calls back to back, the "
                f"item reaches {pct(timed)} of its roofline, so there the GPU did not wait for "
                "the host. The idle share is host time between the profiled calls (kineto's "
                "own overhead included); it matters when the caller launches this op one call "
                "at a time between host work."
            )
            severity = "low"
        busy = _gpu_busy_share(ctx)
        if severity != "low" and busy is not None and 100.0 * busy >= self.TIMED_ROOFLINE_PCT:
            notes.append(
                f"Severity lowered from {severity} to low: the item's own kernels (ncu "
                f"durations) fill {pct(100.0 * busy)} of its timed median, so when it is "
                "called back to back the GPU does not wait for the host; the idle share is "
                "host time between the profiled calls."
            )
            severity = "low"
        per_kernel = tl.kernel_time_us / tl.kernel_count if tl.kernel_count else 0.0
        bound = 1.0 / max(1.0 - share / 100.0, 0.05)
        # The timeline replays the item several times: its launches are repetitions, and only
        # distinct kernels of one call can be fused.
        distinct = len(tl.kernel_names)
        recs = [
            Recommendation(
                action("launch_overhead", "capture_launches_cuda"),
                1.0 + (bound - 1.0) / 2.0,
                bound,
                "bound: 1/(1 - overhead share)",
            )
        ]
        if distinct >= 2:
            recs.append(
                Recommendation(
                    action("launch_overhead", "fuse_distinct_kernels", distinct=str(distinct)),
                    1.0 + (bound - 1.0) / 3.0,
                    bound,
                    "bound: 1/(1 - overhead share)",
                )
            )
        elif distinct == 1:
            recs.append(
                Recommendation(
                    action("launch_overhead", "give_launch_more"),
                    1.0 + (bound - 1.0) / 3.0,
                    bound,
                    "bound: 1/(1 - overhead share)",
                )
            )
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Launch overhead: {pct(share)} of end-to-end time is outside kernels",
            root_cause=(
                f"Over {tl.end_to_end_us:.1f} us end to end ({tl.source}), kernels run for "
                f"{tl.kernel_time_us:.1f} us in {tl.kernel_count} launches ({per_kernel:.1f} us "
                f"each): {pct(share)} of the time the GPU waits for the host to launch work."
            ),
            evidence={
                "launch_overhead_share": Evidence(
                    round(share, 2), f"{pct(share)} >= {self.TRIGGER_PCT:g}%", "%"
                ),
                "kernel_count": Evidence(tl.kernel_count, f"{tl.kernel_count} kernel launches"),
            },
            recommendations=recs,
            code_example=example("cuda_graph"),
            notes=notes,
        )


class SynchronizationTool(ProfilingTool):
    """Host synchronizations and idle gaps between kernels."""

    name = "synchronization"
    description = "Host sync calls and flagged idle gaps between kernels"
    affinity = "timeline"
    scope = "item"
    required_inputs = ("timeline",)
    GAP_PCT = 10.0  # total flagged gap time, % of end-to-end
    HIGH_GAP_PCT = 30.0
    CRITICAL_GAP_PCT = 60.0

    def _gap_share(self, ctx: ToolContext) -> float:
        tl = ctx.timeline
        if tl is None or tl.end_to_end_us <= 0:
            return 0.0
        return 100.0 * sum(g.duration_us for g in tl.gaps) / tl.end_to_end_us

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        tl = ctx.timeline
        if tl is None:
            return None
        share = self._gap_share(ctx)
        if not ((tl.sync_calls > 0 and bool(tl.gaps)) or share >= self.GAP_PCT):
            return None
        severity = (
            _graded(share, self.CRITICAL_GAP_PCT, self.HIGH_GAP_PCT)
            if share >= self.GAP_PCT
            else "low"
        )
        worst = max(tl.gaps, key=lambda g: g.duration_us, default=None)
        where = (
            f"; the largest ({worst.duration_us:.1f} us) precedes {worst.before_kernel}"
            if worst
            else ""
        )
        bound = 1.0 / max(1.0 - share / 100.0, 0.05)
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"{tl.sync_calls} host sync call(s), {len(tl.gaps)} idle gap(s) ({pct(share)} of time)",
            root_cause=(
                f"The GPU sits idle between kernels: {len(tl.gaps)} gap(s) above "
                f"{tl.gap_threshold_us:.1f} us add up to {pct(share)} of end-to-end time{where}. "
                f"{tl.sync_calls} synchronizing call(s) (cudaDeviceSynchronize / "
                "cudaStreamSynchronize, .item(), .cpu(), blocking copies) make the host wait "
                "for the GPU and then the GPU wait for the host."
            ),
            evidence={
                "sync_calls": Evidence(tl.sync_calls, f"{tl.sync_calls} synchronizing calls"),
                "gap share": Evidence(
                    round(share, 2),
                    f"{pct(share)} of {tl.end_to_end_us:.1f} us in flagged gaps",
                    "%",
                ),
            },
            recommendations=[
                Recommendation(
                    action("synchronization", "remove_host_syncs"),
                    1.0 + (bound - 1.0) / 2.0,
                    max(1.0, bound),
                    "bound: 1/(1 - gap share)",
                ),
            ],
        )
