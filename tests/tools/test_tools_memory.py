"""GlobalCoalescingTool, VectorizationTool, DramSaturationTool, L2LocalityTool."""

from __future__ import annotations

import pytest
from tools_factories import by_tool, ctx, probe_ctx, probe_run, sass

from pytest_kernelpro.tools.dram import DramSaturationTool, L2LocalityTool
from pytest_kernelpro.tools.memory import GlobalCoalescingTool, VectorizationTool, coalescing_ops

LD_SEC = "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"
LD_REQ = "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"
ST_SEC = "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum"
ST_REQ = "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"
DRAM = "dram__throughput.avg.pct_of_peak_sustained_elapsed"


def test_coalescing_naive_softmax_matches_ncu_excess_sectors() -> None:
    c = probe_ctx("naive_softmax_kernel")
    ops = coalescing_ops(c)
    assert [(o.op, o.ideal, round(o.per_request, 2)) for o in ops] == [
        ("load", 4.0, 32.0),
        ("store", 4.0, 32.0),
    ]
    f = GlobalCoalescingTool().analyze(c)
    assert f.severity == "critical"
    # ncu's UncoalescedGlobalAccess rule on the same launch: 117440512 excessive sectors (88%).
    assert f.evidence["excess sectors"].value == pytest.approx(117_440_512, rel=1e-5)
    assert "87.5%" in f.title
    assert f.recommendations[0].high == pytest.approx(8.0)


def test_coalescing_other_fixture_kernels() -> None:
    tool = GlobalCoalescingTool()
    # spill kernel: 4.875 sectors per 32-bit load request -> 3,670,016 excess (ncu: same, 18%).
    spill = tool.analyze(probe_ctx("spill_kernel"))
    assert spill.severity == "medium"
    assert spill.evidence["excess sectors"].value == pytest.approx(3_670_016)
    # wmma: 8 sectors per 32-bit LDG request -> 50% excess (ncu: 67108864 excessive, 50%).
    wmma = tool.analyze(probe_ctx("wmma_matmul_kernel"))
    assert wmma.evidence["excess sectors"].value == pytest.approx(67_108_864, rel=1e-6)
    assert wmma.severity == "high"
    # vec_add: 16 sectors per 128-bit request is the ideal.
    assert not tool.trigger(probe_ctx("vec_add_kernel"))
    # triton softmax has no SASS; 16 sectors/request cannot be judged without widths.
    assert not tool.trigger(probe_ctx("softmax_kernel"))


def coal(ld_per_req: float, widths: dict[int, int] | None) -> object:
    values = {LD_SEC: ld_per_req * 1000.0, LD_REQ: 1000.0}
    return ctx(values, sass_summary=None if widths is None else sass(loads=widths))


@pytest.mark.parametrize(
    ("requests", "expected"),
    [
        (1000.0, None),  # 4000 sectors = 4 per 32-bit request: ideal
        (901.0, None),  # 9.9% excess
        (900.0, "medium"),  # 400 of 4000 sectors excess: exactly 10%
        (701.0, "medium"),
        (700.0, "high"),  # 30%
        (400.0, "critical"),  # 60%
    ],
)
def test_coalescing_thresholds(requests: float, expected: str | None) -> None:
    c = ctx({LD_SEC: 4000.0, LD_REQ: requests}, sass_summary=sass(loads={32: 3}))
    tool = GlobalCoalescingTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


def test_coalescing_without_sass_only_reports_beyond_128_bit() -> None:
    assert not GlobalCoalescingTool().trigger(coal(16.0, widths=None))
    f = GlobalCoalescingTool().analyze(coal(32.0, widths=None))
    assert "lower bound" in f.root_cause
    assert f.severity == "high"


def test_coalescing_ideal_is_width_weighted() -> None:
    # 2 x 128-bit and 2 x 32-bit loads: ideal (16 + 16 + 4 + 4) / 4 = 10 sectors per request.
    assert coalescing_ops(coal(10.0, widths={128: 2, 32: 2}))[0].ideal == pytest.approx(10.0)
    assert not GlobalCoalescingTool().trigger(coal(10.0, widths={128: 2, 32: 2}))


def test_coalescing_skipped_for_compute_bound_by_affinity() -> None:
    skipped = {s.tool: s.reason for s in probe_run("wmma_matmul_kernel").skipped}
    assert skipped["global_coalescing"] == "affinity"


def test_vectorization() -> None:
    tool = VectorizationTool()
    # spill kernel: all LDG.E / STG.E (32-bit), DRAM at 35.9%.
    f = tool.analyze(probe_ctx("spill_kernel"))
    assert f.severity == "medium"
    assert "100.0%" in f.title
    assert not tool.trigger(probe_ctx("vec_add_kernel"))  # LDG.E.128
    soft = tool.analyze(probe_ctx("naive_softmax_kernel"))
    assert soft.severity == "low"
    assert "fix coalescing first" in soft.notes[0]
    assert tool.missing_inputs(probe_ctx("softmax_kernel")) == ["sass"]  # Triton: not in the .so


@pytest.mark.parametrize(
    ("narrow", "wide", "dram", "fires"),
    [
        (8, 2, 50.0, True),
        (79, 21, 50.0, False),
        (80, 20, 50.0, True),
        (10, 0, 79.9, True),
        (10, 0, 80.0, False),
    ],
)
def test_vectorization_thresholds(narrow: int, wide: int, dram: float, fires: bool) -> None:
    c = ctx({DRAM: dram}, sass_summary=sass(loads={32: narrow, 128: wide}))
    assert VectorizationTool().trigger(c) is fires


@pytest.mark.parametrize(("dram", "fires"), [(79.9, False), (80.0, True), (95.0, True)])
def test_dram_saturation_thresholds(dram: float, fires: bool) -> None:
    c = ctx({DRAM: dram})
    assert DramSaturationTool().trigger(c) is fires
    if fires:
        f = DramSaturationTool().analyze(c)
        assert f.severity == "low"
        assert "stop optimizing memory traffic" in f.title
        assert f.recommendations[1].high == pytest.approx(100 / dram)


def test_dram_saturation_on_fixtures() -> None:
    vec = DramSaturationTool().analyze(probe_ctx("vec_add_kernel"))
    assert "90.4%" in vec.title
    # vec_add moves 0.98x the minimal bytes: it sits on the memory roofline.
    assert vec.evidence["dram bytes / minimal bytes"].value == pytest.approx(0.979, abs=0.001)
    assert "on the memory roofline" in vec.root_cause
    assert by_tool(probe_run("softmax_kernel"))["dram_saturation"] == "low"
    assert not DramSaturationTool().trigger(probe_ctx("naive_softmax_kernel"))


@pytest.mark.parametrize(
    ("ratio", "dram", "expected"),
    [
        (1.49, 80.0, None),
        (1.5, 80.0, "low"),
        (2.0, 80.0, "medium"),
        (4.0, 80.0, "high"),
        (4.0, 49.0, "medium"),
        (2.0, 49.0, "low"),
        (4.0, 5.0, "medium"),
        (4.0, 4.9, "low"),  # DRAM barely used: the ratio is noise (the capture's tiny kernel)
    ],
)
def test_l2_locality_thresholds(ratio: float, dram: float, expected: str | None) -> None:
    values = {"dram__bytes_read.sum": ratio * 1e6, "dram__bytes_write.sum": 0.0, DRAM: dram}
    c = ctx(values, min_bytes=1e6)
    tool = L2LocalityTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


def test_l2_locality_on_fixtures() -> None:
    tool = L2LocalityTool()
    soft = tool.analyze(probe_ctx("naive_softmax_kernel"))  # 3 passes over each row
    assert soft.evidence["dram bytes / minimal bytes"].value == pytest.approx(1.954, abs=0.001)
    spill = tool.analyze(probe_ctx("spill_kernel"))
    assert spill.evidence["dram bytes / minimal bytes"].value == pytest.approx(27.29, abs=0.01)
    assert "local-memory traffic" in spill.root_cause
    assert spill.severity == "medium"
    assert not tool.trigger(probe_ctx("vec_add_kernel"))
    assert tool.missing_inputs(probe_ctx("vec_add_kernel", min_bytes=None)) == ["min_bytes"]
