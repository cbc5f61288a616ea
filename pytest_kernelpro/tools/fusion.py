"""Unfused memory-bound work: several memory-bound kernels per call of an item.

An item that runs a chain of memory-bound kernels (an unfused softmax: max, subtract, exp,
sum, divide) moves every intermediate through DRAM. Each kernel may run near the DRAM roof
and look fine on its own; together they move several times the bytes the operation needs.
This item-scope tool adds the DRAM bytes of every profiled kernel of one call and compares
them with the reference's minimal bytes (the roofline's `min_bytes`).

Expected gain of fusing: the fused kernel moves `min_bytes` instead of the sum. At the
kernels' average bandwidth that is sum / min_bytes (the low end); at the best bandwidth any
of them reached it is sum(durations) / (min_bytes / best bandwidth) (the high end).

ncu profiles the first launch of each distinct kernel, so a kernel launched twice in a call
counts once: the sum, and the estimate, are lower bounds.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_kernelpro.tools.advice import action, example
from pytest_kernelpro.tools.contract import (
    Evidence,
    Finding,
    ProfilingTool,
    Recommendation,
    ToolContext,
    num,
    pct,
)
from pytest_kernelpro.tools.signals import DRAM_READ, DRAM_REQUEST, DRAM_WRITE, DURATION


@dataclass(frozen=True)
class KernelTraffic:
    name: str
    dram_pct: float | None
    moved: float  # DRAM bytes read + written
    duration_ns: float | None


def kernel_traffic(ctx: ToolContext) -> list[KernelTraffic]:
    """DRAM traffic of every profiled kernel of the item that has DRAM byte counters."""
    out: list[KernelTraffic] = []
    for kernel in ctx.kernels:
        m = kernel.metrics
        if m is None:
            continue
        read, write = m.get(DRAM_READ), m.get(DRAM_WRITE)
        if read is None or write is None:
            continue
        dram = next((m.get(n) for n in DRAM_REQUEST.names if m.get(n) is not None), None)
        out.append(KernelTraffic(kernel.name, dram, read + write, m.get(DURATION)))
    return out


class KernelFusionTool(ProfilingTool):
    """Several memory-bound kernels per call moving a multiple of the minimal bytes."""

    name = "kernel_fusion"
    description = (
        "Unfused multi-kernel memory-bound work: the DRAM bytes of all kernels of one call "
        "vs the minimal bytes; recommends fusing them"
    )
    affinity = "memory"
    scope = "item"
    required_inputs = ("kernels", "min_bytes")
    MIN_KERNELS = 2
    MEMORY_BOUND_DRAM_PCT = 40.0  # a kernel counts as memory-bound from this DRAM throughput
    EXCESS_RATIO = 1.5  # sum of DRAM bytes / minimal bytes to fire
    HIGH_RATIO = 2.0
    CRITICAL_RATIO = 4.0

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        if not ctx.min_bytes:
            return None
        traffic = kernel_traffic(ctx)
        bound = [
            t
            for t in traffic
            if t.dram_pct is not None and t.dram_pct >= self.MEMORY_BOUND_DRAM_PCT
        ]
        total = sum(t.moved for t in traffic)
        ratio = total / ctx.min_bytes
        if len(bound) < self.MIN_KERNELS or ratio < self.EXCESS_RATIO:
            return None
        severity = (
            "critical"
            if ratio >= self.CRITICAL_RATIO
            else "high"
            if ratio >= self.HIGH_RATIO
            else "medium"
        )
        high = ratio
        basis = "DRAM bytes of the kernels / minimal bytes"
        timed = [t for t in bound if t.duration_ns]
        durations = [t.duration_ns for t in traffic if t.duration_ns]
        evidence = {
            "memory-bound kernels per call": Evidence(
                len(bound),
                f"{len(bound)} of {len(traffic)} kernels at >= "
                f"{self.MEMORY_BOUND_DRAM_PCT:g}% of peak DRAM bandwidth (>= {self.MIN_KERNELS})",
            ),
            "dram bytes / minimal bytes": Evidence(
                round(ratio, 3),
                f"{num(total)} B over all kernels / {num(ctx.min_bytes)} B minimal = "
                f"{ratio:.2f}x >= {self.EXCESS_RATIO:g}x",
            ),
        }
        time_text = ""
        if timed and len(durations) == len(traffic):
            best = max(timed, key=lambda t: t.moved / t.duration_ns)  # type: ignore[operator]
            best_bw = best.moved / best.duration_ns  # bytes per ns = GB/s
            fused_ns = ctx.min_bytes / best_bw
            spent = sum(durations)
            high = max(ratio, spent / fused_ns)
            basis += "; sum of durations / (minimal bytes at the best kernel's bandwidth)"
            evidence["kernel time vs fused estimate"] = Evidence(
                round(spent / fused_ns, 3),
                f"{spent / 1e3:.1f} us in {len(traffic)} kernels vs ~{fused_ns / 1e3:.1f} us for "
                f"the minimal bytes at {best_bw:.0f} GB/s (the best kernel's bandwidth)",
            )
            time_text = (
                f" They run for {spent / 1e3:.1f} us; one kernel moving only the minimal bytes "
                f"at the best bandwidth reached here ({best_bw:.0f} GB/s) would take "
                f"~{fused_ns / 1e3:.1f} us."
            )
        listing = "; ".join(
            f"{_short(t.name)} {num(t.moved)} B"
            + (f" at {pct(t.dram_pct)} DRAM" if t.dram_pct is not None else "")
            for t in traffic
        )
        timeline = ctx.timeline
        if timeline is not None and timeline.kernel_names:
            evidence["timeline kernels"] = Evidence(
                len(timeline.kernel_names),
                f"{len(timeline.kernel_names)} distinct kernels, {timeline.kernel_count} launches "
                f"({timeline.source})",
            )
        return self.make_finding(
            ctx,
            severity=severity,
            title=(
                f"Unfused memory-bound work: {len(bound)} memory-bound kernels per call move "
                f"{ratio:.2f}x the minimal bytes"
            ),
            root_cause=(
                f"One call runs {len(traffic)} kernels ({listing}); together they move "
                f"{num(total)} bytes through DRAM, {ratio:.2f}x the {num(ctx.min_bytes)} bytes "
                "the operation needs: every intermediate is written to DRAM and read back by "
                "the next kernel. Each kernel can be near the DRAM roof and still the chain is "
                f"slow.{time_text}"
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("kernel_fusion", "fuse_the_chain"),
                    max(1.0, ratio),
                    max(1.0, ratio, high),
                    basis,
                    bounded_by_saturation=False,
                ),
            ],
            code_example=example("fusion"),
        )


def _short(name: str, n: int = 48) -> str:
    name = " ".join(name.split())
    return name if len(name) <= n else name[: n - 1] + "…"
