"""OccupancyTool, SmallGridTool, TailEffectTool, LaunchConfigTool."""

from __future__ import annotations

import pytest
from tools_factories import by_tool, ctx, probe_ctx, probe_run

from pytest_kernelpro.tools.launch import LaunchConfigTool, SmallGridTool, TailEffectTool
from pytest_kernelpro.tools.occupancy import OccupancyTool

THEO = "sm__maximum_warps_per_active_cycle_pct"
ACH = "sm__warps_active.avg.pct_of_peak_sustained_active"
ELIG = "smsp__warps_eligible.avg.per_cycle_active"
LIMITS = {
    "launch__occupancy_limit_registers": 2.0,
    "launch__occupancy_limit_shared_mem": 8.0,
    "launch__occupancy_limit_warps": 8.0,
    "launch__occupancy_limit_blocks": 32.0,
}


def occ(theo: float, ach: float, eligible: float = 0.5, **extra: float) -> dict[str, float]:
    return {THEO: theo, ACH: ach, ELIG: eligible, **LIMITS, **extra}


@pytest.mark.parametrize(
    ("theo", "ach", "fires"),
    [(80.0, 75.0, False), (79.9, 75.0, True), (100.0, 90.0, False), (100.0, 89.9, True)],
)
def test_occupancy_thresholds(theo: float, ach: float, fires: bool) -> None:
    assert OccupancyTool().trigger(ctx(occ(theo, ach))) is fires


def test_occupancy_names_register_limiter_and_target() -> None:
    c = ctx(
        occ(
            25.0,
            24.0,
            eligible=0.4,
            **{
                "launch__block_size": 256.0,
                "launch__registers_per_thread": 128.0,
                "device__attribute_max_registers_per_multiprocessor": 65536.0,
            },
        )
    )
    f = OccupancyTool().analyze(c)
    assert f.severity == "critical"  # achieved < 25% and < 1 eligible warp per scheduler
    assert "limited by registers" in f.root_cause
    assert "128 registers/thread" in f.root_cause
    # 65536 / (256 * 3 blocks) = 85.3 -> 80 registers (multiple of 8) fits one more block.
    assert "at most 80 registers/thread" in f.recommendations[0].action
    assert "launch__occupancy_limit_registers" in f.evidence


@pytest.mark.parametrize(
    ("ach", "eligible", "expected"),
    [(20.0, 0.5, "critical"), (40.0, 0.5, "high"), (70.0, 0.5, "medium"), (40.0, 1.0, "low")],
)
def test_occupancy_severity_follows_scheduler_starvation(
    ach: float, eligible: float, expected: str
) -> None:
    assert OccupancyTool().analyze(ctx(occ(100.0, ach, eligible))).severity == expected


def test_occupancy_low_when_a_pipe_is_busy() -> None:
    values = occ(
        18.75,
        14.0,
        eligible=0.13,
        **{"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": 83.0},
    )
    f = OccupancyTool().analyze(ctx(values))
    assert f.severity == "low"
    assert "tensor pipe is already 83.0% busy" in f.root_cause


def test_occupancy_on_fixtures() -> None:
    # naive_softmax: 6.2% achieved of 100% - the small grid explains it, small_grid reports it.
    assert not OccupancyTool().trigger(probe_ctx("naive_softmax_kernel"))
    # triton softmax: theoretical 56.25% limited by 55 registers/thread (9 blocks/SM).
    f = OccupancyTool().analyze(probe_ctx("softmax_kernel"))
    assert "registers" in f.root_cause
    assert "55 registers/thread" in f.root_cause
    # nvjet (cuBLAS wgmma): 18.75% theoretical by design, tensor pipe 83% busy.
    assert (
        by_tool(probe_run("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"))["occupancy"] == "low"
    )
    # Good occupancy: naive matmul 97.9% of 100%.
    assert not OccupancyTool().trigger(probe_ctx("naive_matmul_kernel"))


GRID = "launch__grid_size"
SMS = "launch__sm_count"


@pytest.mark.parametrize(
    ("grid", "expected"),
    [
        (132, None),
        (131, "low"),
        (119, "low"),
        (118, "medium"),
        (99, "high"),
        (66, "critical"),
        (1, "critical"),
    ],
)
def test_small_grid_thresholds(grid: int, expected: str | None) -> None:
    c = ctx({GRID: float(grid), SMS: 132.0})
    tool = SmallGridTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert f.recommendations[0].high == pytest.approx(132 / grid)


def test_small_grid_on_naive_softmax() -> None:
    f = SmallGridTool().analyze(probe_ctx("naive_softmax_kernel"))
    assert f.severity == "critical"
    assert "64 blocks for 132 SMs" in f.title
    assert "51.5%" in f.title
    assert not SmallGridTool().trigger(probe_ctx("vec_add_kernel"))


def tail(grid: float, per_sm: float = 8.0) -> dict[str, float]:
    return {
        GRID: grid,
        SMS: 100.0,
        "launch__occupancy_limit_registers": per_sm,
        "launch__occupancy_limit_warps": 16.0,
        "launch__occupancy_limit_blocks": 32.0,
    }


@pytest.mark.parametrize(
    ("grid", "idle", "expected"),
    [
        (800 + 720, 100 * (1 - 720 / 800) / 2, None),  # 5% idle
        (800 + 640, 10.0, "medium"),  # last wave 80% full after one wave: exactly 10%
        (800 + 648, 9.5, None),
        (800 + 400, 25.0, "high"),
        (1600, 0.0, None),  # whole waves: no tail
    ],
)
def test_tail_effect_thresholds(grid: int, idle: float, expected: str | None) -> None:
    c = ctx(tail(float(grid)))
    tool = TailEffectTool()
    assert tool.trigger(c) is (expected is not None)
    if expected:
        f = tool.analyze(c)
        assert f.severity == expected
        assert f.evidence["tail idle share"].value == pytest.approx(idle, abs=0.01)


def test_tail_effect_on_fixtures_is_quieter_than_ncu() -> None:
    # spill: 4096 blocks = 3 waves of 1056 + 928 (88% full): ~3% idle, ncu's rule says 25%.
    tool = TailEffectTool()
    spill = probe_ctx("spill_kernel")
    assert not tool.trigger(spill)
    assert tool._waves(spill) == pytest.approx((4096.0, 1056.0, 3, 928, 100 * (1 - 928 / 1056) / 4))
    # wmma: 1 wave of 2112 + 1984 (94% full): ~3% idle, ncu says 50%.
    assert not tool.trigger(probe_ctx("wmma_matmul_kernel"))


@pytest.mark.parametrize(
    ("block", "fires"), [(96.0, False), (100.0, True), (256.0, False), (33.0, True)]
)
def test_launch_config_block_multiple_of_32(block: float, fires: bool) -> None:
    assert LaunchConfigTool().trigger(ctx({"launch__block_size": block})) is fires


def test_launch_config_small_blocks_hit_block_limit() -> None:
    values = {
        "launch__block_size": 32.0,
        "launch__occupancy_limit_blocks": 32.0,
        "launch__occupancy_limit_warps": 64.0,
        "launch__occupancy_limit_registers": 64.0,
    }
    f = LaunchConfigTool().analyze(ctx(values))
    assert "per-SM block limit" in f.root_cause
    assert f.severity == "medium"
    values["launch__block_size"] = 64.0
    assert not LaunchConfigTool().trigger(ctx(values))


def test_launch_config_quiet_on_fixtures() -> None:
    for base in (
        "naive_softmax_kernel",
        "tiled_matmul_kernel",
        "vec_add_kernel",
        "wmma_matmul_kernel",
    ):
        assert not LaunchConfigTool().trigger(probe_ctx(base)), base


@pytest.mark.parametrize(("grid", "expected"), [(131, "low"), (132, "critical")])
def test_occupancy_defers_to_small_grid(grid: int, expected: str) -> None:
    # Theoretical 50% (32 blocks of 32 threads), achieved 1%, schedulers starved: with fewer
    # blocks than SMs no per-SM limit binds yet, small_grid owns the finding.
    values = {
        "sm__maximum_warps_per_active_cycle_pct": 50.0,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 1.0,
        "smsp__warps_eligible.avg.per_cycle_active": 0.01,
        "launch__grid_size": float(grid),
        "launch__sm_count": 132.0,
        "launch__occupancy_limit_blocks": 32.0,
        "launch__block_size": 32.0,
    }
    f = OccupancyTool().analyze(ctx(values))
    assert f.severity == expected
    if expected == "low":
        assert "see small_grid" in f.root_cause


def test_occupancy_on_the_capture_tiny_kernel() -> None:
    from tools_factories import capture_ctx

    # tiny_kernel: 1 block of 32 threads; small_grid is critical, occupancy only low.
    f = OccupancyTool().analyze(capture_ctx("tiny_kernel"))
    assert f.severity == "low"
    assert SmallGridTool().analyze(capture_ctx("tiny_kernel")).severity == "critical"
