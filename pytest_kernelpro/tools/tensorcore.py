"""Tensor-core tools: matrix work on CUDA cores, and Ampere-style HMMA on Hopper.

SASS is the definitive source (ncu cannot tell HMMA from wgmma from "no tensor cores" by a
single number): HGMMA/IGMMA/QGMMA/BGMMA are warpgroup MMAs (wgmma), HMMA/IMMA/DMMA/BMMA are
mma.sync. Without SASS the tools fall back to ncu: the tensor pipe's active cycles and the
warpgroup-MMA instruction count. ncu's `sm__inst_executed_pipe_tensor_op_hmma` is not used as
proof of tensor-core use: on Hopper it also counts HFMA2.MMA moves (the fixture's FP32 naive
matmul shows one per warp).
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
from pytest_kernelpro.tools.signals import (
    FFMA,
    GMMA_INST,
    MMA_SYNC_OPS,
    PIPES,
    TENSOR_OPS,
    TENSOR_PIPE,
    WGMMA_OPS,
    sass_count,
)

MATRIX_OPS = frozenset(
    {"gemm", "matmul", "mm", "bmm", "linear", "conv", "convolution", "attention"}
)
FMA_PIPE = PIPES["FMA (FP32)"]


def tensor_usage(ctx: ToolContext) -> tuple[bool | None, str]:
    """(whether tensor-core instructions are used, how that was decided); None if unknown."""
    count = sass_count(ctx, *TENSOR_OPS)
    if count is not None:
        return count > 0, f"SASS tensor-core instructions ({'/'.join(TENSOR_OPS)}): {count}"
    pipe = ctx.value(TENSOR_PIPE)
    gmma = ctx.value(GMMA_INST)
    if pipe is None and gmma is None:
        return None, "no SASS and no tensor-pipe metrics"
    used = (pipe or 0.0) >= TensorCoreUnderutilizationTool.TENSOR_ACTIVE_PCT or (gmma or 0.0) > 0
    return used, f"ncu tensor pipe {pct(pipe or 0.0)} active, {num(gmma or 0.0)} wgmma instructions"


class TensorCoreUnderutilizationTool(ProfilingTool):
    """Compute-bound matrix work running on CUDA cores only."""

    name = "tensor_core_underuse"
    description = "Matrix work without tensor-core instructions (CUDA-core-only SASS); cuBLAS linkage recognised"
    affinity = "compute"
    bounded_by_saturation = False  # tensor cores move the compute roof itself
    required_metrics = (
        MetricRequest(
            TENSOR_PIPE.name, "tensor pipe", required=False, alternatives=TENSOR_PIPE.alternatives
        ),
        MetricRequest(FMA_PIPE.name, "FMA pipe", required=False),
        MetricRequest(FFMA, "FFMA thread instructions", required=False),
    )
    TENSOR_ACTIVE_PCT = 1.0  # tensor pipe busier than this counts as "tensor cores used"
    FMA_BUSY_PCT = 30.0  # unknown op: FP32 FMA pipe this busy suggests dense math

    def missing_inputs(self, ctx: ToolContext) -> list[str]:
        missing = super().missing_inputs(ctx)
        if not missing and tensor_usage(ctx)[0] is None:
            missing.append(f"sass (or {TENSOR_PIPE.name} / {GMMA_INST})")
        return missing

    def _library(self, ctx: ToolContext) -> str | None:
        if ctx.links_blas:
            return "the module links cuBLAS"
        lib = ctx.library_match
        return None if lib is None else f"the kernel is a library kernel ({lib})"

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        used, how = tensor_usage(ctx)
        if used is not False or self._library(ctx):
            return None
        op = (ctx.op_category or "").lower()
        matrix = op in MATRIX_OPS
        if not matrix:
            fma_busy = ctx.value(FMA_PIPE)
            if (
                op
                or ctx.bottleneck != "compute"
                or fma_busy is None
                or fma_busy < self.FMA_BUSY_PCT
            ):
                return None
        if matrix:
            severity = "critical" if ctx.bottleneck == "compute" else "high"
        else:
            severity = "medium"
        evidence = {"tensor-core instructions": Evidence(0, how)}
        fma = ctx.resolve(FMA_PIPE)
        if fma is not None:
            evidence[fma[0]] = Evidence(
                fma[1], f"FP32 FMA pipe {pct(fma[1])} busy: the math runs on CUDA cores", "%"
            )
        ffma = ctx.value(FFMA)
        if ffma:
            evidence[FFMA] = Evidence(ffma, f"{num(ffma)} FFMA thread instructions")
        what = (
            f"a {op} (matrix multiply-accumulate)"
            if matrix
            else "dense FP32 FMA work in a compute-bound kernel"
        )
        hopper = ctx.is_hopper
        return self.make_finding(
            ctx,
            severity=severity,
            title=f"No tensor cores for {op or 'FMA-heavy'} work ({'compute-bound' if ctx.bottleneck == 'compute' else ctx.bottleneck or 'unclassified'})",
            root_cause=(
                f"This is {what}, but the kernel issues no tensor-core instructions ({how}): every "
                "multiply-add runs on the FP32 CUDA cores, whose peak is roughly an order of "
                "magnitude below the tensor cores' TF32/BF16 peak on Ampere and Hopper."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("tensor_core_underuse", "call_library_gemm"),
                    2.0,
                    8.0,
                    "heuristic; TF32/BF16 tensor peak is ~7-15x the FP32 FMA peak on A100/H100",
                ),
                Recommendation(
                    action(
                        "tensor_core_underuse",
                        "tensor_core_instructions_sm90" if hopper else "tensor_core_instructions",
                    ),
                    1.5,
                    6.0,
                    "heuristic",
                ),
                Recommendation(
                    action("tensor_core_underuse", "fp32_accuracy_required"),
                    1.5,
                    3.0,
                    "heuristic",
                ),
            ],
            code_example=example("wgmma") if hopper else example("wmma"),
        )


class WGMMAInstructionTool(ProfilingTool):
    """Hopper kernels using mma.sync (HMMA) where warpgroup MMA (wgmma) is available."""

    name = "wgmma_vs_hmma"
    description = "On Hopper: HMMA (mma.sync) present, no HGMMA (wgmma)"
    affinity = "compute"
    bounded_by_saturation = False
    required_inputs = ()
    required_metrics = (
        MetricRequest(
            TENSOR_PIPE.name, "tensor pipe", required=False, alternatives=TENSOR_PIPE.alternatives
        ),
        MetricRequest(GMMA_INST, "wgmma instructions", required=False),
    )
    TENSOR_ACTIVE_PCT = 1.0

    def missing_inputs(self, ctx: ToolContext) -> list[str]:
        if ctx.sass is not None:
            return []
        if ctx.metrics is None:
            return ["sass", "metrics"]
        missing = []
        if ctx.resolve(TENSOR_PIPE) is None:
            missing.append(TENSOR_PIPE.name)
        if ctx.value(GMMA_INST) is None:
            missing.append(GMMA_INST)
        return [f"sass (or {' and '.join(missing)})"] if missing else []

    def _state(self, ctx: ToolContext) -> tuple[int | float, int | float, str] | None:
        """(mma.sync evidence, wgmma evidence, source)."""
        hmma = sass_count(ctx, *MMA_SYNC_OPS)
        wgmma = sass_count(ctx, *WGMMA_OPS)
        if hmma is not None and wgmma is not None:
            return hmma, wgmma, "sass"
        pipe, gmma = ctx.value(TENSOR_PIPE), ctx.value(GMMA_INST)
        if pipe is None or gmma is None:
            return None
        return pipe, gmma, "ncu"

    def evaluate(self, ctx: ToolContext) -> Finding | None:
        if not ctx.is_hopper or ctx.library_match is not None:
            return None
        state = self._state(ctx)
        if state is None:
            return None
        hmma, wgmma, source = state
        floor = 0 if source == "sass" else self.TENSOR_ACTIVE_PCT
        if wgmma != 0 or not (hmma > floor if source == "sass" else hmma >= floor):
            return None
        evidence: dict[str, Evidence] = {}
        if source == "sass":
            evidence["sass HMMA/IMMA (mma.sync)"] = Evidence(int(hmma), f"{int(hmma)} > 0")
            evidence["sass HGMMA/IGMMA/QGMMA (wgmma)"] = Evidence(0, "0 on sm_90")
        pipe = ctx.resolve(TENSOR_PIPE)
        if pipe is not None:
            evidence[pipe[0]] = Evidence(pipe[1], f"tensor pipe {pct(pipe[1])} active", "%")
        gmma = ctx.value(GMMA_INST)
        if gmma is not None:
            evidence[GMMA_INST] = Evidence(gmma, f"{num(gmma)} warpgroup MMA instructions executed")
        notes = []
        if ctx.arch and not ctx.arch.lower().endswith("a"):
            notes.append(
                f"Built for {ctx.arch}: wgmma and TMA need the arch-specific target sm_90a."
            )
        return self.make_finding(
            ctx,
            severity="high",
            title="Hopper kernel uses HMMA (mma.sync) but no wgmma",
            root_cause=(
                "The kernel runs on Hopper (sm_90) with Ampere-style warp-level MMA (HMMA, from "
                "WMMA or mma.sync) and no warpgroup MMA: HMMA issues small 16x8x16 tiles per warp "
                "from registers, while wgmma (HGMMA) issues 64xNx16 tiles per warpgroup straight "
                "from shared memory and is what reaches Hopper's tensor-core peak."
            ),
            evidence=evidence,
            recommendations=[
                Recommendation(
                    action("wgmma_vs_hmma", "switch_mma_wgmma"),
                    1.3,
                    1.5,
                    "KernelPro paper (WGMMAInstructionTool estimate)",
                ),
                Recommendation(
                    action("wgmma_vs_hmma", "staying_mma_sync"),
                    1.1,
                    1.3,
                    "heuristic",
                ),
            ],
            code_example=example("wgmma"),
            notes=notes,
        )
