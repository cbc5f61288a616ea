"""Comparisons of power-capped kernels relative to the clock anchor: the rule and its facts.

With `--kernelpro-clock-anchor=on` (the default), a kernel whose warm-up ran under a clock
limit (the power cap) is timed in pairs (`measure/timing/anchor.py`): every sample is followed
in its round by a fixed bf16 GEMM, so both ran at about the clock the cap allowed at that
moment. When either side of a comparison ran capped (`capped_text`: at least half of its
samples in rounds whose NVML readings had a clock-lowering reason, the per-round throttle
flags, which follow the cap where the NVML mean clock does not) and both sides carry pairs
with the same anchor, the gate compares the per-pair kernel / anchor ratios, at
`ANCHOR_THRESHOLD_FACTOR` times the threshold, with the same Mann-Whitney, fastest-decile and
confirmation rules, instead of the times (at 3x the threshold where the NVML clock says
clock-limited, `clock_scale.py`).

Why: the cap moves kernel and anchor alike, so their ratio spreads far less than either time
between two measurements of the same code, and a small slowdown stands out of it; kernel and
anchor do not slow down exactly alike when the clock drops, so the ratio keeps a tolerance of
its own. Kernels at a steady clock are never anchored: their verdicts do not change. Where the
anchor cannot be used (a baseline saved without pairs or with the mode off; another torch or
CUDA build; a side whose warm-up was not capped), the comparison keeps the rule without the
anchor, and the basis says why. The measurements behind the rule and its factor:
bench/results/2026-12-01-gate-accuracy-h200.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kernelpro.gate.baseline import anchor_of_timing
from pytest_kernelpro.gate.clock_scale import CAPPED_SHARE, ClockFacts

# The anchored ratio's tolerance, times the kernel's threshold: the capped GEMMs' ratio
# spread between two measurements of the same code leaves a 3% slowdown caught at this
# factor without false alarms, where the full threshold missed some (module docstring).
ANCHOR_THRESHOLD_FACTOR = 0.75

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord


@dataclass(frozen=True)
class AnchorSide:
    """One side's anchored samples: the anchor's identity, its median, kernel / anchor ratios."""

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
        return "neither side was timed in pairs with the anchor (--kernelpro-clock-anchor=on)"
    if base is None:
        return (
            "the baseline has no anchored samples (saved by a version before them, with "
            "--kernelpro-clock-anchor=off, or with a warm-up at a steady clock): re-save it "
            "to gate this kernel relative to the anchor"
        )
    if now is None:
        return (
            "this run has no anchored samples (--kernelpro-clock-anchor is off, or its "
            "warm-up ran without a clock limit)"
        )
    if now.name != base.name:
        return f"the anchor differs ({now.name} now, {base.name} in the baseline)"
    return None


def _capped(facts: ClockFacts) -> bool:
    return facts.capped_share is not None and facts.capped_share >= CAPPED_SHARE


def capped_text(current: ClockFacts, baseline: ClockFacts) -> str | None:
    """Why the comparison counts as capped ("samples under a clock limit: 100% in this run,
    95% in the baseline"), or None when neither side ran mostly under a limit."""
    if not (_capped(current) or _capped(baseline)):
        return None
    parts = []
    for label, facts in (("this run", current), ("the baseline", baseline)):
        share = "unknown" if facts.capped_share is None else f"{facts.capped_share:.0%}"
        clock = ""
        if facts.sm_mhz is not None and facts.max_sm_mhz is not None:
            clock = f" at {facts.sm_mhz:.0f} of {facts.max_sm_mhz:.0f} MHz"
        parts.append(f"{share} in {label}{clock}")
    return "samples under a power or thermal limit: " + ", ".join(parts)
