"""Settling a provisional regression with an independent re-measurement.

`verdict.compare` calls a kernel "regressed" only provisionally: the plugin re-times the
kernel (`needs_confirmation`) and `confirm` lets the regression stand only if that second
measurement, by itself, is a regression under the same rules; otherwise the kernel is
"suspect" (reported, never failed). One slow measurement (another process, a clock dip)
cannot fail CI.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from pytest_kernelpro.gate.verdict import (
    IMPROVED,
    OK,
    REGRESSED,
    SUSPECT,
    Verdict,
    compare,
    finish_verdict,
    improvement_needs_confirmation,
    p_text,
    pct_text,
    roofline_floor,
)

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord


def needs_confirmation(verdict: Verdict) -> bool:
    """True when the plugin must re-time the kernel and call `confirm`: a regression, and an
    improvement on the CPU (`verdict.improvement_needs_confirmation`)."""
    if verdict.confirmation is not None:
        return False
    if verdict.change_status == IMPROVED:
        return improvement_needs_confirmation(verdict.device)
    return verdict.change_status == REGRESSED


def confirm(
    first: Verdict,
    record_after_remeasure: KernelRecord,
    entry: BaselineEntry,
    *,
    cross_cpu: str = "info",
    clock_normalize: bool = False,
    widen_when_clock_limited: bool = True,
    clock_anchor: bool = True,
    anchor_threshold: float | None = None,
    where: str = "a re-measurement",
) -> Verdict:
    """Settle a provisional regression with an independent re-measurement of the kernel.

    The regression stands (confirmed=True) only if the re-measurement is, by itself, a
    regression under the same tolerance and alpha; otherwise the kernel is "suspect"
    (reported, not failed). Verdicts that need no confirmation are returned unchanged.
    `where` says how the re-measurement was made ("a re-measurement in a fresh process").
    """
    if not needs_confirmation(first):
        return first
    second = compare(
        record_after_remeasure,
        entry,
        threshold=first.threshold,
        cross_device_tolerance=first.cross_device_tolerance,
        alpha=first.alpha,
        cross_cpu=cross_cpu,
        clock_normalize=clock_normalize,
        widen_when_clock_limited=widen_when_clock_limited,
        clock_anchor=clock_anchor,
        anchor_threshold=anchor_threshold,
    )
    reproduced = second.change_status == first.change_status
    confirmation = {
        "reproduced": reproduced,
        "change": second.change,
        "raw_change": second.raw_change,
        "clock_scale": second.clock_scale,
        "anchor_change": second.anchor_change,
        "basis": second.basis,
        "p_value": second.p_value,
        "current_median_s": second.current_median_s,
        "n": second.n_current,
        "status": second.change_status,
    }
    core = first.reason.split("; needs a confirmation")[0]
    if reproduced:
        core = (
            f"{core}; confirmed by {where} "
            f"({pct_text(second.change or 0.0)}, p = {p_text(second.p_value or 1.0)})"
        )
        status = first.change_status
    else:
        again = "not timed" if second.change is None else pct_text(second.change)
        if second.p_value is not None:
            again += f", p = {p_text(second.p_value)}"
        what = "an improvement" if first.change_status == IMPROVED else "a regression"
        core = (
            f"{core}, but {where.replace('a re-measurement', 'the re-measurement', 1)} did "
            f"not reproduce it ({again}): "
            f"treated as noise, not {what}"
        )
        status = OK if first.change_status == IMPROVED else SUSPECT
    _, floor_reason = roofline_floor(first.min_roofline, first.efficiency, True)
    kept = {
        f.name: getattr(first, f.name)
        for f in fields(first)
        if f.name not in ("status", "change_status", "reason", "confirmed", "confirmation")
    }
    return finish_verdict(
        change_status=status,
        reason=core,
        floor_reason=floor_reason,
        confirmed=reproduced,
        confirmation=confirmation,
        **kept,
    )
