"""What a tool returns: `Finding` (severity, title, root cause, evidence, ranked
`Recommendation`s, a code example), the severity scale and the number formats findings use.

The output half of the tool contract (`contract`); `tool_context` is the input half.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.errors import KernelproError

SEVERITIES: tuple[str, ...] = ("critical", "high", "medium", "low")


def severity_rank(severity: str) -> int:
    """0 for critical … 3 for low; unknown severities raise `KernelproError`."""
    try:
        return SEVERITIES.index(severity)
    except ValueError:
        raise KernelproError(
            f"Unknown severity {severity!r}; use one of {', '.join(SEVERITIES)}"
        ) from None


def cap_severity(severity: str, cap: str) -> str:
    """The less severe of `severity` and `cap`."""
    return SEVERITIES[max(severity_rank(severity), severity_rank(cap))]


def fmt_estimate(low: float, high: float) -> str:
    """'1.3-1.5x' (or '1.5x' when both ends agree)."""
    if math.isclose(low, high, rel_tol=0.005):
        return f"{high:.2g}x" if high < 10 else f"{high:.0f}x"
    return f"{low:.2g}-{high:.2g}x" if high < 10 else f"{low:.2g}-{high:.0f}x"


@dataclass(frozen=True)
class Evidence:
    """A metric value that fired a tool and the condition it met, e.g. '63.2% > 60%'."""

    value: float | str
    condition: str
    unit: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "condition": self.condition}


@dataclass(frozen=True)
class Recommendation:
    """One ranked action and its expected improvement (a heuristic range, as a factor)."""

    action: str
    low: float
    high: float
    basis: str = ""  # where the estimate comes from (a bound, a peak ratio, a heuristic)
    # False for actions that remove bytes or work (fusion, lower precision): their gain is not
    # limited by how close the kernel runs to a hardware roof, so the near-roofline policy
    # leaves their estimate alone.
    bounded_by_saturation: bool = True

    def __post_init__(self) -> None:
        if not (self.low > 0 and self.high >= self.low):
            raise KernelproError(
                f"Recommendation {self.action[:40]!r}: expected-improvement range "
                f"{self.low}-{self.high} is invalid; need 0 < low <= high"
            )

    @property
    def expected(self) -> str:
        return fmt_estimate(self.low, self.high)

    def capped(self, high: float) -> Recommendation:
        """The same recommendation with its estimate limited to `high` (at least 1.0x)."""
        high = max(1.0, high)
        if self.high <= high:
            return self
        return Recommendation(
            self.action, min(self.low, high), high, self.basis, self.bounded_by_saturation
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "expected": self.expected,
            "low": round(self.low, 3),
            "high": round(self.high, 3),
            "basis": self.basis,
        }


@dataclass
class Finding:
    """What a triggered tool says: severity, a title, the root cause with the numbers that fired
    it, the evidence (metric -> value and condition) and ranked recommendations."""

    tool: str
    kernel: str
    severity: str
    title: str
    root_cause: str
    evidence: dict[str, Evidence] = field(default_factory=dict)
    recommendations: list[Recommendation] = field(default_factory=list)
    code_example: str | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        severity_rank(self.severity)

    @property
    def rank(self) -> int:
        return severity_rank(self.severity)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "kernel": self.kernel,
            "severity": self.severity,
            "title": self.title,
            "root_cause": self.root_cause,
            "evidence": {name: ev.to_dict() for name, ev in self.evidence.items()},
            "recommendations": [
                {"rank": i + 1, **rec.to_dict()} for i, rec in enumerate(self.recommendations)
            ],
            "code_example": self.code_example,
            "notes": list(self.notes),
        }


def pct(value: float) -> str:
    """'63.2%'."""
    return f"{value:.1f}%"


def num(value: float) -> str:
    """A readable count: '1,234,567' or '3.25'."""
    if float(value).is_integer() and abs(value) >= 1000:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"
