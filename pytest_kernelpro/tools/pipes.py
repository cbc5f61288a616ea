"""Compute-pipe tools: pipe utilization, FP64 use, FFMA fusion.

Thresholds follow Nsight Compute's HighPipeUtilization (< 20% under-utilized, >= 80% very
high) and FPInstructions (non-fused share / 2 > 0.1) rules; the FP64 tool reads the device's
FP32:FP64 ratio so a 2:1 Hopper and a 64:1 L40S are graded differently. Warp divergence is in
`divergence.py`, instruction-bound memory-bound kernels in `instructions.py`.
"""

from __future__ import annotations

from pytest_kernelpro.tools.advice import SATURATED_PIPE_ADVICE, action
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
    DADD,
    DFMA,
    DMUL,
    FADD,
    FFMA,
    FMUL,
    FP64_RATIO,
    PIPES,
    SM_THROUGHPUT,
    pipe_utilization,
    sass_count,
)


class PipeUtilizationTool(ProfilingTool):
    """A saturated compute pipe, or a compute-bound kernel whose pipes are all idle."""

    name = "pipe_utilization"
    description = "Compute pipe utilization: one pipe saturated, or all under-utilized"
    affinity = "compute"
    required_metrics = (
        PIPES["FMA (FP32)"],
        PIPES["ALU (integer/logic)"],
        MetricRequest(
            PIPES["tensor"].name,
            "tensor pipe",
            required=False,
            alternatives=PIPES["tensor"].alternatives,
        ),
        MetricRequest(PIPES["LSU (load/store)"].name, "lsu pipe", required=False),
        MetricRequest(SM_THROUGHPUT, "SM throughput", required=False),
    )
    SATURATED_PCT = 80.0
    UNDERUSED_PCT = 20.0
    LATENCY_SOL_PCT = 60.0

    def _state(
        self, ctx: ToolContext
    ) -> tuple[str, str, float, dict[str, tuple[str, float]]] | None:
        pipes = pipe_utilization(ctx)
        if not pipes:
            return None
        label, (name, top) = max(pipes.items(), key=lambda item: item[1][1])
        if top >= self.SATURATED_PCT:
            return "saturated", label, top, pipes
        sm = ctx.value(SM_THROUGHPUT)
        if (
            ctx.bottleneck == "compute"
            and top < self.UNDERUSED_PCT
            and (sm is None or sm < self.LATENCY_SOL_PCT)
        ):
            return "underused", label, top, pipes
        return None

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        state = self._state(ctx)
        if state is None:
            return None
        kind, label, top, pipes = state
        evidence = {
            name: Evidence(value, f"{lab} pipe {pct(value)} of peak", "%")
            for lab, (name, value) in sorted(pipes.items(), key=lambda item: -item[1][1])[:4]
        }
        if kind == "saturated":
            advice = SATURATED_PIPE_ADVICE[label]
            severity, cause, fix = advice.severity, advice.cause, advice.action
            lo, hi = advice.low, advice.high
            name = pipes[label][0]
            evidence[name] = Evidence(
                top, f"{label} pipe {pct(top)} >= {self.SATURATED_PCT:g}%", "%"
            )
            return self.make_finding(
                ctx,
                severity=severity,
                title=f"{label} pipe saturated ({pct(top)} of peak)",
                root_cause=f"{cause} ({pct(top)} of its peak over active cycles).",
                evidence=evidence,
                recommendations=[Recommendation(fix, lo, hi, "heuristic")],
            )
        sm = ctx.value(SM_THROUGHPUT)
        if sm is not None:
            evidence[SM_THROUGHPUT] = Evidence(
                sm, f"SM throughput {pct(sm)} < {self.LATENCY_SOL_PCT:g}%", "%"
            )
        return self.make_finding(
            ctx,
            severity="high",
            title=f"Compute-bound kernel with every pipe under {self.UNDERUSED_PCT:g}% (max: {label} {pct(top)})",
            root_cause=(
                f"The kernel is classified compute-bound, yet its busiest pipe ({label}) runs at "
                f"{pct(top)} of peak: the math units wait on something else (memory latency, "
                "too few eligible warps, synchronization). See the stall and occupancy findings."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("pipe_utilization", "feed_math_units"),
                    1.5,
                    4.0,
                    "heuristic; bound is the SM throughput headroom",
                ),
            ],
        )


class FP64Tool(ProfilingTool):
    """Double-precision math in a kernel whose data is not FP64."""

    name = "fp64_usage"
    description = (
        "FP64 instructions / FP64 pipe use, graded by the device's FP32:FP64 throughput ratio"
    )
    affinity = "always"
    required_metrics = (
        PIPES["FP64"],
        MetricRequest(DFMA, "DFMA", required=False),
        MetricRequest(DADD, "DADD", required=False),
        MetricRequest(DMUL, "DMUL", required=False),
        MetricRequest(FP64_RATIO, "FP32:FP64 ratio", required=False),
    )
    FP64_PIPE_PCT = 5.0
    FP64_SHARE_PCT = 5.0  # FP64 share of FP thread instructions
    SLOW_RATIO = 16.0  # FP32:FP64 throughput ratio from which FP64 is a "slow pipe"
    HIGH_PIPE_PCT = 20.0

    def _state(self, ctx: ToolContext) -> tuple[float, float, float]:
        pipe = ctx.value(PIPES["FP64"]) or 0.0
        dp = sum(ctx.value(n) or 0.0 for n in (DFMA, DADD, DMUL))
        sp = sum(ctx.value(n) or 0.0 for n in (FFMA, FADD, FMUL))
        share = 0.0 if dp + sp <= 0 else 100.0 * dp / (dp + sp)
        return pipe, dp, share

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        if (ctx.dtype or "").lower() in ("float64", "double", "fp64", "torch.float64"):
            return None
        pipe, dp, share = self._state(ctx)
        if not (pipe >= self.FP64_PIPE_PCT or (dp > 0 and share >= self.FP64_SHARE_PCT)):
            return None
        ratio = ctx.value(FP64_RATIO)
        slow = ratio is None or ratio >= self.SLOW_RATIO
        busy = max(pipe, share)
        if slow:
            severity = "high" if busy >= self.HIGH_PIPE_PCT else "medium"
        else:
            severity = "medium" if busy >= 50.0 else "low"
        evidence = {PIPES["FP64"].name: Evidence(pipe, f"FP64 pipe {pct(pipe)} of peak", "%")}
        if dp:
            evidence["fp64 thread instructions"] = Evidence(
                dp, f"{num(dp)} DFMA/DADD/DMUL = {pct(share)} of FP instructions"
            )
        if ratio is not None:
            evidence[FP64_RATIO] = Evidence(
                ratio, f"FP32:FP64 throughput {ratio:g}:1 on this device"
            )
        static = sass_count(ctx, "DFMA", "DADD", "DMUL")
        if static:
            evidence["sass DFMA/DADD/DMUL"] = Evidence(static, "static FP64 instructions")
        gain = min(ratio or self.SLOW_RATIO, 1.0 / max(1.0 - busy / 100.0, 0.05))
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"FP64 math in a non-FP64 kernel ({pct(share)} of FP instructions)",
            root_cause=(
                "The kernel executes double-precision instructions although its data is not "
                "FP64 - usually double literals (1.0 instead of 1.0f) or double math functions "
                f"promoting float expressions. FP64 runs at 1/{ratio:g} of the FP32 rate here."
                if ratio
                else "The kernel executes double-precision instructions although its data is not FP64."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("fp64_usage", "use_float_literals"),
                    1.0 + (gain - 1.0) / 3.0,
                    max(1.0, gain),
                    "bound: FP32:FP64 ratio, capped by the FP64 share",
                ),
            ],
        )


class FusedFmaTool(ProfilingTool):
    """Separate FADD/FMUL where FFMA would do, in a kernel whose FP32 pipe is busy."""

    name = "fma_fusion"
    description = "Non-fused FP32 add/multiply pairs while the FMA pipe is busy"
    affinity = "compute"
    required_metrics = (
        MetricRequest(FFMA, "FFMA"),
        MetricRequest(FADD, "FADD"),
        MetricRequest(FMUL, "FMUL"),
        PIPES["FMA (FP32)"],
    )
    NONFUSED_RATIO = 0.1  # Nsight Compute's FPInstructions threshold
    FMA_BUSY_PCT = 40.0

    def _ratio(self, ctx: ToolContext) -> tuple[float, float, float]:
        fused = ctx.value(FFMA) or 0.0
        nonfused = (ctx.value(FADD) or 0.0) + (ctx.value(FMUL) or 0.0)
        total = fused + nonfused
        return (0.0 if total <= 0 else nonfused / total / 2.0), fused, nonfused

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        ratio, fused, nonfused = self._ratio(ctx)
        fma = ctx.value(PIPES["FMA (FP32)"]) or 0.0
        if ratio <= self.NONFUSED_RATIO or fma < self.FMA_BUSY_PCT:
            return None
        gain = 1.0 + ratio * fma / 100.0
        return self.make_finding(
            ctx,
            severity="medium" if fma >= 60.0 and ratio >= 0.25 else "low",
            title=f"{num(nonfused)} non-fused FP32 instructions on a {pct(fma)} busy FMA pipe",
            root_cause=(
                f"The kernel executes {num(fused)} fused (FFMA) and {num(nonfused)} separate "
                f"FADD/FMUL thread instructions; pairing them into FFMA could raise FP32 "
                f"throughput by up to {pct(100 * ratio)}, and the FMA pipe is {pct(fma)} busy."
            ),
            evidence={
                FADD: Evidence(ctx.value(FADD) or 0.0, "non-fused"),
                FMUL: Evidence(ctx.value(FMUL) or 0.0, "non-fused"),
                "non-fused share / 2": Evidence(
                    round(ratio, 4), f"{ratio:.3f} > {self.NONFUSED_RATIO:g}"
                ),
            },
            recommendations=[
                Recommendation(
                    action("fma_fusion", "write_ffma"),
                    1.0,
                    max(1.0, gain),
                    "bound: non-fused share x FMA pipe utilization",
                )
            ],
        )
