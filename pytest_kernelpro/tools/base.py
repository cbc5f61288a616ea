"""The micro-profiling tool contract: `ProfilingTool`, `ToolContext`, `Finding`.

A tool is the 5-tuple of design §3.4: a name, the metrics it needs (`required_metrics`), its
thresholds (UPPER_CASE numeric class constants, overridable per instance), and one evaluation
pass, `evaluate(ctx) -> Finding | None`, that computes its state once and returns the finding
or nothing. Tools read the measured profile through a `ToolContext` and never parse text.
The shape follows Nsight Compute's rule files: named thresholds, focus metrics with the
condition that fired, and a speedup estimate per recommendation.

The earlier two-step contract (`trigger(ctx)`, then `analyze(ctx)`) still works for tools
written against it: such a class warns `KernelproDeprecationWarning` when it is defined and
its `evaluate` runs the two steps. `trigger` and `analyze` stay available to callers on
every tool, derived from `evaluate`.
"""

from __future__ import annotations

import math
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pytest_kernelpro.errors import KernelproDeprecationWarning, KernelproError

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import (
        KernelMetrics,
        KernelProfile,
        LibraryLinkage,
        PtxasReport,
        SassSummary,
        TimelineSummary,
    )
    from pytest_kernelpro.tools.stage1 import Stage1

SEVERITIES: tuple[str, ...] = ("critical", "high", "medium", "low")
AFFINITIES: tuple[str, ...] = ("memory", "compute", "latency", "timeline", "always")
# Inputs beyond ncu metrics that a tool may declare in `required_inputs`.
INPUTS: tuple[str, ...] = (
    "metrics",
    "sass",
    "ptxas",
    "timeline",
    "min_bytes",
    "flops",
    "kernels",
)

# Kernels that ship in a vendor or framework library: the user cannot edit them, so findings
# on them say "change the call", and the registry caps their severity.
# PyTorch's kernels also show up without their `at::native::` namespace (ncu prints e.g.
# "void reduce_kernel<512, 1, ReduceOp<float, func_wrapper_t<...>>>(T3)"), so its
# TensorIterator template arguments are markers too.
LIBRARY_KERNEL_RE = re.compile(
    r"(cublas|cutlass|nvjet|xmma|cudnn|cusparse|cufft|\bsm\d+_|ampere_|hopper_|volta_|"
    r"turing_|gemv2?T?_kernel|gemmSN|flash_fwd|flash_bwd|\bat::|cunn_|\bc10::|"
    r"TensorIterator|func_wrapper_t|gpu_kernel_impl)",
    re.IGNORECASE,
)


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
class MetricRequest:
    """One ncu metric a tool reads: the name, a short alias for messages, whether the tool
    cannot run without it, and alternative names tried in order when `name` is absent."""

    name: str
    alias: str
    required: bool = True
    alternatives: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.alternatives)


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


@dataclass
class ToolContext:
    """Everything a tool may read about one kernel (or, for timeline tools, one item)."""

    kernel: KernelProfile | None = None
    arch: str | None = None  # "sm_90", "sm_90a", ...
    stage1: Stage1 | None = None
    op_category: str | None = None  # "gemm", "softmax", ... of the reference, if known
    timeline: TimelineSummary | None = None
    linkage: LibraryLinkage | None = None
    min_bytes: float | None = None  # minimal DRAM bytes of the reference (roofline)
    flops: float | None = None
    dtype: str | None = None  # "float32", "bfloat16", ...
    roofline_fraction: float | None = None  # measured efficiency vs the roofline, 0..1
    timed_median_s: float | None = None  # the item's timed median (calls back to back)
    # Every kernel of the item's profile (one call of the item), for item-scope tools that
    # compare kernels, e.g. several memory-bound kernels that could be one.
    kernels: tuple[KernelProfile, ...] = ()

    @property
    def kernel_name(self) -> str:
        if self.kernel is None:
            return "(item)"
        return self.kernel.name

    @property
    def metrics(self) -> KernelMetrics | None:
        return None if self.kernel is None else self.kernel.metrics

    @property
    def sass(self) -> SassSummary | None:
        return None if self.kernel is None else self.kernel.sass

    @property
    def ptxas(self) -> PtxasReport | None:
        return None if self.kernel is None else self.kernel.ptxas

    @property
    def bottleneck(self) -> str | None:
        """The Stage-1 class ("memory", "compute", "mixed", "latency") or None."""
        return None if self.stage1 is None else self.stage1.cls

    def resolve(self, request: MetricRequest | str) -> tuple[str, float] | None:
        """(name, value) of the first present name of `request`, or None."""
        metrics = self.metrics
        if metrics is None:
            return None
        names = (request,) if isinstance(request, str) else request.names
        for name in names:
            value = metrics.get(name)
            if value is not None and not math.isnan(value):
                return name, value
        return None

    def value(self, request: MetricRequest | str, default: float | None = None) -> float | None:
        """The numeric value of the first present name of `request`, else `default`."""
        found = self.resolve(request)
        return default if found is None else found[1]

    def has_input(self, name: str) -> bool:
        """Whether a non-metric input ("sass", "ptxas", "timeline", "min_bytes", "flops",
        "kernels") is present."""
        if name == "metrics":
            return self.metrics is not None
        if name == "sass":
            return self.sass is not None
        if name == "ptxas":
            return self.ptxas is not None
        if name == "timeline":
            return self.timeline is not None
        if name == "min_bytes":
            return self.min_bytes is not None and self.min_bytes > 0
        if name == "flops":
            return self.flops is not None and self.flops > 0
        if name == "kernels":
            return any(k.metrics is not None for k in self.kernels)
        raise KernelproError(f"Unknown tool input {name!r}; use one of {', '.join(INPUTS)}")

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) from `arch` ("sm_90a" -> (9, 0)) or ncu's device attributes."""
        if self.arch:
            m = re.match(r"(?:sm_|compute_)?(\d+?)(\d)[a-z]?$", self.arch.strip().lower())
            if m:
                return int(m.group(1)), int(m.group(2))
        major = self.value("device__attribute_compute_capability_major")
        minor = self.value("device__attribute_compute_capability_minor")
        if major is not None and minor is not None:
            return int(major), int(minor)
        return None

    @property
    def is_hopper(self) -> bool:
        return self.compute_capability == (9, 0)

    @property
    def sm_count(self) -> int | None:
        value = self.value(
            MetricRequest(
                "launch__sm_count", "SMs", alternatives=("device__attribute_multiprocessor_count",)
            )
        )
        return None if value is None else int(value)

    @property
    def library_match(self) -> str | None:
        """The library marker in the kernel's name (e.g. "nvjet", "cutlass") or None.

        Only the kernel's name counts: a module that links cuBLAS may still launch its own
        hand-written kernels, which stay fully actionable.
        """
        m = LIBRARY_KERNEL_RE.search(self.kernel_name)
        return None if m is None else m.group(1)

    @property
    def links_blas(self) -> bool:
        """Whether the compiled module links cuBLAS/cuBLASLt (its GEMMs run as library calls)."""
        return bool(self.linkage and (self.linkage.cublas or self.linkage.cublaslt))


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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = vars(cls)
        inherited = getattr(cls, "evaluate", None)
        if (
            "evaluate" not in own
            and "trigger" in own
            and "analyze" in own
            and getattr(inherited, "__isabstractmethod__", False)
        ):
            # A tool written against the two-step contract (trigger, then analyze) keeps
            # working: evaluate runs the two steps.
            warnings.warn(
                f"Micro-profiling tool {cls.__module__}.{cls.__qualname__} implements "
                "trigger() and analyze(); that contract is deprecated: implement "
                "evaluate(ctx) -> Finding | None instead (return the finding, or None when "
                "the condition does not hold)",
                KernelproDeprecationWarning,
                stacklevel=3,
            )
            cls.evaluate = _two_step_evaluate  # type: ignore[method-assign]

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


def _two_step_evaluate(self: ProfilingTool, ctx: ToolContext) -> Finding | None:
    """`evaluate` of a tool written against the deprecated trigger/analyze contract."""
    return self.analyze(ctx) if self.trigger(ctx) else None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} affinity={self.affinity}>"


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
