"""What the gate compares for one kernel: the basis, its tolerance and the two sample sets.

`verdict.compare` decides the status (effect size, Mann-Whitney, lower decile, confirmation)
on whatever this module hands it; this module decides what the samples are:

- **Same device, steady clock:** the times, at the kernel's threshold.
- **Same device, capped, anchored on both sides** (either side's samples mostly in rounds
  with a clock-lowering NVML reason, and both timed in pairs with the same anchor,
  `--kernelpro-clock-anchor=on`): the per-pair kernel / anchor ratios at the threshold
  (`clock_anchor.py`: the anchor ran at the same clock, so the ratio cancels it).
- **Same device, clock-limited without the anchor on both sides** (either side's SM clock
  held below 95% of its maximum by a power or thermal limit, `clock_scale.py`): the times at
  3x the threshold; where one side has anchored samples, the basis says why they were not
  used.
- **Same device, `clock_normalize`:** times scaled by the NVML mean SM clock (cycles; measured
  worse than plain times, kept for comparison).
- **Another device:** time relative to each side's roofline time (1 / efficiency) at the
  cross-device tolerance; another CPU is information only unless `cross_cpu="gate"`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.gate.clock_anchor import (
    ANCHOR_THRESHOLD_FACTOR,
    AnchorSide,
    anchor_missing,
    capped_text,
    entry_anchor,
    record_anchor,
)
from pytest_kernelpro.gate.clock_scale import (
    CLOCK_LIMITED_FACTOR,
    clock_limit_text,
    clock_scale,
    entry_clock_facts,
    record_clock_facts,
)
from pytest_kernelpro.gate.cpu_anchor import (
    CPU_ANCHOR_PREFIX,
    CpuAnchorSide,
    compare_cpu_anchored,
    cpu_anchor_missing,
    entry_cpu_anchor,
    record_cpu_anchor,
)
from pytest_kernelpro.gate.stats import median

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


@dataclass
class Basis:
    """The samples to compare and how to word the change."""

    text: str  # the verdict's basis
    tolerance: float
    now: list[float]
    ref: list[float]
    ratio: float  # now / baseline of the compared quantity's median
    extra: dict[str, Any] = field(default_factory=dict)  # Verdict fields this basis sets
    unit: str = ""  # after "slower by 3.1%": " in cycles", " relative to the clock anchor"
    detail: str = ""  # after the tolerance inside the parentheses
    # CPU anchor (gate/cpu_anchor.py): the load is cancelled by the anchor, so an
    # oversubscribed timing is no reason for "suspect"; `widened` says why the tolerance is
    # above the threshold, `unusable` why the anchor shows the measurement cannot gate.
    load_cancelled: bool = False
    # The fastest decile's tolerance when not the basis's (the CPU anchor: a tolerance widened
    # for between-session noise would ask the noisy decile for more than the median).
    low_tolerance: float | None = None
    widened: str | None = None
    unusable: str | None = None


@dataclass
class Incomparable:
    """No gate on this pair: the basis, the reason and the change where one exists."""

    text: str
    reason: str
    tolerance: float
    change: float | None = None


def _roofline_time(record: KernelRecord) -> float | None:
    value = record.roofline_time_s
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def same_device(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def is_cpu(device: str) -> bool:
    return device.strip().casefold().startswith("cpu")


def same_device_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    current_median: float,
    threshold: float,
    *,
    widen_when_clock_limited: bool,
    clock_normalize: bool,
    clock_anchor: bool,
    anchor_threshold: float | None = None,
) -> Basis:
    """The basis of a comparison on the same device (see the module docstring)."""
    device = record.device or "unknown"
    chosen = Basis(
        text=f"time (same device: {device})",
        tolerance=threshold,
        now=samples,
        ref=list(entry.samples_s),
        ratio=current_median / entry.median_s,
    )
    if is_cpu(device) and clock_anchor:
        cpu_now, cpu_base = record_cpu_anchor(record), entry_cpu_anchor(entry)
        missing = cpu_anchor_missing(cpu_now, cpu_base)
        if missing is None:
            assert cpu_now is not None
            assert cpu_base is not None
            return cpu_anchored_basis(device, cpu_now, cpu_base, chosen.ratio, threshold)
        chosen.text = f"time (same device: {device}; no CPU anchor: {missing})"
        return chosen
    now, base = record_anchor(record), entry_anchor(entry)
    facts_now, facts_base = record_clock_facts(record), entry_clock_facts(entry)
    limited = clock_limit_text(facts_now, facts_base)
    capped = capped_text(facts_now, facts_base)
    if capped is not None and clock_anchor:
        missing = anchor_missing(now, base)
        if missing is None:
            assert now is not None
            assert base is not None
            return anchored_basis(
                device, now, base, limited or capped, chosen.ratio,
                threshold * ANCHOR_THRESHOLD_FACTOR if anchor_threshold is None
                else anchor_threshold,
                facts_now.sm_mhz, facts_base.sm_mhz,
            )  # fmt: skip
        if now is not None or base is not None:
            note = f"no clock anchor: {missing}"
            if limited is not None:
                limited = f"{limited}; {note}"
            else:
                chosen.text = f"time (same device: {device}; {capped}; {note})"
    if limited is not None and widen_when_clock_limited:
        chosen.tolerance = round(threshold * CLOCK_LIMITED_FACTOR, 12)
        chosen.text = (
            f"time (same device: {device}; {limited}: tolerance "
            f"{CLOCK_LIMITED_FACTOR:g}x the threshold)"
        )
        chosen.extra.update(
            clock_limited=limited,
            sm_mhz=facts_now.sm_mhz,
            baseline_sm_mhz=facts_base.sm_mhz,
        )
    scale = clock_scale(facts_now, facts_base) if clock_normalize else None
    if scale is not None:
        chosen.text = f"{scale.describe()} (same device: {device})"
        chosen.now = [v * scale.factor for v in samples]
        chosen.extra.update(
            clock_scale=scale.factor,
            sm_mhz=scale.sm_mhz,
            baseline_sm_mhz=scale.baseline_sm_mhz,
            raw_change=chosen.ratio - 1.0,
        )
        chosen.unit = " in cycles"
        chosen.detail = (
            f"; plain time {_pct(chosen.ratio - 1.0)}, SM clock {scale.sm_mhz:.0f} MHz vs "
            f"{scale.baseline_sm_mhz:.0f} MHz in the baseline, a power or thermal cap setting "
            "the clock"
        )
        chosen.ratio *= scale.factor
    return chosen


def anchored_basis(
    device: str,
    now: AnchorSide,
    base: AnchorSide,
    why: str,
    time_ratio: float,
    tolerance: float,
    sm_mhz: float | None,
    baseline_sm_mhz: float | None,
) -> Basis:
    """The per-pair kernel / anchor ratios of both sides (clock_anchor.py)."""
    anchor_change = now.anchor_median_s / base.anchor_median_s - 1.0
    return Basis(
        text=(
            f"time relative to the clock anchor (same device: {device}; {why}: kernel / "
            f"{now.name}, each sample followed by the anchor in its round, so both ran at the "
            "clock the limit allowed)"
        ),
        tolerance=tolerance,
        now=list(now.ratios),
        ref=list(base.ratios),
        ratio=median(list(now.ratios)) / median(list(base.ratios)),
        extra={
            "anchor": now.name,
            "anchor_change": anchor_change,
            "raw_change": time_ratio - 1.0,
            "sm_mhz": sm_mhz,
            "baseline_sm_mhz": baseline_sm_mhz,
        },
        unit=" relative to the clock anchor",
        detail=f"; plain time {_pct(time_ratio - 1.0)}, anchor GEMM {_pct(anchor_change)}, {why}",
    )


def cpu_anchored_basis(
    device: str, now: CpuAnchorSide, base: CpuAnchorSide, time_ratio: float, threshold: float
) -> Basis:
    """The kernel's on-CPU samples of both sides, read against the CPU anchor (cpu_anchor.py)."""
    facts = compare_cpu_anchored(now, base, threshold)
    return Basis(
        text=(
            f"on-CPU time checked against the CPU anchor (same device: {device}; "
            f"{now.name.removeprefix(CPU_ANCHOR_PREFIX).strip()} after each sample)"
        ),
        tolerance=facts.tolerance,
        now=list(now.kernel_s),
        ref=list(base.kernel_s),
        ratio=1.0 + facts.change,
        extra={
            "anchor": now.name,
            "anchor_change": facts.anchor_move,
            "raw_change": time_ratio - 1.0,
        },
        unit=" in on-CPU time and relative to the CPU anchor",
        detail=f"; wall time {_pct(time_ratio - 1.0)}, {facts.facts()}",
        load_cancelled=True,
        low_tolerance=max(threshold, facts.tolerance / 2.0),
        widened=facts.widened,
        unusable=facts.unusable(),
    )


def cross_device_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    current_median: float,
    cross_tolerance: float,
    cross_cpu: str,
) -> Basis | Incomparable:
    """Time relative to each side's roofline time, or why that cannot gate."""
    rt_now, rt_base = _roofline_time(record), entry.roofline_time_s
    if rt_now is None or not rt_base:
        missing = "this run" if rt_now is None else "the baseline"
        return Incomparable(
            text=f"none (other device: {entry.device} vs {record.device})",
            reason=(
                f"the baseline was measured on {entry.device or 'an unknown device'} and "
                f"this run on {record.device or 'an unknown device'}; {missing} has no "
                "roofline time, so neither time nor efficiency can be compared. Save a "
                f"baseline on {record.device or 'this device'}"
            ),
            tolerance=cross_tolerance,
        )
    text = f"efficiency (other device: {entry.device} vs {record.device})"
    ratio = (current_median / rt_now) / (entry.median_s / rt_base)
    if cross_cpu != "gate" and (is_cpu(record.device) or is_cpu(entry.device)):
        change = ratio - 1.0
        return Incomparable(
            text=text,
            reason=(
                f"the baseline is from another CPU or thread count ({entry.device} vs "
                f"{record.device}): time relative to the roofline changed by "
                f"{_pct(change)}, reported as information only, because CPU efficiency "
                "does not carry across CPUs. Save a baseline on this machine "
                "(--kernelpro-save-baseline), or gate it with --kernelpro-cpu-cross-device=gate"
            ),
            tolerance=cross_tolerance,
            change=change,
        )
    return Basis(
        text=text,
        tolerance=cross_tolerance,
        now=[v / rt_now for v in samples],
        ref=[v / rt_base for v in entry.samples_s],
        ratio=ratio,
    )
