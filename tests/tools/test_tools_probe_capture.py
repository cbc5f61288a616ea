"""End to end on the H200 probe capture: expected findings present, none high on kernels near
their roofline, offline loading, and Nsight Compute's own rule messages."""

from __future__ import annotations

import pytest
from capture_folder import parse_ncu_rule_messages
from tools_factories import PROBE_DIR, by_tool, probe, probe_run

MODULE_KERNELS = (
    "naive_matmul_kernel",
    "tiled_matmul_kernel",
    "naive_softmax_kernel",
    "vec_add_kernel",
    "spill_kernel",
    "wmma_matmul_kernel",
)
NVJET = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"


def test_offline_loading_joins_sass_ptxas_and_linkage() -> None:
    kernels = probe()
    for base in MODULE_KERNELS:
        k = kernels[base].report.kernels[0]
        assert k.sass is not None, base
        assert k.ptxas is not None, base
        assert kernels[base].report.arch == "sm_90a"
    assert kernels["spill_kernel"].report.kernels[0].ptxas.stack_frame_bytes == 256  # type: ignore[union-attr]
    assert kernels["wmma_matmul_kernel"].report.kernels[0].sass.count("HMMA") == 10  # type: ignore[union-attr]
    linkage = kernels["vec_add_kernel"].report.linkage
    assert linkage is not None
    assert not linkage.cublas
    # Library and Triton kernels have no SASS in the module: they run on ncu metrics alone.
    assert kernels[NVJET].report.kernels[0].sass is None
    assert kernels[NVJET].report.arch == "sm_90"
    assert len({k.name for k in kernels.values()}) >= 14


@pytest.mark.parametrize(
    ("base", "tool", "severity"),
    [
        ("naive_softmax_kernel", "global_coalescing", "critical"),
        ("naive_softmax_kernel", "small_grid", "critical"),
        ("spill_kernel", "register_spills", "critical"),
        ("wmma_matmul_kernel", "wgmma_vs_hmma", "high"),
        ("naive_matmul_kernel", "tensor_core_underuse", "critical"),
        ("tiled_matmul_kernel", "tensor_core_underuse", "critical"),
        ("tiled_matmul_kernel", "warp_stalls", "high"),  # mio_throttle, not barrier
    ],
)
def test_expected_findings(base: str, tool: str, severity: str) -> None:
    assert by_tool(probe_run(base)).get(tool) == severity


def test_tiled_matmul_barrier_stalls_do_not_dominate() -> None:
    assert "barrier_stalls" not in by_tool(probe_run("tiled_matmul_kernel"))


@pytest.mark.parametrize("base", [NVJET, "vec_add_kernel", "softmax_kernel"])
def test_no_high_or_critical_near_roofline(base: str) -> None:
    # torch bf16 matmul (cuBLAS nvjet: tensor pipe 83%), vec_add (DRAM 90%), triton softmax (DRAM 81%).
    severities = set(by_tool(probe_run(base)).values())
    assert severities
    assert severities <= {"medium", "low"}


def test_ncu_rule_messages() -> None:
    messages = parse_ncu_rule_messages((PROBE_DIR / "ncu_full_details.txt").read_text())
    kernels = {m.kernel.split("(")[0] for m in messages}
    assert kernels == {"naive_softmax_kernel", "spill_kernel", "wmma_matmul_kernel"}
    by_rule = {(m.kernel.split("(")[0], m.rule): m for m in messages}
    unc = by_rule[("naive_softmax_kernel", "UncoalescedGlobalAccess")]
    assert unc.speedup_pct == pytest.approx(87.08)
    assert "117440512 excessive sectors" in unc.message
    tail = by_rule[("spill_kernel", "LaunchConfiguration (tail effect)")]
    assert tail.speedup_pct == pytest.approx(25.0)
    assert "partial wave of 929" in tail.message
    assert ("naive_softmax_kernel", "LaunchConfiguration (small grid)") in by_rule
    assert ("spill_kernel", "MemoryCacheAccessPattern (local)") in by_rule
    assert ("wmma_matmul_kernel", "HighPipeUtilization") in by_rule
    assert all(m.kind in ("OPT", "INF", "WRN") for m in messages)
    assert not any(m.rule.startswith(("GPU ", "Memory Workload")) for m in messages)  # all mapped
