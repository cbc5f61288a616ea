"""Long-scoreboard stalls of streaming kernels and kernels near the DRAM roof (warp_stalls),
the item-vs-kernel saturation, PyTorch kernel names and occupancy limiter ties."""

from __future__ import annotations

from typing import Any

import pytest
from tools_factories import by_tool, capture_ctx, ctx, example_run, report, stall_values

from pytest_kernelpro.tools.contract import LIBRARY_KERNEL_RE, ToolContext
from pytest_kernelpro.tools.registry import run_tools
from pytest_kernelpro.tools.signals import (
    DRAM_READ,
    DRAM_THROUGHPUT,
    DRAM_WRITE,
    GLD_SECTORS,
    occupancy_limiters,
)
from pytest_kernelpro.tools.stalls import STALL_ADVICE, WarpStallTool

TILE_ADVICE = STALL_ADVICE["long_scoreboard"].recommendations[0][0]
READ = 64.0 * 2**20  # DRAM bytes read by the constructed kernels


def lsb(
    dram: float | None,
    reuse: float = 1.0,
    moved_ratio: float | None = None,
    share: float = 80.0,
    reason: str = "long_scoreboard",
) -> ToolContext:
    """A kernel whose stalls are `share`% `reason`, at `dram`% of peak DRAM bandwidth, whose
    global loads request `reuse` x the bytes read from DRAM; with `moved_ratio`, min_bytes is
    set so DRAM bytes moved / min_bytes is exactly that."""
    values: dict[str, Any] = stall_values(**{reason: share})
    values[GLD_SECTORS] = reuse * READ / 32.0
    values[DRAM_READ] = READ
    values[DRAM_WRITE] = READ
    if dram is not None:
        values[DRAM_THROUGHPUT] = dram
    min_bytes = None if moved_ratio is None else 2 * READ / moved_ratio
    return ctx(values, min_bytes=min_bytes)


@pytest.mark.parametrize(
    ("dram", "expected"),
    [(59.9, "critical"), (60.0, "medium"), (69.9, "medium"), (70.0, "low"), (95.0, "low")],
)
def test_long_scoreboard_severity_by_dram_throughput(dram: float, expected: str) -> None:
    f = WarpStallTool().analyze(lsb(dram))
    assert f.severity == expected
    assert all(TILE_ADVICE != r.action for r in f.recommendations)
    if expected != "critical":
        assert f"DRAM runs at {dram:.1f}% of peak" in f.notes[0]
        assert "bound by the bytes it moves" in f.root_cause
        assert DRAM_THROUGHPUT in f.evidence


def test_near_roof_order_and_estimates() -> None:
    # Low band (>= 70%): fewer bytes first; hiding latency is worth at most 100/75 = 1.33x.
    low = WarpStallTool().analyze(lsb(75.0))
    assert low.recommendations[0].action.startswith("Move fewer bytes")
    assert not low.recommendations[0].bounded_by_saturation
    assert low.recommendations[1].action.startswith("Keep more bytes in flight")
    assert low.recommendations[1].high == pytest.approx(100 / 75)
    # Medium band: bandwidth has headroom left, more bytes in flight first (<= 100/62.5 = 1.6x).
    medium = WarpStallTool().analyze(lsb(62.5))
    assert medium.recommendations[0].action.startswith("Keep more bytes in flight")
    assert medium.recommendations[0].high == pytest.approx(1.6)


def test_registry_policy_keeps_the_fewer_bytes_estimate() -> None:
    # At 85% DRAM the near-roofline policy caps estimates at 1.18x, except actions that remove
    # bytes: their gain is not bounded by the roof.
    values = {
        **stall_values(long_scoreboard=80.0),
        GLD_SECTORS: READ / 32.0,
        DRAM_READ: READ,
        DRAM_WRITE: READ,
        DRAM_THROUGHPUT: 85.0,
    }
    f = run_tools(report(values), tools=["warp_stalls"]).findings[0]
    assert f.severity == "low"
    fewer = next(r for r in f.recommendations if r.action.startswith("Move fewer bytes"))
    assert fewer.high == 2.0
    in_flight = next(r for r in f.recommendations if r.action.startswith("Keep more bytes"))
    assert in_flight.high <= 100 / 85 + 1e-9


@pytest.mark.parametrize(("reuse", "stream"), [(1.0, True), (1.5, True), (1.51, False)])
def test_stream_detection_by_reuse(reuse: float, stream: bool) -> None:
    # Below the DRAM roof the severity stands; the advice depends on whether data is reused.
    f = WarpStallTool().analyze(lsb(50.0, reuse=reuse))
    assert f.severity == "critical"
    first = f.recommendations[0].action
    if stream:
        assert first.startswith("Keep more bytes in flight")
        assert "nothing to reuse" in f.root_cause
        assert f.recommendations[0].high == pytest.approx(2.0)  # 100 / 50% DRAM
    else:
        assert first == TILE_ADVICE


@pytest.mark.parametrize(("dram", "stream"), [(9.9, False), (10.0, True)])
def test_stream_needs_some_dram_traffic(dram: float, stream: bool) -> None:
    first = WarpStallTool().analyze(lsb(dram)).recommendations[0].action
    assert first.startswith("Keep more bytes in flight") is stream


def test_near_roof_applies_to_reused_data_too() -> None:
    f = WarpStallTool().analyze(lsb(65.0, reuse=8.0))
    assert f.severity == "medium"
    assert TILE_ADVICE not in [r.action for r in f.recommendations]


@pytest.mark.parametrize(("ratio", "leads"), [(1.49, False), (1.5, True)])
def test_excess_traffic_leads_near_the_roof(ratio: float, leads: bool) -> None:
    f = WarpStallTool().analyze(lsb(75.0, moved_ratio=ratio))
    assert f.recommendations[0].action.startswith("Cut the excess DRAM traffic") is leads
    # Away from the roof the excess is l2_locality's finding, not this one's.
    below = WarpStallTool().analyze(lsb(50.0, moved_ratio=3.0))
    assert not any(r.action.startswith("Cut the excess") for r in below.recommendations)


def test_other_stalls_and_missing_dram_keep_the_generic_advice() -> None:
    mio = WarpStallTool().analyze(lsb(75.0, reason="mio_throttle"))
    assert mio.severity == "critical"
    no_dram = WarpStallTool().analyze(lsb(None))
    assert no_dram.severity == "critical"
    assert no_dram.recommendations[0].action == TILE_ADVICE


def test_stream_thresholds_are_overridable() -> None:
    tool = WarpStallTool({"STREAM_MEDIUM_DRAM_PCT": 50.0, "STREAM_LOW_DRAM_PCT": 55.0})
    assert tool.analyze(lsb(52.0)).severity == "medium"
    assert tool.analyze(lsb(55.0)).severity == "low"


def test_capture_kernels_on_the_h200() -> None:
    tool = WarpStallTool()
    # copy_scalar: a stream (reuse 1.0) at 54.4% DRAM: latency still costs; the advice is the
    # float4 one (copy_vec4 took 122.8 us vs copy_scalar's 197.6 us in the same capture, 1.6x).
    scalar = tool.analyze(capture_ctx("copy_scalar_kernel"))
    assert scalar.severity == "critical"
    assert scalar.recommendations[0].action.startswith("Keep more bytes in flight")
    assert scalar.recommendations[0].high == pytest.approx(100 / 54.42, rel=1e-3)
    assert "float4" in (scalar.code_example or "")
    # copy_vec4 at 86.8% DRAM: the signature of a stream at the roof.
    assert tool.analyze(capture_ctx("copy_vec4_kernel")).severity == "low"
    # warp_softmax at 67.5% reads every row twice (1.93x the minimal bytes): cut that first.
    warp = tool.analyze(capture_ctx("warp_softmax_kernel"))
    assert warp.severity == "medium"
    assert warp.recommendations[0].action.startswith("Cut the excess DRAM traffic (1.93x")
    # wmma: each DRAM byte is requested ~256x from L1 at 0.65% DRAM: tiling is the right advice.
    wmma = tool.analyze(capture_ctx("wmma_matmul_kernel"))
    assert wmma.severity == "critical"
    assert wmma.recommendations[0].action == TILE_ADVICE
    # tiny (1 block, 0.03% DRAM): not a stream, whatever its byte ratio says.
    assert tool.analyze(capture_ctx("tiny_kernel")).recommendations[0].action == TILE_ADVICE


def test_example_softmax_rows_has_no_latency_advice_for_its_streams() -> None:
    # The example repo's unfused softmax (5 PyTorch kernels at 51-82% DRAM) used to get five
    # critical "stage data in shared memory" findings.
    run = example_run("softmax_rows")
    stalls = [f for f in run.findings if f.tool == "warp_stalls"]
    assert len(stalls) == 5
    assert all(f.severity in ("low", "medium") for f in stalls)
    assert all(TILE_ADVICE not in [r.action for r in f.recommendations] for f in stalls)
    assert sorted(f.severity for f in stalls) == ["low", "low", "low", "medium", "medium"]
    # The two at 51-53% DRAM are PyTorch's (TensorIterator) kernels: capped at medium.
    assert sum("library kernel" in " ".join(f.notes) for f in stalls) == 2
    assert run.worst() == "high"  # kernel_fusion and launch_overhead


def test_example_row_rms() -> None:
    found = {f.tool: f for f in example_run("cuda_row_rms").findings}
    stall = found["warp_stalls"]
    assert stall.severity == "medium"  # 65.5% DRAM
    assert stall.recommendations[0].action.startswith("Keep more bytes in flight")
    # 32-thread blocks: the blocks-per-SM limit binds, not the 1 KB reserved shared memory.
    occ = found["occupancy"]
    assert "limited by blocks per SM" in occ.root_cause
    assert occ.recommendations[0].action.startswith("Use larger blocks")
    assert by_tool(example_run("triton_softmax"))["warp_stalls"] == "low"


def test_occupancy_limiter_ties_with_the_block_limit() -> None:
    limits = {
        "launch__occupancy_limit_registers": 64.0,
        "launch__occupancy_limit_shared_mem": 32.0,
        "launch__occupancy_limit_warps": 64.0,
        "launch__occupancy_limit_blocks": 32.0,
        "launch__occupancy_limit_barriers": 32.0,
    }
    assert occupancy_limiters(ctx(limits))[0] == ["blocks per SM"]
    limits["launch__occupancy_limit_registers"] = 32.0  # a real tie stays a tie
    assert occupancy_limiters(ctx(limits))[0] == ["registers", "blocks per SM"]
    limits["launch__occupancy_limit_shared_mem"] = 3.0
    assert occupancy_limiters(ctx(limits))[0] == ["shared memory"]


@pytest.mark.parametrize(
    ("name", "library"),
    [
        (
            "void reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<float, MaxNanFunctor<float>>, "
            "unsigned int, float, 4, 4>>(T3)",
            True,
        ),
        (
            "void vectorized_elementwise_kernel<4, exp_kernel_cuda(TensorIteratorBase &)::"
            "[lambda() (instance 2)]>(int, T2, T3)",
            True,
        ),
        ("void elementwise_kernel<128, 2, void gpu_kernel_impl_nocast<X>>(int, T3)", True),
        ("reduce_kernel(const float *, float *, int)", False),
        ("elementwise_kernel(float *)", False),
    ],
)
def test_pytorch_kernels_without_namespace_are_library_kernels(name: str, library: bool) -> None:
    assert (LIBRARY_KERNEL_RE.search(name) is not None) is library
