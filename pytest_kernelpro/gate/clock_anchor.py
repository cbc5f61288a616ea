"""Clock-limited comparisons relative to the clock anchor: the rule and its facts.

Opt-in (`--kernelpro-clock-anchor=on`): with it, a measurement taken mostly under a clock
limit (the power cap) carries an anchored pass
(`measure/timing/anchor.py`): pairs of (kernel, fixed bf16 GEMM) timed alternately in one
round, so both ran at the clock the cap allowed at that moment. When a comparison is
clock-limited (`clock_scale.ClockFacts.clock_limited`: either side's mean SM clock below 95%
of the maximum with half its samples under a limit) and both sides carry a pass with the same
anchor, the gate compares the kernel / anchor ratios of the two passes at the plain threshold,
instead of widening the tolerance of the times to 3x.

Why: on the H200, two measurements of the same power-capped GEMM or attention kernel
differed by 3.0-3.9% in time (standard deviation) but by 0.7-0.9% in kernel / anchor ratio
(bench/results/2026-12-01-gate-accuracy-h200.md, session 4): the clock moves both alike. On
the same 901 measurements of 7 capped and 2 steady kernels this rule caught 89 of 163 +3%
slowdowns of the capped kernels against 57 of 163 for the 3x tolerance, with the same false
alarms (1 of 163, a comparison neither side of which NVML saw clock-limited, so neither rule
applied) and no change for the steady kernels. Why it is not the default: that is still
short of catching 95% of 3% slowdowns (64% of the +2.5-3.5% ones): a 0.8% spread leaves a
3% change about one spread above the 2% threshold, and the NVML test of "clock-limited"
missed a third of one GEMM's noisy comparisons. Where the anchor cannot be used (a baseline
saved without the pass, another torch or CUDA build, a pass that did not run), the comparison
keeps the widened tolerance, and the basis says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kernelpro.gate.baseline_entry import anchor_of_timing

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline_entry import BaselineEntry
    from pytest_kernelpro.record import KernelRecord


@dataclass(frozen=True)
class AnchorSide:
    """One side's anchored pass: the anchor's identity, its median, kernel / anchor ratios."""

    name: str
    anchor_median_s: float
    ratios: tuple[float, ...]


def record_anchor(record: KernelRecord) -> AnchorSide | None:
    found = anchor_of_timing(record.timing.anchor if record.timing else None)
    return None if found is None else AnchorSide(found[0], found[1], tuple(found[2]))


def entry_anchor(entry: BaselineEntry) -> AnchorSide | None:
    ratios = tuple(entry.anchor_ratios or ())
    if not entry.anchor or not ratios or not entry.anchor_median_s:
        return None
    return AnchorSide(entry.anchor, float(entry.anchor_median_s), ratios)


def anchor_missing(now: AnchorSide | None, base: AnchorSide | None) -> str | None:
    """Why two sides cannot be compared relative to the anchor, or None when they can."""
    if base is None and now is None:
        return "neither side has an anchored pass (--kernelpro-clock-anchor=on adds it)"
    if base is None:
        return (
            "the baseline has no anchored pass (saved before the clock anchor existed, or "
            "at a steady clock): re-save it to gate this kernel relative to the anchor"
        )
    if now is None:
        return (
            "this run has no anchored pass (--kernelpro-clock-anchor is off, or its samples "
            "were not mostly clock-limited)"
        )
    if now.name != base.name:
        return f"the anchor differs ({now.name} now, {base.name} in the baseline)"
    return None
