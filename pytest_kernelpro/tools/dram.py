"""DRAM tools: bandwidth saturation (the memory roof is reached) and L2 locality.

Split from `memory.py` (coalescing and vectorization: how accesses are shaped); these read
how much traffic reaches DRAM at all.
"""

from __future__ import annotations

from pytest_kernelpro.tools.advice import action
from pytest_kernelpro.tools.contract import (
    Evidence,
    Finding,
    MetricRequest,
    ProfilingTool,
    Recommendation,
    ToolContext,
    num,
    pct,
)
from pytest_kernelpro.tools.signals import (
    DRAM_READ,
    DRAM_REQUEST,
    DRAM_WRITE,
    L2_HIT,
    LLD_SECTORS,
    LST_SECTORS,
)


class DramSaturationTool(ProfilingTool):
    """DRAM bandwidth near its peak: access-pattern tuning is done; only fewer bytes help."""

    name = "dram_saturation"
    description = "DRAM throughput near peak: stop optimizing memory traffic patterns"
    affinity = "memory"
    required_metrics = (
        DRAM_REQUEST,
        MetricRequest(DRAM_READ, "DRAM bytes read", required=False),
        MetricRequest(DRAM_WRITE, "DRAM bytes written", required=False),
    )
    SATURATED_PCT = 80.0
    AT_MINIMUM_RATIO = 1.25  # DRAM bytes / minimal bytes considered "already minimal"

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        found = ctx.resolve(DRAM_REQUEST)
        if found is None or found[1] < self.SATURATED_PCT:
            return None
        name, dram = found
        headroom = 100.0 / max(dram, 1e-9)
        evidence = {
            name: Evidence(
                dram, f"{pct(dram)} >= {self.SATURATED_PCT:g}% of peak DRAM bandwidth", "%"
            )
        }
        moved = (ctx.value(DRAM_READ) or 0.0) + (ctx.value(DRAM_WRITE) or 0.0)
        extra = ""
        if ctx.min_bytes and moved:
            ratio = moved / ctx.min_bytes
            evidence["dram bytes / minimal bytes"] = Evidence(
                round(ratio, 3), f"{num(moved)} B moved vs {num(ctx.min_bytes)} B minimal"
            )
            if ratio <= self.AT_MINIMUM_RATIO:
                extra = (
                    f" It moves {ratio:.2f}x the minimal bytes, so it sits on the memory roofline."
                )
            else:
                extra = f" It moves {ratio:.2f}x the minimal bytes: the remaining gain is in moving fewer bytes."
        return self.make_finding(
            ctx,
            severity="low",
            title=f"DRAM bandwidth at {pct(dram)} of peak: stop optimizing memory traffic",
            root_cause=(
                f"DRAM runs at {pct(dram)} of its peak bandwidth; reordering or vectorizing "
                f"accesses can gain at most {headroom:.2f}x.{extra}"
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("dram_saturation", "reduce_bytes_instead"),
                    1.1,
                    2.0,
                    "heuristic (depends on how many bytes fusion or precision removes)",
                    bounded_by_saturation=False,
                ),
                Recommendation(
                    action("dram_saturation", "stop_optimizing_memory"),
                    1.0,
                    headroom,
                    "bound: 100 / DRAM throughput %",
                ),
            ],
        )


class L2LocalityTool(ProfilingTool):
    """DRAM traffic well above the reference's minimal bytes: data is re-fetched from DRAM."""

    name = "l2_locality"
    description = "DRAM bytes vs the minimal bytes of the reference, with the L2 hit rate"
    affinity = "memory"
    bounded_by_saturation = False
    required_inputs = ("metrics", "min_bytes")
    required_metrics = (
        MetricRequest(DRAM_READ, "DRAM bytes read"),
        MetricRequest(DRAM_WRITE, "DRAM bytes written"),
        MetricRequest(L2_HIT, "L2 hit rate", required=False),
    )
    EXCESS_RATIO = 1.5
    MEDIUM_RATIO = 2.0
    HIGH_RATIO = 4.0
    DRAM_RELEVANT_PCT = 50.0  # below this DRAM utilization, extra traffic is not the limiter yet
    DRAM_NEGLIGIBLE_PCT = 5.0  # below this the kernel barely uses DRAM: the ratio is noise

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        read, write = ctx.value(DRAM_READ), ctx.value(DRAM_WRITE)
        if read is None or write is None or not ctx.min_bytes:
            return None
        moved = read + write
        ratio = moved / ctx.min_bytes
        if ratio < self.EXCESS_RATIO:
            return None
        severity = (
            "high"
            if ratio >= self.HIGH_RATIO
            else "medium"
            if ratio >= self.MEDIUM_RATIO
            else "low"
        )
        evidence = {
            "dram bytes / minimal bytes": Evidence(
                round(ratio, 3),
                f"{num(moved)} B moved / {num(ctx.min_bytes)} B minimal = {ratio:.2f}x >= {self.EXCESS_RATIO:g}x",
            )
        }
        notes = []
        dram = ctx.resolve(DRAM_REQUEST)
        if dram is not None:
            evidence[dram[0]] = Evidence(dram[1], f"DRAM at {pct(dram[1])} of peak", "%")
            if dram[1] < self.DRAM_NEGLIGIBLE_PCT and severity != "low":
                severity = "low"
                notes.append(
                    f"Severity lowered: DRAM runs at {pct(dram[1])} of peak, so the extra "
                    f"{num(moved - ctx.min_bytes)} bytes cannot be what limits this kernel."
                )
            elif dram[1] < self.DRAM_RELEVANT_PCT and severity != "low":
                severity = "medium" if severity == "high" else "low"
                notes.append(
                    f"Severity lowered: DRAM runs at only {pct(dram[1])} of peak, so the extra "
                    "traffic is not the limiter yet; it becomes one once the other findings are fixed."
                )
        hit = ctx.value(L2_HIT)
        hit_text = ""
        if hit is not None:
            evidence[L2_HIT] = Evidence(hit, f"L2 hit rate {pct(hit)}", "%")
            hit_text = f" with an L2 hit rate of {pct(hit)}"
        local = (ctx.value(LLD_SECTORS) or 0.0) + (ctx.value(LST_SECTORS) or 0.0)
        local_text = ""
        if local > 0:
            local_text = (
                f" Part of it is local-memory traffic ({num(local)} local sectors in L1): see the "
                "register-spill finding."
            )
        bound = min(ratio, 4.0)
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"DRAM traffic is {ratio:.2f}x the minimal bytes",
            root_cause=(
                f"The kernel moves {num(moved)} bytes to/from DRAM, {ratio:.2f}x the "
                f"{num(ctx.min_bytes)} bytes the reference needs at minimum{hit_text}: data is "
                "fetched from DRAM more than once (passes over the same data, or a working set "
                f"larger than L2 between reuses).{local_text}"
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("l2_locality", "read_input_once"),
                    1.1,
                    max(1.1, bound),
                    "bound: DRAM bytes / minimal bytes, capped at 4x",
                ),
                Recommendation(
                    action("l2_locality", "improve_temporal_locality"),
                    1.05,
                    max(1.05, (1.0 + bound) / 2.0),
                    "heuristic",
                ),
            ],
            notes=notes,
        )
