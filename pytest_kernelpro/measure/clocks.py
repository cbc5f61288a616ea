"""GPU clocks, clock-event ("throttle") reasons, temperature and power through NVML.

Uses nvidia-ml-py (import name `pynvml`). Everything degrades to None: no pynvml, no NVML
library, no GPU, a query the driver refuses. Nothing here imports torch; the caller maps its
CUDA device to NVML (by UUID, because CUDA_VISIBLE_DEVICES renumbers devices for CUDA but
not for NVML).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# NVML clock-event reason bits (nvml.h `nvmlClocksEventReason*`; stable ABI values), so the
# decoding works and is testable without the library.
REASON_BITS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that do not lower the clock below what the work would otherwise get: an idle GPU,
# clocks an administrator set (application clocks) and the display clock. Every other reason
# (power cap, thermal, hardware slowdown, power brake, sync boost) lowers clocks during work.
BENIGN_REASONS = frozenset({"gpu_idle", "applications_clocks_setting", "display_clock_setting"})
# nvbench's --throttle-threshold default: an SM clock below 75% of the maximum while the GPU
# is busy counts as throttled even when no reason bit is set.
LOW_CLOCK_FRACTION = 0.75


def decode_reasons(mask: int) -> tuple[str, ...]:
    """Names of the reason bits set in an NVML clock-event mask, lowest bit first.

    Unknown bits come out as `bit_0x...` so a newer driver's reason is not lost.
    """
    names = [name for bit, name in REASON_BITS.items() if mask & bit]
    unknown = mask & ~sum(REASON_BITS)
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.append(f"bit_{bit:#x}")
        bit <<= 1
    return tuple(names)


@dataclass(frozen=True)
class ClockReading:
    """One NVML reading; any field the driver refused is None."""

    t_s: float  # time.perf_counter() when read
    sm_mhz: int | None
    mem_mhz: int | None
    reasons: tuple[str, ...]
    temperature_c: int | None
    power_w: float | None
    max_sm_mhz: int | None = None

    @property
    def throttled(self) -> bool:
        """True when a non-benign reason is set, or the busy SM clock is below 75% of max."""
        if any(r not in BENIGN_REASONS for r in self.reasons):
            return True
        if "gpu_idle" in self.reasons or not self.sm_mhz or not self.max_sm_mhz:
            return False
        return self.sm_mhz < LOW_CLOCK_FRACTION * self.max_sm_mhz


class ClockMonitor:
    """An open NVML handle for one GPU; `read()` takes one `ClockReading`.

    Create with `open_monitor`; call `close()` when done (NVML init is reference-counted).
    """

    def __init__(self, nvml: Any, handle: Any, nvml_index: int | None, name: str) -> None:
        self._nvml = nvml
        self._handle = handle
        self.nvml_index = nvml_index
        self.name = name
        self.max_sm_mhz = self._query(nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_SM)
        # Newer drivers name it "clocks event reasons"; older ones "throttle reasons".
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or (
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        self._closed = False

    @staticmethod
    def _query(fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # any NVMLError (not supported, no permission, GPU lost)
            return None

    def read(self) -> ClockReading:
        """Read clocks, reasons, temperature and power now (each None if refused)."""
        nvml, h = self._nvml, self._handle
        mask = self._query(self._reasons_fn, h)
        power_mw = self._query(nvml.nvmlDeviceGetPowerUsage, h)
        return ClockReading(
            t_s=time.perf_counter(),
            sm_mhz=self._query(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
            mem_mhz=self._query(nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
            reasons=decode_reasons(int(mask)) if mask is not None else (),
            temperature_c=self._query(nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000.0,
            max_sm_mhz=self.max_sm_mhz,
        )

    def close(self) -> None:
        """Release this monitor's NVML reference."""
        if not self._closed:
            self._closed = True
            self._query(self._nvml.nvmlShutdown)


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def open_monitor(cuda_index: int = 0, uuid: str | None = None) -> ClockMonitor | None:
    """An NVML monitor for CUDA device `cuda_index`, or None when NVML or the GPU is missing.

    `uuid` (torch's `get_device_properties(i).uuid`, with or without the `GPU-` prefix) picks
    the right NVML device under CUDA_VISIBLE_DEVICES; without it the CUDA index is used as the
    NVML index only when CUDA_VISIBLE_DEVICES is unset (otherwise the mapping is unknown and
    the answer is None rather than another GPU's clocks).
    """
    try:
        import pynvml as nvml
    except ImportError:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    try:
        handle = None
        if uuid:
            text = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
            handle = ClockMonitor._query(nvml.nvmlDeviceGetHandleByUUID, text)
        if handle is None and "CUDA_VISIBLE_DEVICES" not in os.environ:
            handle = ClockMonitor._query(nvml.nvmlDeviceGetHandleByIndex, cuda_index)
        if handle is None:
            nvml.nvmlShutdown()
            return None
        index = ClockMonitor._query(nvml.nvmlDeviceGetIndex, handle)
        name = _as_str(ClockMonitor._query(nvml.nvmlDeviceGetName, handle) or "unknown GPU")
        return ClockMonitor(nvml, handle, index, name)
    except Exception:
        ClockMonitor._query(nvml.nvmlShutdown)
        return None


def summarize_readings(readings: Sequence[ClockReading]) -> dict[str, Any] | None:
    """Start/end/min/max/mean of the clocks, every reason seen, temperature and power.

    None for no readings. Readings with the GPU idle (between rounds) are left out of the
    clock statistics when busy ones exist, since idle clocks say nothing about the work.
    """
    if not readings:
        return None
    busy = [r for r in readings if "gpu_idle" not in r.reasons] or list(readings)

    def series(attr: str, rows: Sequence[ClockReading]) -> list[float]:
        return [float(v) for v in (getattr(r, attr) for r in rows) if v is not None]

    sm = series("sm_mhz", busy)
    temps = series("temperature_c", readings)
    power = series("power_w", busy)
    seen: list[str] = []
    for r in readings:
        seen.extend(x for x in r.reasons if x not in seen)
    return {
        "readings": len(readings),
        "busy_readings": len(busy),
        "sm_mhz_start": readings[0].sm_mhz,
        "sm_mhz_end": readings[-1].sm_mhz,
        "sm_mhz_min": min(sm) if sm else None,
        "sm_mhz_max": max(sm) if sm else None,
        "sm_mhz_mean": sum(sm) / len(sm) if sm else None,
        "max_sm_mhz": readings[0].max_sm_mhz,
        "mem_mhz_start": readings[0].mem_mhz,
        "mem_mhz_end": readings[-1].mem_mhz,
        "reasons_seen": seen,
        "throttled_readings": sum(r.throttled for r in readings),
        "temperature_c_start": readings[0].temperature_c,
        "temperature_c_end": readings[-1].temperature_c,
        "temperature_c_max": max(temps) if temps else None,
        "power_w_mean": sum(power) / len(power) if power else None,
        "power_w_max": max(power) if power else None,
    }
