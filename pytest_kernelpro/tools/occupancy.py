"""Achieved vs theoretical occupancy, with the limiter named.

Nsight Compute has two rules here (TheoreticalOccupancy: theoretical < 80% of the hardware
maximum; AchievedOccupancy: achieved more than 10 points below theoretical). Occupancy is a
means, not a goal, so this tool grades severity by whether the schedulers actually starve
(fewer than one eligible warp per cycle) and stays low when a pipe is already busy: a wgmma
GEMM at 19% occupancy with its tensor pipe 80% busy is fine.
"""

from __future__ import annotations

import math

from pytest_kernelpro.tools.advice import action, example
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
    ACHIEVED_OCC,
    BLOCK_SIZE,
    ELIGIBLE_WARPS,
    GRID_SIZE,
    OCC_LIMITS,
    REGISTERS,
    SHARED_PER_BLOCK,
    THEORETICAL_OCC,
    WAVES,
    occupancy_limiters,
    pipe_utilization,
)


class OccupancyTool(ProfilingTool):
    """Low theoretical occupancy (limiter named) or achieved far below theoretical."""

    name = "occupancy"
    description = "Achieved vs theoretical occupancy and the resource that limits it"
    affinity = "latency"
    required_metrics = (
        MetricRequest(THEORETICAL_OCC, "theoretical occupancy"),
        MetricRequest(ACHIEVED_OCC, "achieved occupancy"),
        MetricRequest(ELIGIBLE_WARPS, "eligible warps per scheduler", required=False),
        *(MetricRequest(name, label, required=False) for label, name in OCC_LIMITS.items()),
    )
    THEORETICAL_LOW_PCT = 80.0
    ACHIEVED_GAP_PCT = 10.0
    STARVED_ELIGIBLE = 1.0  # eligible warps per scheduler per cycle
    CRITICAL_ACHIEVED_PCT = 25.0
    HIGH_ACHIEVED_PCT = 50.0
    BUSY_PIPE_PCT = 60.0

    def _severity(self, ctx: ToolContext, ach: float) -> tuple[str, str]:
        pipes = pipe_utilization(ctx)
        busy = max(
            ((label, v) for label, (_, v) in pipes.items() if not label.startswith("LSU")),
            key=lambda item: item[1],
            default=None,
        )
        if busy is not None and busy[1] >= self.BUSY_PIPE_PCT:
            return "low", (
                f"the {busy[0]} pipe is already {pct(busy[1])} busy, so more resident warps "
                "would mostly queue behind it"
            )
        eligible = ctx.value(ELIGIBLE_WARPS)
        if eligible is None or eligible >= self.STARVED_ELIGIBLE:
            return "low", "the schedulers still find an eligible warp most cycles"
        starving = f"only {eligible:.2f} eligible warps per scheduler per cycle (< {self.STARVED_ELIGIBLE:g})"
        if ach < self.CRITICAL_ACHIEVED_PCT:
            return "critical", starving
        if ach < self.HIGH_ACHIEVED_PCT:
            return "high", starving
        return "medium", starving

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        theo = ctx.value(THEORETICAL_OCC)
        ach = ctx.value(ACHIEVED_OCC)
        if theo is None or ach is None:
            return None
        if theo >= self.THEORETICAL_LOW_PCT:
            # A grid with fewer blocks than SMs explains the gap by itself: small_grid reports it.
            grid, sms = ctx.value(GRID_SIZE), ctx.sm_count
            if grid is not None and sms is not None and grid < sms:
                return None
            if theo - ach <= self.ACHIEVED_GAP_PCT:
                return None
        severity, why = self._severity(ctx, ach)
        grid, sms = ctx.value(GRID_SIZE), ctx.sm_count
        if grid is not None and sms is not None and grid < sms and severity != "low":
            # Fewer blocks than SMs: no per-SM resource matters until the grid fills the GPU,
            # and small_grid reports that.
            severity = "low"
            why = (
                f"the grid has only {num(grid)} blocks for {sms} SMs, so the per-SM limits "
                "do not bind yet (see small_grid)"
            )
        limiters, blocks_per_sm, limits = occupancy_limiters(ctx)
        evidence: dict[str, Evidence] = {}
        recs: list[Recommendation] = []
        causes: list[str] = []
        code = None
        gap = theo - ach
        waves = ctx.value(WAVES)
        grid = ctx.value(GRID_SIZE)
        if theo < self.THEORETICAL_LOW_PCT:
            evidence[THEORETICAL_OCC] = Evidence(
                theo, f"{pct(theo)} < {self.THEORETICAL_LOW_PCT:g}% of the hardware maximum", "%"
            )
            for label in limiters:
                evidence[OCC_LIMITS[label]] = Evidence(
                    limits[label], f"{num(limits[label])} blocks/SM: the tightest limit"
                )
            detail = self._limiter_detail(ctx, limiters, blocks_per_sm)
            causes.append(
                f"theoretical occupancy is {pct(theo)}, limited by {' and '.join(limiters) or 'an unknown resource'}"
                f"{detail}"
            )
            recs.extend(self._limiter_recs(ctx, limiters, blocks_per_sm))
            if "registers" in limiters:
                code = example("launch_bounds")
        if gap > self.ACHIEVED_GAP_PCT:
            evidence[ACHIEVED_OCC] = Evidence(
                ach,
                f"{pct(ach)} is {gap:.1f} points below theoretical {pct(theo)} (> {self.ACHIEVED_GAP_PCT:g})",
                "%",
            )
            sms = ctx.sm_count
            if waves is not None and waves < 1.0 and grid is not None:
                evidence[WAVES] = Evidence(
                    waves, f"{waves:.2f} waves < 1: the grid does not fill the GPU once"
                )
                causes.append(
                    f"achieved occupancy is only {pct(ach)} because the grid is too small: "
                    f"{num(grid)} blocks{f' for {sms} SMs' if sms else ''} ({waves:.2f} waves)"
                )
                recs.append(
                    Recommendation(
                        action("occupancy", "launch_more_smaller"),
                        1.5,
                        max(1.5, min(theo / max(ach, 1e-6), 8.0)),
                        "bound: theoretical/achieved occupancy, capped at 8x",
                    )
                )
            else:
                causes.append(
                    f"achieved occupancy is {pct(ach)} against a theoretical {pct(theo)}: warps "
                    "or blocks finish unevenly (load imbalance, a partial last wave) or blocks "
                    "are too short-lived to keep the SMs full"
                )
                recs.append(
                    Recommendation(
                        action("occupancy", "balance_work_across"),
                        1.05,
                        max(1.05, min(theo / max(ach, 1e-6), 2.0)),
                        "bound: theoretical/achieved occupancy, capped at 2x",
                    )
                )
        eligible = ctx.value(ELIGIBLE_WARPS)
        if eligible is not None:
            evidence[ELIGIBLE_WARPS] = Evidence(
                eligible, f"{eligible:.2f} eligible warps per scheduler per cycle"
            )
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Occupancy: achieved {pct(ach)} of theoretical {pct(theo)}",
            root_cause="; ".join(causes) + f". Severity {severity}: {why}.",
            evidence=evidence,
            recommendations=recs,
            code_example=code,
        )

    def _limiter_detail(self, ctx: ToolContext, limiters: list[str], blocks: float | None) -> str:
        parts = []
        block = ctx.value(BLOCK_SIZE)
        if "registers" in limiters:
            regs = ctx.value(REGISTERS)
            if regs is not None:
                parts.append(f"{num(regs)} registers/thread")
        if "shared memory" in limiters:
            smem = ctx.value(SHARED_PER_BLOCK)
            if smem is not None:
                parts.append(f"{num(smem)} bytes of shared memory per block")
        if block is not None and blocks is not None:
            parts.append(f"{num(blocks)} block(s) of {num(block)} threads per SM")
        return f" ({', '.join(parts)})" if parts else ""

    def _limiter_recs(
        self, ctx: ToolContext, limiters: list[str], blocks: float | None
    ) -> list[Recommendation]:
        recs: list[Recommendation] = []
        block = ctx.value(BLOCK_SIZE)
        if "registers" in limiters:
            target = ""
            regs_per_sm = ctx.value("device__attribute_max_registers_per_multiprocessor")
            if block and blocks is not None and regs_per_sm:
                # Registers are allocated per warp in units of 8 per thread.
                need = math.floor(regs_per_sm / (math.ceil(block / 32) * 32 * (blocks + 1)) / 8) * 8
                if need > 0:
                    target = f" (at most {need} registers/thread fits {num(blocks + 1)} blocks/SM)"
            recs.append(
                Recommendation(
                    action("occupancy", "cap_registers", target=target),
                    1.05,
                    1.4,
                    "heuristic",
                )
            )
        if "shared memory" in limiters:
            recs.append(
                Recommendation(
                    action("occupancy", "use_less_shared"),
                    1.05,
                    1.4,
                    "heuristic",
                )
            )
        if "blocks per SM" in limiters:
            recs.append(
                Recommendation(
                    action("occupancy", "use_larger_blocks"),
                    1.1,
                    1.5,
                    "heuristic",
                )
            )
        if "warps (block size)" in limiters:
            recs.append(
                Recommendation(
                    action("occupancy", "pick_block_size"),
                    1.05,
                    1.3,
                    "heuristic",
                )
            )
        return recs
