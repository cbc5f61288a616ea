"""Compare power-capped compute-bound kernels at the same SM clock.

On the H200 a compute-bound kernel (fp16/bf16/TF32 GEMMs, convolutions, attention) runs at
the power cap: the SM clock the cap allows moved between 1500 and 1740 MHz from one
measurement to the next, and the kernel's time with it, by 1-6% between two measurements of
the same code (bench/results/2026-12-01-gate-accuracy-h200.md). A 3% slowdown is inside that
noise, so a time comparison catches it about one time in three. Such a kernel's time is cycles
over clock: its cycles do not move with the cap, so the gate compares them. Concretely the
current samples are scaled by (current mean SM clock / baseline mean SM clock), which is the
time the current run would have taken at the baseline's clock, and the gate's rules then apply
to the scaled samples as usual.

Why not a threshold derived from each kernel's noise: that widens the gate for exactly these
kernels (it can only lower false alarms, never raise detection), and the noise it would learn
is the clock's, which is measured directly. Why not a locked clock: changing a GPU's clocks
needs root and changes the machine for everyone else on it; the plugin measures the GPU as it
finds it.

When it applies (all of):
- both the measurement and its baseline entry carry a mean SM clock (NVML readings while the
  samples ran, `measure/clocks.py`);
- at least one side spent half its samples or more under a clock-lowering reason (power cap,
  thermal slowdown, hardware slowdown: `ClockReading.throttled`), so the clock was set by a
  limit that moves, not by the boost table;
- the kernel is compute-bound by its roofline (its reference's FLOPs over bytes above the
  ridge point). A memory-bound kernel's time follows the memory clock, which the power cap
  leaves alone: scaling it by the SM clock would add the clock's noise, not remove it.
  Without a roofline (flops= and bytes= unknown) nothing is scaled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.results import KernelRecord

CAPPED_SHARE = 0.5  # at least this share of a measurement's samples under a clock limit


@dataclass(frozen=True)
class ClockFacts:
    """What one measurement says about the clock it ran at."""

    sm_mhz: float | None  # mean SM clock over the readings taken while samples ran
    capped_share: float | None  # share of samples taken in rounds with a clock limit
    bound: str | None  # the reference's roofline bound: "compute", "memory", "mixed"


def _positive(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def record_clock_facts(record: KernelRecord) -> ClockFacts:
    """The clock facts of a measured record (None fields where it has no NVML readings)."""
    timing = record.timing or {}
    clocks = timing.get("clocks") or {}
    n = len(timing.get("samples_s") or [])
    throttled = timing.get("throttled_samples")
    share = (float(throttled) / n) if n and isinstance(throttled, (int, float)) else None
    bound = (record.roofline or {}).get("bound")
    return ClockFacts(
        sm_mhz=_positive(clocks.get("sm_mhz_mean")),
        capped_share=share,
        bound=bound if isinstance(bound, str) else None,
    )


def entry_clock_facts(entry: BaselineEntry) -> ClockFacts:
    return ClockFacts(
        sm_mhz=_positive(entry.sm_mhz),
        capped_share=entry.clock_capped_share,
        bound=entry.bound,
    )


@dataclass(frozen=True)
class ClockScale:
    """The factor that brings the current samples to the baseline's clock, and why."""

    factor: float  # current SM MHz / baseline SM MHz
    sm_mhz: float
    baseline_sm_mhz: float

    def describe(self) -> str:
        return (
            f"cycles: times scaled to the baseline's SM clock ({self.sm_mhz:.0f} MHz now, "
            f"{self.baseline_sm_mhz:.0f} MHz in the baseline, under the power or thermal cap)"
        )


def clock_scale(current: ClockFacts, baseline: ClockFacts) -> ClockScale | None:
    """The scale to apply (see the module docstring), or None to compare plain times."""
    if current.sm_mhz is None or baseline.sm_mhz is None:
        return None
    capped = any(
        share is not None and share >= CAPPED_SHARE
        for share in (current.capped_share, baseline.capped_share)
    )
    if not capped:
        return None
    bound = current.bound or baseline.bound
    if bound != "compute" or (baseline.bound not in (None, "compute")):
        return None
    return ClockScale(current.sm_mhz / baseline.sm_mhz, current.sm_mhz, baseline.sm_mhz)
