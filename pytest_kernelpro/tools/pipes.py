"""Instruction-execution tools: pipe utilization, FP64 use, FFMA fusion, warp divergence.

Thresholds follow Nsight Compute's HighPipeUtilization (< 20% under-utilized, >= 80% very
high), FPInstructions (non-fused share / 2 > 0.1) and ThreadDivergence (< 24 active threads
per warp) rules; the FP64 tool reads the device's FP32:FP64 ratio so a 2:1 Hopper and a 64:1
L40S are graded differently.
"""

from __future__ import annotations

from pytest_kernelpro.tools.advice import SATURATED_PIPE_ADVICE
from pytest_kernelpro.tools.base import (
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
    BRANCH_UNIFORM,
    DADD,
    DFMA,
    DMUL,
    DRAM_REQUEST,
    FADD,
    FFMA,
    FMUL,
    FP64_RATIO,
    ISSUE_ACTIVE,
    MEM_THROUGHPUT,
    PIPES,
    SM_THROUGHPUT,
    THREADS_PER_INST,
    THREADS_PER_INST_NEW,
    THREADS_PRED_ON_PER_INST,
    THREADS_PRED_ON_PER_INST_OLD,
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
            severity, cause, action = advice.severity, advice.cause, advice.action
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
                recommendations=[Recommendation(action, lo, hi, "heuristic")],
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
                    "Feed the math units: stage operands in shared memory/registers, keep more "
                    "independent work per warp (ILP) and more warps per SM",
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
                    "Use float literals (0.5f) and float functions (expf, sqrtf, __expf); compile "
                    "with -Xptxas --warn-on-double-precision-use to find the promotions",
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
                    "Write a * b + c (or fmaf) so the compiler emits FFMA; do not build with "
                    "-fmad=false; restructure (x - m) * s as fmaf(x, s, -m * s)",
                    1.0,
                    max(1.0, gain),
                    "bound: non-fused share x FMA pipe utilization",
                )
            ],
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
                    "Make control flow warp-uniform: assign work so all 32 lanes take the same "
                    "path (sort/bucket items by path, one warp per item), pad to avoid boundary "
                    "branches in the inner loop",
                    1.0 + (bound - 1.0) / 3.0,
                    bound,
                    "bound: 32 / active threads",
                ),
                Recommendation(
                    "Replace short divergent branches with predicated selects",
                    1.05,
                    1.3,
                    "heuristic",
                ),
            ],
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
                    "Do more bytes per instruction: 128-bit accesses, several elements per "
                    "thread, loop-invariant address arithmetic hoisted (32-bit indices)",
                    1.1,
                    bound,
                    "bound: SM / memory throughput, capped at 3x",
                ),
                Recommendation(
                    "Cut passes and per-element work: one read of each element (online "
                    "algorithms), warp shuffles for reductions, fast intrinsics",
                    1.05,
                    max(1.05, (1.0 + bound) / 2.0),
                    "heuristic",
                ),
            ],
        )
