"""Stage 1: the bottleneck class of a kernel, from the roofline and from ncu.

The theoretical class comes from the reference's arithmetic intensity against the ridge point
(computed by the roofline code, passed in here as a string). The measured class comes from
ncu's speed-of-light percentages, the way Nsight Compute's SOLBottleneck rule and KernelAgent's
roofline classifier read them: SM throughput vs memory throughput, both as % of peak; both
below 60% means neither roof is near ("latency": the kernel is under-utilizing the GPU).
Agreement gives high confidence; on disagreement the theoretical class wins (it is the
kernel's inherent ceiling, not the state of the current implementation).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import KernelMetrics

THEORETICAL_CLASSES = ("memory", "compute", "mixed")
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY_THROUGHPUT = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
# Nsight Compute's SOLBottleneck: both below 60% of peak is a latency issue.
LATENCY_BELOW_PCT = 60.0


@dataclass(frozen=True)
class Stage1:
    """The Stage-1 classification of one kernel item."""

    cls: str | None  # "memory" | "compute" | "mixed" | "latency" | None (nothing known)
    confidence: str  # "high" | "medium" | "low" | "none"
    theoretical: str | None
    measured: str | None
    sm_pct: float | None = None
    memory_pct: float | None = None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One line for reports: 'compute (theoretical compute, measured memory; low)'."""
        if self.cls is None:
            return "unknown (no roofline and no ncu throughput)"
        return (
            f"{self.cls} (theoretical {self.theoretical or 'n/a'}, measured "
            f"{self.measured or 'n/a'}; confidence {self.confidence})"
        )


def measured_class(metrics: KernelMetrics | None) -> tuple[str | None, float | None, float | None]:
    """(class, SM %, memory %) from ncu's speed-of-light metrics; class None if absent."""
    if metrics is None:
        return None, None, None
    sm = metrics.get(SM_THROUGHPUT)
    mem = metrics.get(MEMORY_THROUGHPUT)
    if sm is None or mem is None:
        return None, sm, mem
    if sm < LATENCY_BELOW_PCT and mem < LATENCY_BELOW_PCT:
        return "latency", sm, mem
    return ("memory" if mem >= sm else "compute"), sm, mem


def classify(theoretical: str | None, metrics: KernelMetrics | None) -> Stage1:
    """Combine the roofline class `theoretical` with the class measured by ncu.

    - both present and equal: that class, confidence "high";
    - theoretical "mixed" and measured "memory"/"compute": "mixed", confidence "medium"
      (a mixed kernel may legitimately sit on either roof);
    - otherwise on disagreement: the theoretical class, confidence "low";
    - only one present: that one, confidence "medium"; neither: None, confidence "none".
    """
    if theoretical is not None and theoretical not in THEORETICAL_CLASSES:
        raise KernelproError(
            f"Unknown theoretical bottleneck class {theoretical!r}; use one of "
            f"{', '.join(THEORETICAL_CLASSES)} or None"
        )
    measured, sm, mem = measured_class(metrics)
    sol = "" if sm is None or mem is None else f"SM {sm:.1f}% vs memory {mem:.1f}% of peak"
    if theoretical is None and measured is None:
        return Stage1(None, "none", None, None, sm, mem, "no roofline class and no ncu SOL")
    if theoretical is None:
        return Stage1(measured, "medium", None, measured, sm, mem, f"measured only: {sol}")
    if measured is None:
        return Stage1(
            theoretical, "medium", theoretical, None, sm, mem, "theoretical only (no ncu SOL)"
        )
    if theoretical == measured:
        return Stage1(theoretical, "high", theoretical, measured, sm, mem, f"agree: {sol}")
    if theoretical == "mixed" and measured in ("memory", "compute"):
        return Stage1(
            "mixed",
            "medium",
            theoretical,
            measured,
            sm,
            mem,
            f"mixed kernel on the {measured} roof: {sol}",
        )
    return Stage1(
        theoretical,
        "low",
        theoretical,
        measured,
        sm,
        mem,
        f"disagree ({sol}); the theoretical class wins",
    )
