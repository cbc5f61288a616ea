"""FlopOverheadTool: executed FLOPs vs the reference's FLOPs on compute-bound kernels."""

from __future__ import annotations

import pytest
from tools_factories import capture, capture_ctx, ctx, report, stage

from pytest_kernelpro.tools.registry import run_tools
from pytest_kernelpro.tools.signals import DFMA, FADD, FFMA, FMUL, PIPES
from pytest_kernelpro.tools.work import HFMA, FlopOverheadTool, measured_flops

FMA_PIPE = PIPES["FMA (FP32)"].name


def fp32(ffma: float, pipe: float = 60.0, **kw: object):  # noqa: ANN201
    """A kernel executing `ffma` FFMAs (2 FLOPs each) against 1000 needed FLOPs."""
    values = {FFMA: ffma, FADD: 0.0, FMUL: 0.0, FMA_PIPE: pipe}
    return ctx(values, flops=1000.0, **kw)


@pytest.mark.parametrize(
    ("ffma", "expected"),
    [(745.0, None), (750.0, "medium"), (1495.0, "medium"), (1500.0, "high")],
)
def test_flop_overhead_thresholds(ffma: float, expected: str | None) -> None:
    c = fp32(ffma)
    tool = FlopOverheadTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert f.recommendations[0].high == pytest.approx(2 * ffma / 1000)


@pytest.mark.parametrize(("pipe", "expected"), [(39.9, "low"), (40.0, "high")])
def test_extra_math_matters_only_on_a_busy_pipe(pipe: float, expected: str) -> None:
    assert FlopOverheadTool().analyze(fp32(2000.0, pipe=pipe)).severity == expected


def test_fp16_counts_only_for_half_precision_ops() -> None:
    # HFMA2.MMA is a register move the HFMA counter includes: not FLOPs of an fp32 op.
    values = {FFMA: 500.0, FADD: 0.0, FMUL: 0.0, HFMA: 1000.0}
    assert measured_flops(ctx(values, dtype="float32")) == {"FP32": 1000.0}
    assert measured_flops(ctx(values, dtype="bfloat16")) == {"FP32": 1000.0, "FP16": 4000.0}


def test_inputs_and_affinity() -> None:
    values = {FFMA: 5000.0, FADD: 0.0, FMUL: 0.0}
    run = run_tools(report(values), stage("compute"), tools=["flop_overhead"])
    assert run.skipped[0].missing == ("flops",)
    run = run_tools(report(values), stage("memory"), tools=["flop_overhead"], flops=1000.0)
    assert run.skipped[0].reason == "affinity"
    # Tensor-core math is not in these counters: a wgmma GEMM measures ~0, nothing fires.
    assert not FlopOverheadTool().trigger(ctx({FFMA: 0.0}, flops=1000.0))


def test_fp64_poly_on_the_h200() -> None:
    # fp64_poly: 2^22 elements x 256 FMAs = 2,147,483,648 FLOPs needed; ncu counts
    # 12,884,901,888 FP64 FLOPs (the per-iteration 1.0 / (k + 1) is a DFMA sequence), FP64
    # pipe 68.2% busy.
    c = capture_ctx("fp64_poly_kernel")
    assert c.value(DFMA) is not None
    f = FlopOverheadTool().analyze(c)
    assert f.severity == "high"
    assert f.evidence["executed FLOPs / reference FLOPs"].value == pytest.approx(6.0, abs=1e-3)
    assert "__constant__ double inv" in (f.code_example or "")
    # Kernels doing exactly their work stay quiet (ratios 1.00-1.001 in the same capture).
    for base in (
        "naive_matmul_kernel",
        "tiled_matmul_kernel",
        "spill_kernel",
        "bank_conflict_kernel",
    ):
        assert capture()[base].meta["flops"] > 0
        assert not FlopOverheadTool().trigger(capture_ctx(base))
