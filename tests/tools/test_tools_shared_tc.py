"""SharedBankConflictTool, AsyncCopyTool, TensorCoreUnderutilizationTool, WGMMAInstructionTool."""

from __future__ import annotations

import pytest
from tools_factories import BLAS, by_tool, ctx, probe_ctx, probe_run, sass, stage, stall_values

from pytest_kernelpro.tools.shared import AsyncCopyTool, SharedBankConflictTool
from pytest_kernelpro.tools.tensorcore import TensorCoreUnderutilizationTool, WGMMAInstructionTool

LD_C = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum"
LD_W = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
ST_C = "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"
ST_W = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
TENSOR = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
GMMA = "sm__inst_executed_pipe_tensor_op_gmma.sum"
FMA = "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"


@pytest.mark.parametrize(
    ("conflicts", "expected"),
    [(99.0, None), (100.0, "medium"), (299.0, "medium"), (300.0, "high")],
)
def test_bank_conflict_thresholds(conflicts: float, expected: str | None) -> None:
    c = ctx({LD_C: conflicts, LD_W: 1000.0})  # loads only: per-op share == overall share
    tool = SharedBankConflictTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


@pytest.mark.parametrize(("store_wavefronts", "fires"), [(99.0, False), (100.0, True)])
def test_bank_conflicts_op_must_carry_ten_percent(store_wavefronts: float, fires: bool) -> None:
    # Half of the store wavefronts conflict; loads are clean. Overall < 10% either way, so the
    # per-op rule decides, and it needs the store op to carry >= 10% of shared wavefronts.
    loads = 1000.0 - store_wavefronts if store_wavefronts == 100.0 else 901.0
    c = ctx({LD_C: 0.0, LD_W: loads, ST_C: store_wavefronts / 2, ST_W: store_wavefronts})
    assert SharedBankConflictTool().trigger(c) is fires


def test_bank_conflicts_per_op_rule_when_op_matters() -> None:
    # Store op with 20% conflicts and 50% of the shared wavefronts: 10% overall -> medium.
    c = ctx({LD_C: 0.0, LD_W: 500.0, ST_C: 100.0, ST_W: 500.0})
    f = SharedBankConflictTool().analyze(c)
    assert f.severity == "medium"
    assert "20.0% of store wavefronts" in f.title
    # Per-op 12% on an op carrying 50% but 6% overall: triggers by the op rule, severity low.
    c2 = ctx({LD_C: 0.0, LD_W: 500.0, ST_C: 60.0, ST_W: 500.0})
    assert SharedBankConflictTool().trigger(c2)
    assert SharedBankConflictTool().analyze(c2).severity == "low"


def test_bank_conflicts_on_fixtures() -> None:
    tool = SharedBankConflictTool()
    # tiled matmul: store conflicts are 11.2% of store wavefronts, but stores are 4.5% of the
    # shared traffic (0.5% conflicts overall): not worth a finding.
    assert not tool.trigger(probe_ctx("tiled_matmul_kernel"))
    assert not tool.trigger(probe_ctx("softmax_kernel"))  # 2.5-2.8% per op


def test_async_copy_on_tiled_matmul() -> None:
    f = AsyncCopyTool().analyze(probe_ctx("tiled_matmul_kernel"))
    assert "Hopper" in f.title
    assert "TMA" in f.recommendations[0].action
    assert f.severity == "low"  # long scoreboard 11.3% + barrier 8.2% = 19.6% of stalls
    assert not AsyncCopyTool().trigger(probe_ctx("naive_softmax_kernel"))  # no shared staging
    assert AsyncCopyTool().missing_inputs(probe_ctx("softmax_kernel")) == ["sass"]


@pytest.mark.parametrize(
    ("waiting", "counts", "arch", "expected"),
    [
        (14.9, {"STS": 2, "LDG": 2}, "sm_90a", None),
        (15.0, {"STS": 2, "LDG": 2}, "sm_90a", "low"),
        (25.0, {"STS": 2, "LDG": 2}, "sm_90a", "medium"),
        (40.0, {"STS": 2, "LDG": 2}, "sm_80", "high"),
        (40.0, {"STS": 2, "LDG": 2, "LDGSTS": 2}, "sm_80", None),
        (40.0, {"STS": 2, "LDG": 2, "UTMALDG": 1}, "sm_90a", None),
        (40.0, {"STS": 2, "LDG": 2}, "sm_75", None),
    ],
)
def test_async_copy_thresholds(
    waiting: float, counts: dict[str, int], arch: str, expected: str | None
) -> None:
    c = ctx(stall_values(long_scoreboard=waiting), sass_summary=sass(counts), arch=arch)
    tool = AsyncCopyTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert ("TMA" in f.recommendations[0].action) is (arch == "sm_90a")


def test_tensor_core_underuse_on_fixtures() -> None:
    tool = TensorCoreUnderutilizationTool()
    for base in ("naive_matmul_kernel", "tiled_matmul_kernel"):
        f = tool.analyze(probe_ctx(base))
        assert f.severity == "critical", base  # compute-bound GEMM, FFMA only
        assert "SASS tensor-core instructions" in f.evidence["tensor-core instructions"].condition
    assert not tool.trigger(probe_ctx("wmma_matmul_kernel"))  # HMMA present
    # cuBLAS's own kernels (library names) are not flagged: nvjet uses wgmma, the fp32 SIMT
    # SGEMM has no tensor cores but is a library kernel.
    assert "tensor_core_underuse" not in by_tool(
        probe_run("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    )
    assert not tool.trigger(probe_ctx("Kernel2"))


def test_tensor_core_underuse_cublas_linkage_recognised() -> None:
    naive = probe_ctx("naive_matmul_kernel")
    assert TensorCoreUnderutilizationTool().trigger(naive)
    naive.linkage = BLAS
    assert not TensorCoreUnderutilizationTool().trigger(naive)


@pytest.mark.parametrize(
    ("op", "cls", "fma", "tensor", "expected"),
    [
        ("gemm", "compute", 20.0, 0.0, "critical"),
        ("gemm", "mixed", 20.0, 0.0, "high"),
        ("gemm", "compute", 20.0, 0.99, "critical"),
        ("gemm", "compute", 20.0, 1.0, None),  # tensor pipe active counts as used (no SASS)
        (None, "compute", 30.0, 0.0, "medium"),
        (None, "compute", 29.9, 0.0, None),
        (None, "memory", 50.0, 0.0, None),
        ("softmax", "compute", 50.0, 0.0, None),
    ],
)
def test_tensor_core_underuse_thresholds(
    op: str | None, cls: str, fma: float, tensor: float, expected: str | None
) -> None:
    c = ctx({FMA: fma, TENSOR: tensor, GMMA: 0.0}, op_category=op, stage1=stage(cls))
    tool = TensorCoreUnderutilizationTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


def test_tensor_core_underuse_needs_sass_or_tensor_metrics() -> None:
    missing = TensorCoreUnderutilizationTool().missing_inputs(ctx({FMA: 50.0}, op_category="gemm"))
    assert missing
    assert missing[0].startswith("sass")


def test_wgmma_on_wmma_kernel() -> None:
    f = WGMMAInstructionTool().analyze(probe_ctx("wmma_matmul_kernel"))
    assert f.severity == "high"
    assert f.evidence["sass HMMA/IMMA (mma.sync)"].value == 10
    assert f.recommendations[0].expected == "1.3-1.5x"
    assert by_tool(probe_run("wmma_matmul_kernel"))["wgmma_vs_hmma"] == "high"


def test_wgmma_quiet_elsewhere() -> None:
    tool = WGMMAInstructionTool()
    # naive matmul: ncu's hmma instruction counter is 131,072 (HFMA2.MMA moves), SASS has no HMMA.
    assert not tool.trigger(probe_ctx("naive_matmul_kernel"))
    assert not tool.trigger(
        probe_ctx("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    )  # wgmma, library
    assert not tool.trigger(probe_ctx("wmma_matmul_kernel", arch="sm_80"))  # not Hopper


@pytest.mark.parametrize(
    ("tensor", "gmma", "arch", "fires"),
    [
        (4.0, 0.0, "sm_90", True),
        (0.99, 0.0, "sm_90", False),
        (1.0, 0.0, "sm_90", True),
        (80.0, 5.0, "sm_90", False),
        (4.0, 0.0, "sm_89", False),
    ],
)
def test_wgmma_from_ncu_alone(tensor: float, gmma: float, arch: str, fires: bool) -> None:
    c = ctx({TENSOR: tensor, GMMA: gmma}, arch=arch)
    tool = WGMMAInstructionTool()
    assert tool.missing_inputs(c) == []
    assert tool.trigger(c) is fires
    if fires:
        assert "sm_90a" in tool.analyze(c).notes[0]  # built for sm_90 without the 'a'


def test_wgmma_missing_inputs_named() -> None:
    missing = WGMMAInstructionTool().missing_inputs(ctx({FMA: 1.0}))
    assert missing == [f"sass (or {TENSOR} and {GMMA})"]
