"""What `run_tools` returns: the findings, the tools skipped and why, which tools ran.

Plain data for the report, the guidance and the JSON record; no tool logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.tools.finding import SEVERITIES, Finding

if TYPE_CHECKING:
    from pytest_kernelpro.tools.stage1 import Stage1


@dataclass(frozen=True)
class SkippedTool:
    """A tool that did not run on a kernel, and why."""

    tool: str
    kernel: str
    reason: str  # "affinity" | "missing_metrics" | "error"
    missing: tuple[str, ...] = ()
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": self.tool,
            "kernel": self.kernel,
            "reason": self.reason,
            "missing": list(self.missing),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class ToolResult:
    tool: str
    kernel: str
    triggered: bool


@dataclass
class ToolRun:
    """The outcome of `run_tools` for one profile report."""

    findings: list[Finding] = field(default_factory=list)
    skipped: list[SkippedTool] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    stage1: dict[str, Stage1] = field(default_factory=dict)  # kernel name -> class used

    def sorted_findings(self) -> list[Finding]:
        """Findings by severity (critical first), then kernel, then tool."""
        return sorted(self.findings, key=lambda f: (f.rank, f.kernel, f.tool))

    def counts(self) -> dict[str, int]:
        """Severity -> number of findings."""
        out = dict.fromkeys(SEVERITIES, 0)
        for finding in self.findings:
            out[finding.severity] += 1
        return out

    def worst(self) -> str | None:
        """The most severe severity present, or None."""
        return self.sorted_findings()[0].severity if self.findings else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.sorted_findings()],
            "skipped": [s.to_dict() for s in self.skipped],
            "ran": [
                {"tool": r.tool, "kernel": r.kernel, "triggered": r.triggered} for r in self.results
            ],
            "stage1": {k: s.to_dict() for k, s in self.stage1.items()},
            "counts": self.counts(),
        }
