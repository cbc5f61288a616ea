"""Warp divergence: few active (or predicated-on) threads per executed warp instruction.

The threshold follows Nsight Compute's ThreadDivergence rule (< 24 active threads per warp).
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
    BRANCH_UNIFORM,
    THREADS_PER_INST,
    THREADS_PER_INST_NEW,
    THREADS_PRED_ON_PER_INST,
    THREADS_PRED_ON_PER_INST_OLD,
)


class WarpDivergenceTool(ProfilingTool):
    """Few active (or predicated-on) threads per executed warp instruction."""

    name = "warp_divergence"
    description = "Thread divergence: active threads per warp instruction below 24 of 32"
    affinity = "always"
    ACTIVE = MetricRequest(
        THREADS_PER_INST, "active threads per instruction", alternatives=(THREADS_PER_INST_NEW,)
    )
    PRED_ON = MetricRequest(
        THREADS_PRED_ON_PER_INST,
        "predicated-on threads per instruction",
        required=False,
        alternatives=(THREADS_PRED_ON_PER_INST_OLD,),
    )
    required_metrics = (
        ACTIVE,
        PRED_ON,
        MetricRequest(BRANCH_UNIFORM, "uniform branch targets", required=False),
    )
    TRIGGER_THREADS = 24.0
    HIGH_THREADS = 16.0

    def _threads(self, ctx: ToolContext) -> tuple[str, float]:
        active = ctx.resolve(self.ACTIVE) or (THREADS_PER_INST, 32.0)
        pred = ctx.resolve(self.PRED_ON)
        if pred is not None and pred[1] < active[1]:
            return pred
        return active

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        name, threads = self._threads(ctx)
        if threads >= self.TRIGGER_THREADS:
            return None
        severity = "high" if threads < self.HIGH_THREADS else "medium"
        evidence = {
            name: Evidence(
                threads,
                f"{threads:.1f} of 32 threads per warp instruction < {self.TRIGGER_THREADS:g}",
            )
        }
        uniform = ctx.value(BRANCH_UNIFORM)
        if uniform is not None:
            evidence[BRANCH_UNIFORM] = Evidence(
                uniform, f"{pct(uniform)} of branches uniform across the warp", "%"
            )
        bound = 32.0 / max(threads, 1.0)
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Warp divergence: {threads:.1f} of 32 threads do useful work per instruction",
            root_cause=(
                f"On average only {threads:.1f} of 32 lanes are active (or predicated on) per warp "
                "instruction: threads of a warp take different paths (data-dependent branches, "
                "boundary checks inside loops, per-thread loop counts)."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("warp_divergence", "warp_uniform_control_flow"),
                    1.0 + (bound - 1.0) / 3.0,
                    bound,
                    "bound: 32 / active threads",
                ),
                Recommendation(
                    action("warp_divergence", "replace_short_divergent"),
                    1.05,
                    1.3,
                    "heuristic",
                ),
            ],
        )
