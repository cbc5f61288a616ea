"""Launch-configuration tools: small grid, tail effect (partial last wave), block shape.

Nsight Compute's LaunchConfiguration rule estimates the tail effect as 1 / (1 + full waves)
whatever the size of the last wave. Here the idle share is estimated from how empty the last
wave is: (1 - partial / wave) / (full + 1), with the same uniform-block-duration assumption. A
last wave that is 90% full costs little even after one full wave.
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
    BLOCK_SIZE,
    GRID_SIZE,
    OCC_LIMITS,
    WAVES,
    occupancy_limiters,
)

SM_COUNT = MetricRequest(
    "launch__sm_count", "SMs", alternatives=("device__attribute_multiprocessor_count",)
)


def _graded(idle_pct: float, critical: float, high: float, medium: float) -> str:
    if idle_pct >= critical:
        return "critical"
    if idle_pct >= high:
        return "high"
    if idle_pct >= medium:
        return "medium"
    return "low"


class SmallGridTool(ProfilingTool):
    """Fewer blocks than SMs: part of the GPU has nothing to do."""

    name = "small_grid"
    description = "Grid smaller than the number of SMs"
    affinity = "latency"
    required_metrics = (MetricRequest(GRID_SIZE, "grid size"), SM_COUNT)
    CRITICAL_IDLE_PCT = 50.0
    HIGH_IDLE_PCT = 25.0
    MEDIUM_IDLE_PCT = 10.0

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        grid = ctx.value(GRID_SIZE)
        sms = ctx.sm_count
        if grid is None or sms is None or not 0 < grid < sms:
            return None
        idle = 100.0 * (1.0 - grid / sms)
        severity = _graded(idle, self.CRITICAL_IDLE_PCT, self.HIGH_IDLE_PCT, self.MEDIUM_IDLE_PCT)
        bound = sms / max(grid, 1.0)
        evidence = {
            GRID_SIZE: Evidence(grid, f"{num(grid)} blocks < {sms} SMs: {pct(idle)} of SMs idle"),
        }
        waves = ctx.value(WAVES)
        if waves is not None:
            evidence[WAVES] = Evidence(waves, f"{waves:.2f} waves per SM")
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Small grid: {num(grid)} blocks for {sms} SMs ({pct(idle)} of SMs idle)",
            root_cause=(
                f"The launch has {num(grid)} blocks, fewer than the {sms} SMs, so {pct(idle)} of the "
                "SMs get no work at all and the busy ones cannot hide latency with other blocks."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("small_grid", "more_blocks"),
                    1.0 + (bound - 1.0) / 2.0,
                    bound,
                    "bound: SMs / blocks (all SMs busy); low end: half of that",
                ),
                Recommendation(
                    action("small_grid", "small_problem"),
                    1.1,
                    max(1.1, bound / 2.0),
                    "heuristic",
                ),
            ],
            code_example=example("grid_stride"),
        )


class TailEffectTool(ProfilingTool):
    """A mostly empty last wave of blocks after few full waves."""

    name = "tail_effect"
    description = "Partial last wave of thread blocks (tail effect)"
    affinity = "latency"
    required_metrics = (
        MetricRequest(GRID_SIZE, "grid size"),
        SM_COUNT,
        MetricRequest(OCC_LIMITS["registers"], "blocks/SM (registers)"),
        MetricRequest(OCC_LIMITS["warps (block size)"], "blocks/SM (warps)"),
    )
    TRIGGER_IDLE_PCT = 10.0
    HIGH_IDLE_PCT = 25.0

    def _waves(self, ctx: ToolContext) -> tuple[float, float, int, int, float] | None:
        """(grid, blocks per wave, full waves, blocks in the last wave, idle %) or None."""
        grid = ctx.value(GRID_SIZE)
        sms = ctx.sm_count
        _, per_sm, _ = occupancy_limiters(ctx)
        if grid is None or sms is None or per_sm is None:
            return None
        wave = sms * per_sm
        if wave <= 0 or grid <= wave:
            return None  # a single (possibly partial) wave: small_grid / occupancy cover it
        full = int(grid // wave)
        partial = int(grid - full * wave)
        if partial == 0:
            return grid, wave, full, 0, 0.0
        idle = 100.0 * (wave - partial) / (wave * (full + 1))  # exact at round numbers
        return grid, wave, full, partial, idle

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        found = self._waves(ctx)
        if found is None or found[4] < self.TRIGGER_IDLE_PCT:
            return None
        grid, wave, full, partial, idle = found
        severity = "high" if idle >= self.HIGH_IDLE_PCT else "medium"
        fill = 100.0 * partial / wave
        evidence = {
            GRID_SIZE: Evidence(
                grid, f"{num(grid)} blocks = {full} full wave(s) of {num(wave)} + {partial}"
            ),
            "tail idle share": Evidence(
                round(idle, 2),
                f"last wave {pct(fill)} full -> ~{pct(idle)} of SM time idle >= {self.TRIGGER_IDLE_PCT:g}%",
                "%",
            ),
        }
        waves = ctx.value(WAVES)
        if waves is not None:
            evidence[WAVES] = Evidence(waves, f"{waves:.2f} waves per SM")
        bound = 1.0 / max(1.0 - idle / 100.0, 0.05)
        better = math.ceil(grid / wave) * wave
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Tail effect: last wave only {pct(fill)} full (~{pct(idle)} idle)",
            root_cause=(
                f"{num(grid)} blocks run as {full} full wave(s) of {num(wave)} blocks plus a last wave "
                f"of {partial} ({pct(fill)} full); assuming equal block durations about {pct(idle)} "
                "of SM time is idle during the tail."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("tail_effect", "wave_multiple", wave=num(wave), better=num(better)),
                    1.0 + (bound - 1.0) / 2.0,
                    bound,
                    "bound: 1/(1 - idle share)",
                ),
            ],
            code_example=example("grid_stride"),
        )


class LaunchConfigTool(ProfilingTool):
    """Block sizes that waste warp lanes or hit the per-SM block limit."""

    name = "launch_config"
    description = (
        "Block size not a multiple of 32, or blocks so small that the block limit caps occupancy"
    )
    affinity = "latency"
    required_metrics = (
        MetricRequest(BLOCK_SIZE, "block size"),
        MetricRequest(OCC_LIMITS["blocks per SM"], "blocks/SM limit", required=False),
    )
    SMALL_BLOCK_THREADS = 64.0

    def _issues(self, ctx: ToolContext) -> list[tuple[str, str, Evidence, Recommendation]]:
        block = ctx.value(BLOCK_SIZE)
        if block is None or block <= 0:
            return []
        issues = []
        if block % 32:
            warps = math.ceil(block / 32)
            wasted = 100.0 * (warps * 32 - block) / (warps * 32)
            issues.append(
                (
                    "medium",
                    f"{num(block)} threads per block is not a multiple of 32: {warps} warps "
                    f"are scheduled, {pct(wasted)} of their lanes do nothing",
                    Evidence(block, f"{num(block)} % 32 = {int(block % 32)} != 0"),
                    Recommendation(
                        action("launch_config", "warp_multiple", threads=str(warps * 32)),
                        1.0,
                        1.0 / (1.0 - wasted / 100.0),
                        "bound: wasted lanes",
                    ),
                )
            )
        limiters, _, _ = occupancy_limiters(ctx)
        if block < self.SMALL_BLOCK_THREADS and "blocks per SM" in limiters:
            issues.append(
                (
                    "medium",
                    f"blocks of {num(block)} threads hit the per-SM block limit before any other "
                    "resource, so few warps are resident",
                    Evidence(
                        block,
                        f"{num(block)} < {self.SMALL_BLOCK_THREADS:g} threads and the block limit is the tightest",
                    ),
                    Recommendation(
                        action("launch_config", "blocks_of_64_plus"), 1.1, 1.5, "heuristic"
                    ),
                )
            )
        return issues

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        issues = self._issues(ctx)
        if not issues:
            return None
        severity = min((i[0] for i in issues), key=["critical", "high", "medium", "low"].index)
        return self.make_finding(
            ctx,
            severity=severity,
            title="Launch configuration: " + "; ".join(i[1].split(":")[0] for i in issues),
            root_cause=". ".join(i[1] for i in issues) + ".",
            evidence={BLOCK_SIZE: issues[0][2]},
            recommendations=[i[3] for i in issues],
        )
