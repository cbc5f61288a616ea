"""Power-capped kernels: the gate's tolerance when the clock was held down by a limit.

A compute-bound kernel (fp16/bf16/TF32 GEMMs, attention) runs at the GPU's power cap: the SM
clock the cap allows moves from one measurement to the next, and the kernel's time with it,
so two measurements of the same code differ by more than the default threshold and the plain
gate raises false alarms on them, while kernels at a steady clock do not.

So the gate derives the tolerance from the measurement's clock state: when either side's
samples ran with the SM clock held below `CLOCK_LIMITED_FRACTION` of its maximum by a
clock-lowering reason (power cap, thermal or hardware slowdown, on at least half of its
samples: `ClockReading.throttled`), a regression must exceed `CLOCK_LIMITED_FACTOR` times the
threshold; smaller changes are "suspect" with the reason. A kernel whose clock stays near the
maximum under the cap keeps the plain threshold. This trades detection of small slowdowns of
such kernels for false alarms that are rare.

With `--kernelpro-clock-anchor=on` (the default) a comparison where either side's samples ran
mostly capped and both sides were timed in pairs with the clock anchor is made relative to
the anchor instead (`clock_anchor.py`); this tolerance is the rule without the pairs (`off`,
or a baseline saved without them).

Also here, not the default: comparing cycles, the current samples scaled by (current mean
SM clock / baseline mean SM clock) for compute-bound capped kernels (`clock_scale`,
`compare(..., clock_normalize=True)`). It is not the default because the mean NVML SM clock of
a measurement does not follow its kernel's time, and the scaling widened the capped GEMMs'
spread. The measurements: bench/results/2026-12-01-gate-accuracy-h200.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord

CAPPED_SHARE = 0.5  # at least this share of a measurement's samples under a clock limit
CLOCK_LIMITED_FRACTION = 0.95  # mean SM clock below this share of the maximum: held down
CLOCK_LIMITED_FACTOR = 3.0  # the tolerance of a clock-limited comparison, times the threshold


@dataclass(frozen=True)
class ClockFacts:
    """What one measurement says about the clock it ran at."""

    sm_mhz: float | None  # mean SM clock over the readings taken while samples ran
    capped_share: float | None  # share of samples taken in rounds with a clock limit
    bound: str | None  # the reference's roofline bound: "compute", "memory", "mixed"
    max_sm_mhz: float | None = None  # the GPU's maximum SM clock (NVML)

    @property
    def clock_limited(self) -> bool:
        """The samples ran with the SM clock held below 95% of its maximum by a limit."""
        return (
            self.capped_share is not None
            and self.capped_share >= CAPPED_SHARE
            and self.sm_mhz is not None
            and self.max_sm_mhz is not None
            and self.sm_mhz < CLOCK_LIMITED_FRACTION * self.max_sm_mhz
        )


def _positive(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def record_clock_facts(record: KernelRecord) -> ClockFacts:
    """The clock facts of a measured record (None fields where it has no NVML readings)."""
    timing = record.timing
    clocks = (timing.clocks if timing else None) or {}
    n = len((timing.samples_s if timing else None) or ())
    throttled = timing.throttled_samples if timing else None
    share = (float(throttled) / n) if n and isinstance(throttled, (int, float)) else None
    bound = record.roofline.bound if record.roofline else None
    return ClockFacts(
        sm_mhz=_positive(clocks.get("sm_mhz_mean")),
        capped_share=share,
        bound=bound if isinstance(bound, str) else None,
        max_sm_mhz=_positive(clocks.get("max_sm_mhz")),
    )


def entry_clock_facts(entry: BaselineEntry) -> ClockFacts:
    return ClockFacts(
        sm_mhz=_positive(entry.sm_mhz),
        capped_share=entry.clock_capped_share,
        bound=entry.bound,
        max_sm_mhz=_positive(entry.max_sm_mhz),
    )


def clock_limit_text(current: ClockFacts, baseline: ClockFacts) -> str | None:
    """Why the comparison is clock-limited ("the SM clock was held at 1568 of 1980 MHz by a
    power or thermal limit in this run"), or None when neither side was."""
    sides = []
    for label, facts in (("this run", current), ("the baseline", baseline)):
        if facts.clock_limited:
            sides.append(f"{facts.sm_mhz:.0f} of {facts.max_sm_mhz:.0f} MHz in {label}")
    if not sides:
        return None
    return "SM clock held at " + " and ".join(sides) + " by a power or thermal limit"


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
