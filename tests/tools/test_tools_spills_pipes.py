"""RegisterSpillDetector, pipe tools (utilization, FP64, FMA fusion, instruction overhead),
warp divergence, and the timeline tools."""

from __future__ import annotations

import pytest
from tools_factories import by_tool, ctx, probe_ctx, probe_run, sass, stage, stall_values, timeline

from pytest_kernelpro.profile.model import PtxasReport
from pytest_kernelpro.tools.divergence import WarpDivergenceTool
from pytest_kernelpro.tools.instructions import InstructionOverheadTool
from pytest_kernelpro.tools.pipes import FP64Tool, FusedFmaTool, PipeUtilizationTool
from pytest_kernelpro.tools.spills import RegisterSpillDetector
from pytest_kernelpro.tools.timeline import LaunchOverheadTool, SynchronizationTool

LLD = "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"
LST = "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"
GLD = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
FMA = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
ALU = "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"
FP64 = "sm__pipe_fp64_cycles_active.avg.pct_of_peak_sustained_active"
TENSOR = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEM = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"


def test_spill_kernel_local_array() -> None:
    c = probe_ctx("spill_kernel")
    f = RegisterSpillDetector().analyze(c)
    assert f.severity == "critical"
    assert "a local array" in f.title  # ptxas: 256-byte stack frame, 0 spill bytes
    assert "256-byte stack frame" in f.root_cause
    assert f.evidence["local share of L1 sectors"].value == pytest.approx(77.73, abs=0.01)
    assert f.evidence["sass LDL+STL"].value == 2
    assert "latency" in f.title
    assert "bandwidth" in f.title


def test_spills_absent_on_other_fixtures() -> None:
    for base in (
        "naive_softmax_kernel",
        "vec_add_kernel",
        "wmma_matmul_kernel",
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
    ):
        assert not RegisterSpillDetector().trigger(probe_ctx(base)), base


def spill_ctx(local: float, glob: float, long_sb: float = 10.0, **kw: object) -> object:
    values = {LLD: local, LST: 0.0, GLD: glob, **stall_values(long_scoreboard=long_sb)}
    values.update(kw)  # type: ignore[arg-type]
    return ctx(
        values,
        ptxas=PtxasReport("_Z1kPf", "sm_90a", 255, spill_store_bytes=64, spill_load_bytes=64),
    )


@pytest.mark.parametrize(
    ("local", "long_sb", "expected"),
    [
        (199.0, 10.0, None),  # 19.9% local share, stalls low: harmless spills
        (200.0, 10.0, "medium"),  # 20%: bandwidth
        (49.0, 40.0, None),  # 4.9% local: too little to blame for the stalls
        (50.0, 40.0, "medium"),  # 5% local + 40% long scoreboard: latency
        (200.0, 40.0, "high"),  # both
        (500.0, 40.0, "critical"),  # both and >= 50% local
    ],
)
def test_spill_harm_thresholds(local: float, long_sb: float, expected: str | None) -> None:
    c = spill_ctx(local, 1000.0 - local, long_sb)
    tool = RegisterSpillDetector()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert "register spills" in f.title


def test_spill_occupancy_harm_and_no_evidence_no_finding() -> None:
    occ = {
        "launch__occupancy_limit_registers": 1.0,
        "launch__occupancy_limit_warps": 8.0,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 12.0,
        "smsp__warps_eligible.avg.per_cycle_active": 0.3,
    }
    c = spill_ctx(1.0, 999.0, 10.0, **occ)
    assert RegisterSpillDetector().analyze(c).title.endswith("harm: occupancy")
    # Same starving occupancy, but no local traffic, no LDL/STL, no spill bytes: nothing to blame.
    clean = ctx({LLD: 0.0, LST: 0.0, GLD: 1000.0, **occ}, sass_summary=sass({"FFMA": 10}))
    assert not RegisterSpillDetector().trigger(clean)


@pytest.mark.parametrize(
    ("pipes", "cls", "expected_title"),
    [
        ({FMA: 80.0, ALU: 10.0}, "compute", "FMA (FP32) pipe saturated"),
        ({FMA: 79.9, ALU: 10.0}, "compute", None),
        ({FMA: 19.9, ALU: 10.0, SM: 30.0}, "compute", "every pipe under 20%"),
        ({FMA: 20.0, ALU: 10.0, SM: 30.0}, "compute", None),
        ({FMA: 10.0, ALU: 10.0, SM: 60.0}, "compute", None),
        ({FMA: 10.0, ALU: 10.0, SM: 30.0}, "mixed", None),
    ],
)
def test_pipe_utilization_thresholds(
    pipes: dict[str, float], cls: str, expected_title: str | None
) -> None:
    c = ctx(pipes, stage1=stage(cls))
    tool = PipeUtilizationTool()
    assert tool.trigger(c) is (expected_title is not None)
    if expected_title:
        assert expected_title in tool.analyze(c).title


def test_pipe_utilization_on_fixtures() -> None:
    f = PipeUtilizationTool().analyze(probe_ctx("wmma_matmul_kernel"))
    assert f.severity == "high"
    assert "LSU (load/store) 17.6%" in f.title
    nvjet = PipeUtilizationTool().analyze(
        probe_ctx("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    )
    assert nvjet.severity == "low"
    assert "tensor pipe saturated (83.2%" in nvjet.title


@pytest.mark.parametrize(
    ("pipe", "ratio", "dtype", "expected"),
    [
        (4.9, 64.0, "float32", None),
        (5.0, 64.0, "float32", "medium"),
        (20.0, 64.0, "float32", "high"),
        (20.0, 2.0, "float32", "low"),
        (50.0, 2.0, "float32", "medium"),
        (50.0, 64.0, "float64", None),
    ],
)
def test_fp64_thresholds(pipe: float, ratio: float, dtype: str, expected: str | None) -> None:
    c = ctx(
        {FP64: pipe, "device__attribute_single_to_double_precision_perf_ratio": ratio}, dtype=dtype
    )
    tool = FP64Tool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


def test_fp64_instruction_share_and_fixture() -> None:
    share = {
        FP64: 1.0,
        "smsp__sass_thread_inst_executed_op_dfma_pred_on.sum": 5.0,
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 95.0,
    }
    assert FP64Tool().trigger(ctx(share))  # 5% of FP instructions
    share["smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"] = 96.0
    assert not FP64Tool().trigger(ctx(share))
    assert not FP64Tool().trigger(probe_ctx("naive_matmul_kernel"))  # fp64 pipe 0


@pytest.mark.parametrize(
    ("fadd", "fma", "fires"), [(25.0, 50.0, True), (20.0, 50.0, False), (25.0, 39.9, False)]
)
def test_fma_fusion_thresholds(fadd: float, fma: float, fires: bool) -> None:
    # non-fused / (fused + non-fused) / 2: 25/100/2 = 0.125 > 0.1; 20/100/2 = 0.1 is not.
    values = {
        "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum": 100.0 - fadd,
        "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum": fadd,
        "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum": 0.0,
        FMA: fma,
    }
    assert FusedFmaTool().trigger(ctx(values)) is fires


def test_fma_fusion_quiet_on_fixture_where_ncu_complains() -> None:
    # ncu's FPInstructions rule flags naive_softmax (32% non-fused) at a 0.33% speedup; its FMA
    # pipe is 2% busy, so fusing cannot matter.
    assert not FusedFmaTool().trigger(probe_ctx("naive_softmax_kernel"))


@pytest.mark.parametrize(
    ("threads", "expected"), [(24.0, None), (23.9, "medium"), (16.0, "medium"), (15.9, "high")]
)
def test_divergence_thresholds(threads: float, expected: str | None) -> None:
    c = ctx({"smsp__thread_inst_executed_per_inst_executed.ratio": threads})
    tool = WarpDivergenceTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert f.recommendations[0].high == pytest.approx(32 / threads)


def test_divergence_uses_predicated_threads_and_fixtures() -> None:
    c = ctx(
        {
            "smsp__thread_inst_executed_per_inst_executed.ratio": 32.0,
            "smsp__average_thread_inst_executed_pred_on_per_inst_executed.ratio": 12.0,
        }
    )
    assert WarpDivergenceTool().analyze(c).severity == "high"
    assert not WarpDivergenceTool().trigger(probe_ctx("naive_softmax_kernel"))  # 32 threads


@pytest.mark.parametrize(
    ("sm", "mem", "cls", "expected"),
    [
        (71.8, 47.9, "memory", "medium"),
        (59.9, 40.0, "memory", None),
        (70.0, 60.1, "memory", None),
        (85.0, 50.0, "memory", "high"),
        (85.0, 50.0, "mixed", None),
    ],
)
def test_instruction_overhead_thresholds(
    sm: float, mem: float, cls: str, expected: str | None
) -> None:
    c = ctx({SM: sm, MEM: mem}, stage1=stage(cls))
    tool = InstructionOverheadTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


def test_instruction_overhead_on_torch_softmax() -> None:
    # PyTorch's softmax: memory-bound op, SM 71.8% vs memory 47.9% -> library cap keeps medium.
    assert by_tool(probe_run("cunn_SoftMaxForwardReg"))["instruction_overhead"] == "medium"


@pytest.mark.parametrize(
    ("overhead", "expected"), [(0.199, None), (0.2, "medium"), (0.4, "high"), (0.6, "critical")]
)
def test_launch_overhead_thresholds(overhead: float, expected: str | None) -> None:
    c = ctx(None, timeline=timeline(overhead=overhead, kernels=40))
    tool = LaunchOverheadTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert "CUDA graph" in f.recommendations[0].action
        assert f.recommendations[0].high == pytest.approx(1 / (1 - overhead))


@pytest.mark.parametrize(
    ("fraction", "expected"), [(None, "critical"), (0.799, "critical"), (0.8, "low")]
)
def test_launch_overhead_low_when_the_timed_loop_reaches_the_roofline(
    fraction: float | None, expected: str
) -> None:
    # The Triton softmax of the example repo: 79.2% idle in the kineto timeline, yet 91.3% of
    # its roofline when timed back to back: the timeline's idle time is host time between calls.
    c = ctx(None, timeline=timeline(overhead=0.792), roofline_fraction=fraction)
    f = LaunchOverheadTool().analyze(c)
    assert f.severity == expected
    assert bool(f.notes) is (expected == "low")


@pytest.mark.parametrize(
    ("sync_calls", "gaps", "expected"),
    [
        (0, (99.0,), None),  # 9.9% of 1000 us in gaps, no sync
        (0, (100.0,), "medium"),
        (2, (20.0,), "low"),  # a sync with a flagged gap
        (2, (), None),
        (1, (150.0, 150.0), "high"),
        (1, (600.0,), "critical"),
    ],
)
def test_synchronization_thresholds(
    sync_calls: int, gaps: tuple[float, ...], expected: str | None
) -> None:
    c = ctx(None, timeline=timeline(sync_calls=sync_calls, gaps_us=gaps))
    tool = SynchronizationTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        if gaps:
            assert f"largest ({max(gaps):.1f} us)" in f.root_cause
