"""Arithmetic beyond the reference's FLOPs on a compute-bound kernel.

ncu counts the floating-point instructions a kernel executes (per thread, predicated on);
the roofline knows how many FLOPs the operation needs. On a compute-bound kernel a large
ratio is work that can be removed: a division expanded into a reciprocal plus Newton
iterations every iteration (`acc = fma(acc, v, 1.0 / (k + 1))`), loop-invariant math left
in the loop, values recomputed instead of kept. Tensor-core math is not in these counters,
so a tensor-core GEMM measures ~0 and never fires; memory-bound kernels are skipped
(affinity): their extra instructions are hidden behind DRAM.
"""

from __future__ import annotations

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
from pytest_kernelpro.tools.signals import DADD, DFMA, DMUL, FADD, FFMA, FMUL, PIPES

HFMA = "smsp__sass_thread_inst_executed_op_hfma_pred_on.sum"
HADD = "smsp__sass_thread_inst_executed_op_hadd_pred_on.sum"
HMUL = "smsp__sass_thread_inst_executed_op_hmul_pred_on.sum"
# FLOPs per thread instruction (as ncu's SOLFPRoofline and profile.render: FMA = 2, half2 x2).
FLOP_WEIGHTS: dict[str, tuple[str, float]] = {
    FFMA: ("FP32", 2.0),
    FADD: ("FP32", 1.0),
    FMUL: ("FP32", 1.0),
    DFMA: ("FP64", 2.0),
    DADD: ("FP64", 1.0),
    DMUL: ("FP64", 1.0),
    HFMA: ("FP16", 4.0),
    HADD: ("FP16", 2.0),
    HMUL: ("FP16", 2.0),
}


HALF_DTYPES = ("float16", "bfloat16", "half", "torch.float16", "torch.bfloat16", "fp16", "bf16")


def measured_flops(ctx: ToolContext) -> dict[str, float]:
    """Precision -> FLOPs executed, from the per-thread instruction counters present.

    FP16 counts only for half-precision operations: compilers use HFMA2.MMA as a register
    move, which the HFMA counter includes (the capture's FP32 naive matmul "executes"
    16,777,216 FP16 FLOPs).
    """
    half = (ctx.dtype or "").lower() in HALF_DTYPES
    out: dict[str, float] = {}
    for name, (precision, weight) in FLOP_WEIGHTS.items():
        if precision == "FP16" and not half:
            continue
        value = ctx.value(name)
        if value is not None:
            out[precision] = out.get(precision, 0.0) + weight * value
    return out


class FlopOverheadTool(ProfilingTool):
    """A compute-bound kernel executing several times the FLOPs its operation needs."""

    name = "flop_overhead"
    description = "Executed FP32/FP64/FP16 FLOPs vs the reference's FLOPs on compute-bound kernels"
    affinity = "compute"
    required_inputs = ("metrics", "flops")
    required_metrics = (
        MetricRequest(FFMA, "FFMA"),
        *(
            MetricRequest(n, n.split("_op_")[1].split("_")[0], required=False)
            for n in FLOP_WEIGHTS
            if n != FFMA
        ),
        MetricRequest(PIPES["FMA (FP32)"].name, "FMA pipe", required=False),
        MetricRequest(PIPES["FP64"].name, "FP64 pipe", required=False),
    )
    TRIGGER_RATIO = 1.5
    HIGH_RATIO = 3.0
    BUSY_PIPE_PCT = 40.0  # below this the extra math is not what limits the kernel

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        if not ctx.flops:
            return None
        flops = measured_flops(ctx)
        total = sum(flops.values())
        ratio = total / ctx.flops
        if ratio < self.TRIGGER_RATIO:
            return None
        pipes = {label: ctx.value(PIPES[label].name) for label in ("FMA (FP32)", "FP64")}
        busy = max(
            ((k, v) for k, v in pipes.items() if v is not None), key=lambda kv: kv[1], default=None
        )
        if busy is None or busy[1] < self.BUSY_PIPE_PCT:
            severity = "low"
        else:
            severity = "high" if ratio >= self.HIGH_RATIO else "medium"
        split = ", ".join(f"{p} {num(v)}" for p, v in flops.items() if v)
        evidence = {
            "executed FLOPs / reference FLOPs": Evidence(
                round(ratio, 3),
                f"{num(total)} executed ({split}) / {num(ctx.flops)} needed = {ratio:.2f}x "
                f">= {self.TRIGGER_RATIO:g}x",
            )
        }
        if busy is not None:
            evidence[PIPES[busy[0]].name] = Evidence(
                busy[1],
                f"{busy[0]} pipe {pct(busy[1])} busy "
                + (
                    f">= {self.BUSY_PIPE_PCT:g}%"
                    if busy[1] >= self.BUSY_PIPE_PCT
                    else f"< {self.BUSY_PIPE_PCT:g}%: not the limiter"
                ),
                "%",
            )
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"Arithmetic overhead: {ratio:.1f}x the FLOPs the operation needs",
            root_cause=(
                f"The kernel executes {num(total)} floating-point operations ({split}; an FMA "
                f"counts 2) where the operation needs {num(ctx.flops)}: {ratio:.1f}x. On a "
                "compute-bound kernel that is removable work - a division or transcendental "
                "expanded into a reciprocal plus Newton iterations inside the loop, "
                "loop-invariant math not hoisted, values recomputed instead of kept."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("flop_overhead", "hoist_loop_invariant"),
                    1.0 + (ratio - 1.0) / 3.0,
                    ratio,
                    "bound: executed / needed FLOPs",
                ),
                Recommendation(
                    action("flop_overhead", "where_accuracy_allows"),
                    1.05,
                    max(1.05, min(ratio, 1.5)),
                    "heuristic",
                ),
            ],
            code_example=example("reciprocal") if "FP64" in flops and flops["FP64"] else None,
        )
