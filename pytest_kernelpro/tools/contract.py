"""The micro-profiling tool contract: `ProfilingTool`, with what it reads (`ToolContext`,
`MetricRequest`: `tool_context.py`) and what it returns (`Finding`: `finding.py`), all importable
from here.

A tool is the 5-tuple of design §3.4: a name, the metrics it needs (`required_metrics`), its
thresholds (UPPER_CASE numeric class constants, overridable per instance), and one evaluation
pass, `evaluate(ctx) -> Finding | None`, that computes its state once and returns the finding
or nothing. Tools read the measured profile through a `ToolContext` and never parse text.
The shape follows Nsight Compute's rule files: named thresholds, focus metrics with the
condition that fired, and a speedup estimate per recommendation.

`trigger` and `analyze` are conveniences for callers (tests, a report that asks one tool),
derived from `evaluate`; a tool implements `evaluate` alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import ClassVar

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.tools.finding import (
    SEVERITIES,
    Evidence,
    Finding,
    Recommendation,
    cap_severity,
    fmt_estimate,
    num,
    pct,
    severity_rank,
)
from pytest_kernelpro.tools.tool_context import (
    INPUTS,
    LIBRARY_KERNEL_RE,
    MetricRequest,
    ToolContext,
)

# The contract in one import: tool modules take everything from here.
__all__ = [
    "AFFINITIES",
    "INPUTS",
    "LIBRARY_KERNEL_RE",
    "SEVERITIES",
    "Evidence",
    "Finding",
    "MetricRequest",
    "ProfilingTool",
    "Recommendation",
    "ToolContext",
    "cap_severity",
    "fmt_estimate",
    "num",
    "pct",
    "severity_rank",
]

AFFINITIES: tuple[str, ...] = ("memory", "compute", "latency", "timeline", "always")


class ProfilingTool(ABC):
    """Base class of every micro-profiling tool.

    Subclasses set `name`, `description`, `affinity`, `required_metrics` (and optionally
    `required_inputs`), declare thresholds as UPPER_CASE numeric class constants and implement
    `evaluate`. `Tool(thresholds={"TRIGGER_PCT": 35})` overrides per instance;
    lower-case names are accepted too.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    affinity: ClassVar[str] = "always"
    # "kernel": runs once per profiled kernel; "item": once per item (timeline tools).
    scope: ClassVar[str] = "kernel"
    required_metrics: ClassVar[tuple[MetricRequest, ...]] = ()
    required_inputs: ClassVar[tuple[str, ...]] = ("metrics",)
    # False for tools whose fix removes work or bytes (coalescing, spills): their gain is not
    # bounded by how close the kernel already runs to a hardware peak.
    bounded_by_saturation: ClassVar[bool] = True

    def __init__(self, thresholds: Mapping[str, float] | None = None) -> None:
        valid = self.default_thresholds()
        for key, value in (thresholds or {}).items():
            upper = str(key).upper()
            if upper not in valid:
                names = ", ".join(sorted(valid)) or "(none)"
                raise KernelproError(
                    f"Unknown threshold {key!r} for tool {self.name!r}; valid names: {names}"
                )
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise KernelproError(
                    f"Threshold {upper} of tool {self.name!r} must be a number, got {value!r}"
                )
            setattr(self, upper, float(value))

    @classmethod
    def default_thresholds(cls) -> dict[str, float]:
        """The class's thresholds: every UPPER_CASE int/float attribute along the MRO."""
        found: dict[str, float] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                if (
                    attr.isupper()
                    and not attr.startswith("_")
                    and isinstance(value, (int, float))
                    and not isinstance(value, bool)
                ):
                    found[attr] = float(value)
        return found

    @property
    def thresholds(self) -> dict[str, float]:
        """Current threshold values of this instance."""
        return {name: float(getattr(self, name)) for name in self.default_thresholds()}

    def missing_inputs(self, ctx: ToolContext) -> list[str]:
        """Names of required inputs/metrics that `ctx` lacks (empty: the tool can run).

        A metric request with alternatives is reported by its primary name, with the
        alternatives in parentheses, so the user knows any of them would do.
        """
        missing = [name for name in self.required_inputs if not ctx.has_input(name)]
        if "metrics" in missing:
            return missing
        for request in self.required_metrics:
            if request.required and ctx.resolve(request) is None:
                alt = f" (or {', '.join(request.alternatives)})" if request.alternatives else ""
                missing.append(request.name + alt)
        return missing

    @abstractmethod
    def evaluate(self, ctx: ToolContext) -> Finding | None:
        """One pass over the kernel's profile: the finding when the tool's condition holds,
        else None (what an Nsight Compute rule's apply() does)."""

    def trigger(self, ctx: ToolContext) -> bool:
        """Whether `evaluate(ctx)` finds something."""
        return self.evaluate(ctx) is not None

    def analyze(self, ctx: ToolContext) -> Finding:
        """The finding of `evaluate(ctx)`; `KernelproError` when there is none."""
        finding = self.evaluate(ctx)
        if finding is None:
            raise self.not_triggered(ctx)
        return finding

    def make_finding(
        self,
        ctx: ToolContext,
        *,
        severity: str,
        title: str,
        root_cause: str,
        evidence: Mapping[str, Evidence] | None = None,
        recommendations: Iterable[Recommendation] = (),
        code_example: str | None = None,
        notes: Iterable[str] = (),
    ) -> Finding:
        """A `Finding` stamped with this tool's name and the context's kernel."""
        return Finding(
            tool=self.name,
            kernel=ctx.kernel_name,
            severity=severity,
            title=title,
            root_cause=root_cause,
            evidence=dict(evidence or {}),
            recommendations=list(recommendations),
            code_example=code_example,
            notes=list(notes),
        )

    def not_triggered(self, ctx: ToolContext) -> KernelproError:
        """The error for `analyze()` called on a context where the tool finds nothing."""
        return KernelproError(
            f"Tool {self.name!r}: analyze() called on kernel {ctx.kernel_name!r} although "
            "trigger() is False; call trigger() first"
        )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} affinity={self.affinity}>"
