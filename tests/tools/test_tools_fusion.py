"""KernelFusionTool: several memory-bound kernels per call moving a multiple of the minimal
bytes, on constructed kernels (at and around its thresholds) and the H200 example run."""

from __future__ import annotations

import pytest
from tools_factories import example_run, km, stage

from pytest_kernelpro.profile.model import KernelProfile, ProfileReport
from pytest_kernelpro.tools.contract import ToolContext
from pytest_kernelpro.tools.fusion import KernelFusionTool
from pytest_kernelpro.tools.registry import run_tools
from pytest_kernelpro.tools.signals import DRAM_READ, DRAM_THROUGHPUT, DRAM_WRITE, DURATION


def kernel(name: str, dram: float, moved: float, ns: float | None = None) -> KernelProfile:
    values = {DRAM_THROUGHPUT: dram, DRAM_READ: moved / 2, DRAM_WRITE: moved / 2}
    if ns is not None:
        values[DURATION] = ns
    return KernelProfile(name, km(values, name))


def item(*kernels: KernelProfile, min_bytes: float | None = 100.0) -> ToolContext:
    return ToolContext(kernel=None, kernels=kernels, min_bytes=min_bytes)


@pytest.mark.parametrize(
    ("moved", "expected"),
    [(74.5, None), (75.0, "medium"), (99.9, "medium"), (100.0, "high"), (200.0, "critical")],
)
def test_fusion_thresholds(moved: float, expected: str | None) -> None:
    # Two kernels each moving `moved` bytes against 100 minimal bytes: ratio 2 * moved / 100.
    c = item(kernel("a", 80.0, moved), kernel("b", 80.0, moved))
    tool = KernelFusionTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert f.recommendations[0].low == pytest.approx(2 * moved / 100)
        assert not f.recommendations[0].bounded_by_saturation


@pytest.mark.parametrize(("dram", "fires"), [(39.9, False), (40.0, True)])
def test_needs_two_memory_bound_kernels(dram: float, fires: bool) -> None:
    c = item(kernel("a", 80.0, 200.0), kernel("b", dram, 200.0))
    assert KernelFusionTool().trigger(c) is fires
    assert not KernelFusionTool().trigger(item(kernel("a", 80.0, 400.0)))


def test_estimate_from_durations() -> None:
    # a: 100 B in 10 ns (10 B/ns, the best); b: 200 B in 40 ns. Fused: 100 minimal bytes at
    # 10 B/ns = 10 ns vs 50 ns spent -> 5x; by bytes 300 / 100 = 3x.
    f = KernelFusionTool().analyze(
        item(kernel("a", 80.0, 100.0, 10.0), kernel("b", 70.0, 200.0, 40.0))
    )
    rec = f.recommendations[0]
    assert (rec.low, rec.high) == (pytest.approx(3.0), pytest.approx(5.0))
    assert f.severity == "high"
    assert "kernel time vs fused estimate" in f.evidence
    # Without every kernel's duration the bytes ratio is the whole estimate.
    g = KernelFusionTool().analyze(item(kernel("a", 80.0, 100.0, 10.0), kernel("b", 70.0, 200.0)))
    assert g.recommendations[0].high == pytest.approx(3.0)


def test_missing_inputs_are_listed() -> None:
    two = (kernel("a", 80.0, 200.0), kernel("b", 80.0, 200.0))
    run = run_tools(ProfileReport(kernels=list(two)), stage("memory"), tools=["kernel_fusion"])
    assert [(s.tool, s.missing) for s in run.skipped] == [("kernel_fusion", ("min_bytes",))]
    bare = ProfileReport(kernels=[KernelProfile("a"), KernelProfile("b")])
    run = run_tools(bare, stage("memory"), tools=["kernel_fusion"], min_bytes=100.0)
    assert run.skipped[0].missing == ("kernels",)
    # A compute-bound item is not this tool's business.
    run = run_tools(ProfileReport(kernels=list(two)), stage("compute"), tools=["kernel_fusion"])
    assert run.skipped[0].reason == "affinity"


def test_item_finding_is_not_capped_by_the_roofline_policy() -> None:
    rep = ProfileReport(kernels=[kernel("a", 90.0, 200.0), kernel("b", 90.0, 200.0)])
    run = run_tools(
        rep, stage("memory"), tools=["kernel_fusion"], min_bytes=100.0, roofline_fraction=0.95
    )
    assert [f.severity for f in run.findings] == ["critical"]  # 4x the minimal bytes


def test_unfused_softmax_of_the_example_repo() -> None:
    # softmax_rows = x - x.amax(-1) -> exp -> sum -> divide: 5 PyTorch kernels per call on the
    # H200, 1,018,096,896 DRAM bytes against 268,435,456 minimal (8192 x 4096 fp32 in and out).
    f = next(f for f in example_run("softmax_rows").findings if f.tool == "kernel_fusion")
    assert f.severity == "high"
    assert f.kernel == "(item)"
    assert f.evidence["memory-bound kernels per call"].value == 5
    assert f.evidence["dram bytes / minimal bytes"].value == pytest.approx(
        1018096896 / 268435456, abs=1e-3
    )
    # 336.3 us of kernels vs 268,435,456 B at the exp kernel's 3,947 GB/s = 68.0 us: 4.94x.
    # The fused Triton softmax of the same run took 69.1 us vs 351 us (5.1x), inside the range.
    rec = f.recommendations[0]
    assert rec.low == pytest.approx(3.793, abs=1e-3)
    assert rec.high == pytest.approx(4.944, abs=1e-3)
    assert rec.low <= 351 / 69.1 * 1.05
    assert 351 / 69.1 <= rec.high * 1.05
    assert "torch.compile" in (f.code_example or "")
    # Single-kernel items: nothing to fuse.
    for name in ("triton_softmax", "cuda_row_rms"):
        assert "kernel_fusion" not in {x.tool for x in example_run(name).findings}


def test_launch_overhead_fuses_distinct_kernels_not_repetitions() -> None:
    # The kineto timeline replays each item 10 times: softmax_rows has 50 launches of 5
    # distinct kernels, the Triton softmax 10 launches of one.
    rows = next(f for f in example_run("softmax_rows").findings if f.tool == "launch_overhead")
    assert [r.action.split(" (")[0] for r in rows.recommendations][1] == (
        "Fuse the 5 distinct kernels of each call"
    )
    triton = next(f for f in example_run("triton_softmax").findings if f.tool == "launch_overhead")
    assert not any(r.action.startswith("Fuse") for r in triton.recommendations)
    assert triton.recommendations[1].action.startswith("Give each launch more work")
    # 79.2% of 3,184.5 us end to end outside kernels, but 91.3% of the roofline when timed.
    assert triton.severity == "low"
    assert "91.3% of its roofline" in triton.notes[0]


def test_launch_overhead_is_low_when_kernels_fill_the_timed_median() -> None:
    """cuda_row_rms on the H200: kineto saw 84.7% idle between profiled calls, but the
    kernel's ncu duration (37.4 us) fills most of the timed median (41.9 us)."""
    finding = next(f for f in example_run("cuda_row_rms").findings if f.tool == "launch_overhead")
    assert finding.severity == "low"
    assert any("fill" in note and "timed median" in note for note in finding.notes)
