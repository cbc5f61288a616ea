"""NVML clocks: graceful without NVML or a GPU; reason decoding and summaries."""

from __future__ import annotations

import json

import pytest

from pytest_kernelpro.measure.clocks import (
    ClockReading,
    decode_reasons,
    open_monitor,
    summarize_readings,
)


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def test_no_nvml_gives_none_without_exception() -> None:
    if _nvml_works():
        pytest.skip("NVML works on this machine (covered by the gpu test)")
    assert open_monitor(0) is None
    assert open_monitor(3, uuid="GPU-00000000-0000-0000-0000-000000000000") is None


def test_decode_reasons() -> None:
    assert decode_reasons(0) == ()
    assert decode_reasons(0x1 | 0x4) == ("gpu_idle", "sw_power_cap")
    assert decode_reasons(0x40 | 0x400) == ("hw_thermal_slowdown", "bit_0x400")


def reading(sm: int | None, reasons: tuple[str, ...], t: float = 0.0) -> ClockReading:
    return ClockReading(t, sm, 2619, reasons, 45, 420.0, max_sm_mhz=1980)


@pytest.mark.parametrize(
    ("sm", "reasons", "throttled"),
    [
        (1980, (), False),
        (1755, ("sw_power_cap",), True),  # power-capped GEMM
        (1980, ("applications_clocks_setting",), False),
        (1400, (), True),  # below 75% of max while busy: nvbench's rule
        (345, ("gpu_idle",), False),  # idle clocks say nothing about the work
        (None, (), False),
    ],
)
def test_throttled_rule(sm: int | None, reasons: tuple[str, ...], throttled: bool) -> None:
    assert reading(sm, reasons).throttled is throttled


def test_summary_uses_busy_readings_and_lists_reasons() -> None:
    rows = [
        reading(1980, (), 0.0),
        reading(1755, ("sw_power_cap",), 0.01),
        reading(345, ("gpu_idle",), 0.02),
        reading(1830, ("sw_power_cap", "sw_thermal_slowdown"), 0.03),
    ]
    s = summarize_readings(rows)
    assert s is not None
    assert (s["sm_mhz_start"], s["sm_mhz_end"]) == (1980, 1830)
    assert (s["sm_mhz_min"], s["sm_mhz_max"]) == (1755, 1980)  # the idle 345 is left out
    assert s["sm_mhz_mean"] == pytest.approx((1980 + 1755 + 1830) / 3)
    assert s["reasons_seen"] == ["sw_power_cap", "gpu_idle", "sw_thermal_slowdown"]
    assert s["throttled_readings"] == 2
    assert (s["readings"], s["busy_readings"]) == (4, 3)
    json.dumps(s, allow_nan=False)
    assert summarize_readings([]) is None


@pytest.mark.gpu
def test_monitor_reads_the_gpu() -> None:
    torch = pytest.importorskip("torch")
    props = torch.cuda.get_device_properties(0)
    monitor = open_monitor(0, str(getattr(props, "uuid", "")) or None)
    if monitor is None:
        pytest.skip("NVML not usable here")
    try:
        r = monitor.read()
    finally:
        monitor.close()
    assert r.sm_mhz
    assert r.sm_mhz > 0
    assert r.mem_mhz
    assert r.mem_mhz > 0
    assert monitor.max_sm_mhz
    assert monitor.max_sm_mhz >= r.sm_mhz
