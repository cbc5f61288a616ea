"""The verdict's basis on one GPU under a clock limit: which time is compared when either side
ran capped or clock-limited, at which tolerance.

**Clock-limited kernels.** A compute-bound kernel (fp16/bf16/TF32 GEMMs, attention) runs at
the GPU's power cap: the SM clock the cap allows moves from one measurement to the next, and
the kernel's time with it, so two measurements of the same code differ by more than the
default threshold. When either side ran with the SM clock held below `CLOCK_LIMITED_FRACTION`
of its maximum by a clock-lowering reason on at least `CAPPED_SHARE` of its samples, and the
anchor below is not on both sides, a regression must exceed `CLOCK_LIMITED_FACTOR` times the
threshold; smaller changes are "suspect" with the reason. Times are not scaled to cycles by
the clock: the mean NVML SM clock of a measurement does not follow its kernel's time, and the
scaling widened the capped GEMMs' spread (bench/results/2026-12-01-gate-accuracy-h200.md).

**The clock anchor.** A kernel whose warm-up ran capped is timed in pairs
(`measure/timing/anchor.py`): every sample is followed in its round by a fixed bf16 GEMM, so
both ran at about the clock the cap allowed. Where either side ran capped and both were timed
in pairs with the same anchor, the per-pair kernel / anchor ratios are compared, at
`ANCHOR_THRESHOLD_FACTOR` times the threshold: the cap moves kernel and anchor alike, so their
ratio spreads far less than either time between two measurements of the same code; kernel and
anchor do not slow down exactly alike when the clock drops, so the ratio keeps a tolerance of
its own. Kernels at a steady clock are never anchored. Where the anchor cannot be used (a
baseline saved without pairs, another torch or CUDA build, a side whose warm-up was not
capped) the rule without the anchor holds and the basis says why
(bench/results/2026-12-01-gate-accuracy-h200.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_kernelpro.gate.baseline import (
    AnchorSide,
    Basis,
    ClockFacts,
    median,
    pct_text,
    positive,
    record_anchor,
    record_clock_facts,
)

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord

CAPPED_SHARE = 0.5  # at least this share of a measurement's samples under a clock limit
CLOCK_LIMITED_FRACTION = 0.95  # mean SM clock below this share of the maximum: held down
CLOCK_LIMITED_FACTOR = 3.0  # the tolerance of a clock-limited comparison, times the threshold
# The anchored ratio's tolerance, times the kernel's threshold: the ratio spreads less than
# the times, so a smaller factor still raises no false alarm and catches small slowdowns the
# full threshold misses (bench/results/2026-12-01-gate-accuracy-h200.md).
ANCHOR_THRESHOLD_FACTOR = 0.75


def entry_clock_facts(entry: BaselineEntry) -> ClockFacts:
    return ClockFacts(
        sm_mhz=positive(entry.sm_mhz),
        capped_share=entry.clock_capped_share,
        bound=entry.bound,
        max_sm_mhz=positive(entry.max_sm_mhz),
    )


def entry_anchor(entry: BaselineEntry) -> AnchorSide | None:
    ratios = tuple(entry.anchor_ratios or ())
    if not entry.anchor or not ratios or not entry.anchor_median_s:
        return None
    return AnchorSide(entry.anchor, float(entry.anchor_median_s), ratios)


def _capped(facts: ClockFacts) -> bool:
    return facts.capped_share is not None and facts.capped_share >= CAPPED_SHARE


def clock_limited(facts: ClockFacts) -> bool:
    """The samples ran with the SM clock held below 95% of its maximum by a limit."""
    return (
        _capped(facts)
        and facts.sm_mhz is not None
        and facts.max_sm_mhz is not None
        and facts.sm_mhz < CLOCK_LIMITED_FRACTION * facts.max_sm_mhz
    )


def clock_limit_text(current: ClockFacts, baseline: ClockFacts) -> str | None:
    """Why the comparison is clock-limited ("the SM clock was held at 1568 of 1980 MHz by a
    power or thermal limit in this run"), or None when neither side was."""
    sides = []
    for label, facts in (("this run", current), ("the baseline", baseline)):
        if clock_limited(facts):
            sides.append(f"{facts.sm_mhz:.0f} of {facts.max_sm_mhz:.0f} MHz in {label}")
    if not sides:
        return None
    return "SM clock held at " + " and ".join(sides) + " by a power or thermal limit"


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


def anchor_missing(now: AnchorSide | None, base: AnchorSide | None) -> str | None:
    """Why two sides cannot be compared relative to the clock anchor, or None when they can."""
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


def clock_basis(
    chosen: Basis,
    record: KernelRecord,
    entry: BaselineEntry,
    threshold: float,
) -> Basis:
    """`chosen`, the plain times, adjusted for either side's clock limit (module docstring)."""
    device = record.device or "unknown"
    now, base = record_anchor(record), entry_anchor(entry)
    facts_now, facts_base = record_clock_facts(record), entry_clock_facts(entry)
    limited = clock_limit_text(facts_now, facts_base)
    capped = capped_text(facts_now, facts_base)
    if capped is not None:
        missing = anchor_missing(now, base)
        if missing is None:
            assert now is not None
            assert base is not None
            return anchored_basis(
                device, now, base, limited or capped, chosen.ratio,
                threshold * ANCHOR_THRESHOLD_FACTOR,
                facts_now.sm_mhz, facts_base.sm_mhz,
            )  # fmt: skip
        if now is not None or base is not None:
            note = f"no clock anchor: {missing}"
            if limited is not None:
                limited = f"{limited}; {note}"
            else:
                chosen.text = f"time (same device: {device}; {capped}; {note})"
    if limited is not None:
        chosen.tolerance = round(threshold * CLOCK_LIMITED_FACTOR, 12)
        chosen.text = (
            f"time (same device: {device}; {limited}: tolerance "
            f"{CLOCK_LIMITED_FACTOR:g}x the threshold)"
        )
        chosen.clock_limited = limited
        chosen.sm_mhz, chosen.baseline_sm_mhz = facts_now.sm_mhz, facts_base.sm_mhz
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
    """The per-pair kernel / anchor ratios of both sides (the clock anchor)."""
    anchor_change = now.anchor_median_s / base.anchor_median_s - 1.0
    chosen = Basis(
        text=(
            f"time relative to the clock anchor (same device: {device}; {why}: kernel / "
            f"{now.name}, each sample followed by the anchor in its round, so both ran at the "
            "clock the limit allowed)"
        ),
        tolerance=tolerance,
        now=list(now.ratios),
        ref=list(base.ratios),
        ratio=median(list(now.ratios)) / median(list(base.ratios)),
        anchor=now.name,
        anchor_change=anchor_change,
        raw_change=time_ratio - 1.0,
        sm_mhz=sm_mhz,
        baseline_sm_mhz=baseline_sm_mhz,
        unit=" relative to the clock anchor",
        detail=f"; plain time {pct_text(time_ratio - 1.0)}, anchor GEMM {pct_text(anchor_change)}, {why}",
    )
    # The kernel's time at the baseline's anchor speed: its per-pair ratio times that speed.
    chosen.gated(
        "anchor-scaled",
        median(list(now.ratios)) * base.anchor_median_s,
        median(list(base.ratios)) * base.anchor_median_s,
    )
    return chosen
