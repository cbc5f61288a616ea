"""WarpStallTool and BarrierStallTool: fixture kernels and thresholds."""

from __future__ import annotations

import pytest
from tools_factories import by_tool, ctx, probe_ctx, probe_run, stall_values

from pytest_kernelpro.profile.model import KernelMetrics
from pytest_kernelpro.tools.contract import ToolContext
from pytest_kernelpro.tools.signals import STALL_FAMILIES, stall_breakdown, stall_metric
from pytest_kernelpro.tools.stalls import STALL_ADVICE, BarrierStallTool, WarpStallTool


def test_stall_share_excludes_selected_and_matches_across_families() -> None:
    # naive_softmax: long_scoreboard 75.20% of active warp-cycles, selected 4.74%.
    c = probe_ctx("naive_softmax_kernel")
    bd = stall_breakdown(c)
    assert bd is not None
    assert bd.family == STALL_FAMILIES[0]
    # Denominator 100 - selected: the warp states sum to 100% of active warp-cycles.
    assert bd.shares["long_scoreboard"] == pytest.approx(100 * 75.20 / (100 - 4.74))
    assert bd.shares["long_scoreboard"] == pytest.approx(78.9, abs=0.05)
    # The per-issue-active family of the same capture gives the same share (proportional).
    metrics = c.metrics
    assert metrics is not None
    only_ratio = KernelMetrics(
        metrics.kernel_name,
        {n: v for n, v in metrics.metrics.items() if "per_issue_active" in n},
    )
    bd2 = stall_breakdown(ToolContext(kernel=type(c.kernel)(c.kernel_name, only_ratio)))  # type: ignore[misc]
    assert bd2 is not None
    assert bd2.family == STALL_FAMILIES[1]
    assert bd2.shares["long_scoreboard"] == pytest.approx(bd.shares["long_scoreboard"], abs=1.0)


def test_warp_stalls_on_fixture_kernels() -> None:
    soft = probe_ctx("naive_softmax_kernel")
    tool = WarpStallTool()
    assert tool.trigger(soft)
    f = tool.analyze(soft)
    assert f.severity == "critical"
    assert "long_scoreboard" in f.title
    assert "78.9%" in f.title
    assert stall_metric("long_scoreboard") in f.evidence
    assert "> 60%" in f.evidence[stall_metric("long_scoreboard")].condition
    # tiled matmul: MIO throttle (shared-memory pressure) dominates, not barriers (8%).
    tiled = tool.analyze(probe_ctx("tiled_matmul_kernel"))
    assert tiled.severity == "high"
    assert "mio_throttle" in tiled.title
    assert "Register-tile" in tiled.recommendations[0].action
    # naive matmul: LG throttle just above 40%.
    naive = tool.analyze(probe_ctx("naive_matmul_kernel"))
    assert naive.severity == "high"
    assert "lg_throttle" in naive.title
    # triton softmax: long scoreboard 38.0% of stalls -> below the trigger.
    assert not tool.trigger(probe_ctx("softmax_kernel"))


def test_warp_stalls_near_dram_roof_is_low() -> None:
    # vec_add stalls 95% on long scoreboard but DRAM runs at 90.4% of peak: capped to low.
    assert by_tool(probe_run("vec_add_kernel"))["warp_stalls"] == "low"


@pytest.mark.parametrize(
    ("share", "expected"),
    [(39.9, None), (40.0, None), (40.1, "high"), (60.0, "high"), (60.1, "critical")],
)
def test_warp_stall_thresholds(share: float, expected: str | None) -> None:
    c = ctx(stall_values(long_scoreboard=share, short_scoreboard=5.0))
    tool = WarpStallTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        assert tool.analyze(c).severity == expected


def test_warp_stall_hidden_when_issue_slots_busy() -> None:
    values = stall_values(long_scoreboard=70.0)
    assert WarpStallTool().trigger(
        ctx({**values, "smsp__issue_active.avg.pct_of_peak_sustained_active": 79.9})
    )
    assert not WarpStallTool().trigger(
        ctx({**values, "smsp__issue_active.avg.pct_of_peak_sustained_active": 80.0})
    )


@pytest.mark.parametrize(
    "reason",
    [
        "long_scoreboard",
        "short_scoreboard",
        "barrier",
        "branch_resolving",
        "mio_throttle",
        "lg_throttle",
        "math_pipe_throttle",
    ],
)
def test_each_stall_type_gets_its_own_advice(reason: str) -> None:
    f = WarpStallTool().analyze(ctx(stall_values(**{reason: 65.0})))
    assert reason in f.title
    assert f.severity == "critical"
    assert f.recommendations[0].action == STALL_ADVICE[reason].recommendations[0][0]
    assert STALL_ADVICE[reason].cause in f.root_cause
    # Estimates are capped by the Amdahl bound 1/(1 - 0.65) = 2.86x.
    assert all(r.high <= 1 / (1 - 0.65) + 1e-9 for r in f.recommendations)


def test_not_selected_is_not_a_dominant_problem() -> None:
    # 70% not_selected (plenty of eligible warps) and 30% long scoreboard: nothing fires.
    assert not WarpStallTool().trigger(ctx(stall_values(long_scoreboard=30.0)))


def test_warp_stalls_missing_metrics_are_listed() -> None:
    missing = WarpStallTool().missing_inputs(
        ctx({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 10.0})
    )
    assert any(m.startswith(stall_metric("long_scoreboard")) for m in missing)
    assert any("per_issue_active" in m for m in missing)  # the alternatives are named too


@pytest.mark.parametrize(
    ("share", "expected"),
    [(29.9, None), (30.0, None), (30.1, "high"), (50.0, "high"), (50.1, "critical")],
)
def test_barrier_thresholds(share: float, expected: str | None) -> None:
    c = ctx(stall_values(barrier=share))
    tool = BarrierStallTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert "__shfl_xor_sync" in (f.code_example or "")


def test_barrier_on_fixtures() -> None:
    tool = BarrierStallTool()
    # tiled matmul: 8.2% barrier stalls - they do not dominate, the tool stays quiet.
    assert not tool.trigger(probe_ctx("tiled_matmul_kernel"))
    assert not tool.trigger(probe_ctx("naive_softmax_kernel"))
    # cuBLAS nvjet (warp-specialized wgmma): barrier is 27.84% of active warp-cycles. The
    # collected reasons sum to only 80.3% (gmma, waiting on WARPGROUP.ARRIVES, was not in the
    # capture), so its share of stalled cycles is 27.84 / (100 - 5.17) = 29.4%: below 30%.
    nvjet = probe_ctx("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    bd = stall_breakdown(nvjet)
    assert bd is not None
    assert bd.shares["barrier"] == pytest.approx(100 * 27.84 / (100 - 5.17))
    assert not tool.trigger(nvjet)


def test_partial_reason_set_does_not_inflate_shares() -> None:
    # Only three reasons collected: the share still uses 100 - selected, not their sum.
    values = {
        stall_metric("long_scoreboard"): 30.0,
        stall_metric("barrier"): 10.0,
        stall_metric("short_scoreboard"): 5.0,
        stall_metric("branch_resolving"): 1.0,
        stall_metric("mio_throttle"): 1.0,
        stall_metric("selected"): 10.0,
    }
    bd = stall_breakdown(ctx(values))
    assert bd is not None
    assert bd.shares["long_scoreboard"] == pytest.approx(100 * 30 / 90)
    del values[stall_metric("selected")]
    bd = stall_breakdown(ctx(values))
    assert bd is not None
    assert bd.shares["long_scoreboard"] == pytest.approx(30.0)  # the paper's % of active cycles


def test_analyze_without_trigger_raises() -> None:
    from pytest_kernelpro.errors import KernelproError

    no_stalls = ctx({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 10.0})
    with pytest.raises(KernelproError, match="barrier_stalls.*trigger"):
        BarrierStallTool().analyze(no_stalls)
    with pytest.raises(KernelproError, match="warp_stalls"):
        WarpStallTool().analyze(no_stalls)


@pytest.mark.parametrize(("conflicts", "leads"), [(499.0, False), (500.0, True)])
def test_bank_conflicts_lead_mio_advice(conflicts: float, leads: bool) -> None:
    from pytest_kernelpro.tools.signals import SHARED_LD_CONFLICTS, SHARED_LD_WAVEFRONTS

    values = {
        **stall_values(mio_throttle=70.0),
        SHARED_LD_CONFLICTS: conflicts,
        SHARED_LD_WAVEFRONTS: 1000.0,
    }
    f = WarpStallTool().analyze(ctx(values))
    assert (
        f.recommendations[0].action.startswith("Remove the shared-memory bank conflicts") is leads
    )
    assert ("32 + 1" in (f.code_example or "")) is leads
    if leads:
        # 1000 wavefronts of which 500 replays: 2x, under the Amdahl bound 1/(1 - 0.7).
        assert f.recommendations[0].high == pytest.approx(2.0)
        assert sum("bank conflicts" in r.action for r in f.recommendations) == 1


def test_bank_conflict_kernel_of_the_capture() -> None:
    from tools_factories import capture_ctx

    # bank_conflict: 772,190,525 of 805,744,957 shared load wavefronts are replays (95.8%).
    # Removing them leads, capped by the MIO stall share's Amdahl bound.
    f = WarpStallTool().analyze(capture_ctx("bank_conflict_kernel"))
    assert f.severity == "critical"
    assert "mio_throttle" in f.title
    first = f.recommendations[0]
    assert first.action.startswith("Remove the shared-memory bank conflicts first")
    # MIO share of stalled cycles 76.77% (76.5% of active / (100 - 0.3% selected)): 4.30x.
    assert first.high == pytest.approx(1 / (1 - 0.7677), rel=1e-3)
    # tiled matmul (2,120,047 + 164,202 of 555,932,377 wavefronts conflict): register tiling leads.
    tiled = WarpStallTool().analyze(capture_ctx("tiled_matmul_kernel"))
    assert tiled.recommendations[0].action.startswith("Register-tile")
