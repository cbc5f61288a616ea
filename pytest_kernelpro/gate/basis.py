"""What the verdict's basis hands the verdict (`Basis`, or `Incomparable` where no gate is
possible), and which device a comparison is on (`same_device`, `is_cpu`). Below the modules
that choose a basis (`verdict_basis.py`, `clock_basis.py`, `other_device_basis.py`), so each
can make one without importing the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def same_device(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def is_cpu(device: str) -> bool:
    return device.strip().casefold().startswith("cpu")


@dataclass
class Basis:
    """The samples to compare, their tolerance, and how to word and show the change."""

    text: str  # the verdict's basis
    tolerance: float
    now: list[float]
    ref: list[float]
    ratio: float  # now / baseline of the compared quantity's median
    unit: str = ""  # after "slower by 3.1%": " in cycles", " relative to the clock anchor"
    detail: str = ""  # after the tolerance inside the parentheses
    # CPU anchor: the load is cancelled by the anchor, so an oversubscribed timing is no
    # reason for "suspect"; `widened` says why the tolerance is above the threshold,
    # `unusable` why the anchor shows the measurement cannot gate.
    load_cancelled: bool = False
    # The fastest decile's tolerance when not the basis's (the CPU anchor: a tolerance widened
    # for between-session noise would ask the noisy decile for more than the median).
    low_tolerance: float | None = None
    widened: str | None = None
    unusable: str | None = None
    # The time the verdict is decided on when it is not the wall median (the number shown is
    # the number gated): its label ("on-CPU", "on-CPU, anchor-scaled", "clock-scaled",
    # "anchor-scaled", "roofline-scaled"), now and in the baseline; now / baseline is `ratio`.
    gated_label: str | None = None
    gated_now_s: float | None = None
    gated_baseline_s: float | None = None
    # The factors applied and why (the Verdict fields of the same names):
    clock_scale: float | None = None  # current SM MHz / baseline SM MHz, applied to `now`
    sm_mhz: float | None = None
    baseline_sm_mhz: float | None = None
    raw_change: float | None = None  # the change of the unscaled median time
    clock_limited: str | None = None  # why the tolerance was widened (clock held by a limit)
    anchor: str | None = None  # the anchor's identity
    anchor_change: float | None = None  # the anchor's own median, now / baseline - 1

    def gated(self, label: str, now_s: float, baseline_s: float) -> None:
        """Name the time this basis compares when it is not the wall median."""
        self.gated_label, self.gated_now_s, self.gated_baseline_s = label, now_s, baseline_s

    def verdict_fields(self) -> dict[str, Any]:
        """The Verdict fields this basis sets (those it left unset stay the Verdict's None)."""
        names = (
            "gated_label", "gated_now_s", "gated_baseline_s", "clock_scale", "sm_mhz",
            "baseline_sm_mhz", "raw_change", "clock_limited", "anchor", "anchor_change",
        )  # fmt: skip
        return {name: getattr(self, name) for name in names}


@dataclass
class Incomparable:
    """No gate on this pair: the basis, the reason and the change where one exists."""

    text: str
    reason: str
    tolerance: float
    change: float | None = None
