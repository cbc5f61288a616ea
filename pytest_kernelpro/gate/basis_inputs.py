"""What one measurement says that the verdict's basis is chosen on: the clock its samples ran
at, its pairs with the clock anchor, its pairs with the CPU anchor.

These are readers of a record's timing, without any rule: the baseline keeps what they read
(`baseline.BaselineEntry.from_record`), and `verdict_basis.py` reads the same facts of a
baseline entry and decides which time the verdict is decided on. They live apart from both so
that the baseline does not import the rules, and the rules can import the baseline.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.record import KernelRecord

# How a CPU timing lays out its anchored samples (measure/timing/cpu.CPU_LAYOUT): each sample
# followed by the anchor, both in on-CPU time.
CPU_LAYOUT = "cpu-pairs"
BUSY_RUN_QUEUE_SHARE = 0.10  # the kernel waited for a core this share of its wall time: busy


def positive(value: Any) -> float | None:
    """`value` as a finite positive float, or None (not a number, zero, negative, NaN)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def _finite_positive_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def positive_list(values: Any) -> tuple[float, ...]:
    """The positive numbers of `values`, in order (others dropped)."""
    out = []
    for value in values or ():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            out.append(float(value))
    return tuple(out)


@dataclass(frozen=True)
class ClockFacts:
    """What one measurement says about the clock it ran at (GPU timings with NVML readings)."""

    sm_mhz: float | None  # mean SM clock over the readings taken while samples ran
    capped_share: float | None  # share of samples taken in rounds with a clock limit
    bound: str | None  # the reference's roofline bound: "compute", "memory", "mixed"
    max_sm_mhz: float | None = None  # the GPU's maximum SM clock (NVML)


def record_clock_facts(record: KernelRecord) -> ClockFacts:
    """The clock facts of a measured record (None fields where it has no NVML readings)."""
    timing = record.timing
    clocks = (timing.clocks if timing else None) or {}
    n = len((timing.samples_s if timing else None) or ())
    throttled = timing.throttled_samples if timing else None
    share = (float(throttled) / n) if n and isinstance(throttled, (int, float)) else None
    bound = record.roofline.bound if record.roofline else None
    return ClockFacts(
        sm_mhz=positive(clocks.get("sm_mhz_mean")),
        capped_share=share,
        bound=bound if isinstance(bound, str) else None,
        max_sm_mhz=positive(clocks.get("max_sm_mhz")),
    )


@dataclass(frozen=True)
class AnchorSide:
    """One side's pairs with the clock anchor: the anchor's identity, its median, and the
    kernel / anchor ratio of each pair (measure/timing/anchor.py)."""

    name: str
    anchor_median_s: float
    ratios: tuple[float, ...]


def anchor_of_timing(anchor: Any) -> AnchorSide | None:
    """The clock-anchored pairs of a timing's `anchor` dict, or None without them."""
    if not isinstance(anchor, dict):
        return None
    name, median = anchor.get("name"), anchor.get("anchor_median_s")
    ratios = tuple(float(v) for v in anchor.get("ratios") or () if _finite_positive_number(v))
    if not isinstance(name, str) or not name or not _finite_positive_number(median) or not ratios:
        return None
    return AnchorSide(name, float(median), ratios)


def record_anchor(record: KernelRecord) -> AnchorSide | None:
    return anchor_of_timing(record.timing.anchor if record.timing else None)


@dataclass(frozen=True)
class CpuAnchorSide:
    """One side's pairs with the CPU anchor: the anchor's identity, the kernel's on-CPU
    samples, the anchor's, and why the machine counted as busy (None: it did not)."""

    name: str
    kernel_s: tuple[float, ...]
    anchor_s: tuple[float, ...]
    busy: str | None = None


def busy_reason(cpu_load: Mapping[str, Any] | None, run_queue_share: Any) -> str | None:
    """Why a CPU timing counts as taken on a busy machine, or None."""
    reasons = []
    if cpu_load and cpu_load.get("oversubscribed"):
        reasons.extend(cpu_load.get("reasons") or ["the CPU was oversubscribed"])
    if isinstance(run_queue_share, (int, float)) and run_queue_share > BUSY_RUN_QUEUE_SHARE:
        reasons.append(f"the kernel waited for a core {run_queue_share:.0%} of its wall time")
    return "; ".join(reasons) or None


def record_cpu_anchor(record: KernelRecord) -> CpuAnchorSide | None:
    """The CPU-anchored samples of a measured record, or None without them."""
    timing = record.timing
    anchor = timing.anchor if timing else None
    if timing is None or not isinstance(anchor, Mapping) or anchor.get("layout") != CPU_LAYOUT:
        return None
    name = anchor.get("name")
    kernel, anchors = positive_list(anchor.get("kernel_s")), positive_list(anchor.get("anchor_s"))
    if not isinstance(name, str) or not kernel or not anchors:
        return None
    return CpuAnchorSide(
        name, kernel, anchors, busy_reason(timing.cpu_load, anchor.get("run_queue_share"))
    )
