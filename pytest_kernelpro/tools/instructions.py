"""Instruction overhead: a memory-bound operation whose SM (instruction) throughput is the
busier roof, so it spends more instructions per byte than the bandwidth allows.
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
    pct,
)
from pytest_kernelpro.tools.signals import (
    DRAM_REQUEST,
    ISSUE_ACTIVE,
    MEM_THROUGHPUT,
    SM_THROUGHPUT,
    pipe_utilization,
)


class InstructionOverheadTool(ProfilingTool):
    """A memory-bound operation whose SM (instruction) throughput is the busier roof."""

    name = "instruction_overhead"
    description = "Memory-bound op limited by instruction issue instead of memory bandwidth"
    affinity = "memory"
    required_metrics = (
        MetricRequest(SM_THROUGHPUT, "SM throughput"),
        MetricRequest(MEM_THROUGHPUT, "memory throughput"),
        MetricRequest(ISSUE_ACTIVE, "issue slots busy", required=False),
        MetricRequest(
            DRAM_REQUEST.name,
            "DRAM throughput",
            required=False,
            alternatives=DRAM_REQUEST.alternatives,
        ),
    )
    SM_BUSY_PCT = 60.0
    MARGIN_PCT = 10.0  # SM throughput must exceed memory throughput by this many points
    HIGH_SM_PCT = 80.0

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        if ctx.bottleneck != "memory":
            return None
        sm, mem = ctx.value(SM_THROUGHPUT), ctx.value(MEM_THROUGHPUT)
        if sm is None or mem is None or sm < self.SM_BUSY_PCT or sm - mem < self.MARGIN_PCT:
            return None
        evidence = {
            SM_THROUGHPUT: Evidence(
                sm,
                f"SM {pct(sm)} >= {self.SM_BUSY_PCT:g}% and {sm - mem:.1f} points above memory",
                "%",
            ),
            MEM_THROUGHPUT: Evidence(mem, f"memory {pct(mem)} for a memory-bound operation", "%"),
        }
        issue = ctx.value(ISSUE_ACTIVE)
        if issue is not None:
            evidence[ISSUE_ACTIVE] = Evidence(issue, f"issue slots {pct(issue)} busy", "%")
        top = sorted(pipe_utilization(ctx).items(), key=lambda item: -item[1][1])[:2]
        busiest = ", ".join(f"{label} {pct(v)}" for label, (_, v) in top)
        for _label, (name, value) in top:
            evidence[name] = Evidence(value, "busiest pipes", "%")
        bound = max(1.0, min(sm / max(mem, 1.0), 3.0))
        return self.make_finding(
            ctx,
            severity="high" if sm >= self.HIGH_SM_PCT else "medium",
            title=f"Memory-bound op limited by instructions (SM {pct(sm)} vs memory {pct(mem)})",
            root_cause=(
                f"The operation is memory-bound by its roofline, but the SMs are the busier roof "
                f"({pct(sm)} vs {pct(mem)} for memory; busiest pipes: {busiest or 'n/a'}): the "
                "kernel spends more instructions per byte than the bandwidth allows - scalar "
                "accesses, per-element index arithmetic, several passes over the data."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("instruction_overhead", "more_bytes_per_instruction"),
                    1.1,
                    bound,
                    "bound: SM / memory throughput, capped at 3x",
                ),
                Recommendation(
                    action("instruction_overhead", "cut_passes"),
                    1.05,
                    max(1.05, (1.0 + bound) / 2.0),
                    "heuristic",
                ),
            ],
        )
