"""profile -> Stage 1 -> tools -> guidance: the one path from measured counters to advice.

`profile_and_analyze` (profile, then `analyze_report`) is the one entry point. Its three
callers: `--kernelpro-profile` (a user's kernel item, `run/profile_stage.profile`), the
automatic profile of a regression (the gate stage calls the same `profile_item`), and the
search, whose profiling evaluator (`analysis/evaluator.ProfilingEvaluator`, wrapping the
sandbox evaluator as `cutlass/precheck.PrecheckEvaluator` does) profiles every correct
candidate through `optimize/candidate_profile/child.py`. So a candidate is judged exactly like the user's
kernel (`tests/analysis/test_entry_point.py` holds the three to one result):

1. Stage 1 classifies the main kernel (roofline class vs ncu's speed of light);
2. every registered tool whose affinity matches that class runs (proactive orchestration);
3. the findings become the prompt guidance in the seed's order (SASS summary, timeline
   summary, findings by severity, ncu metrics by category), the raw counters as name = value
   lines (the "raw" feedback ablation) and the plain text of a terminal report.

`requested_metrics` is the one list the profiler asks ncu for: the curated metrics plus every
metric a registered tool declares (a third-party tool's counter is collected without editing
the catalog). The registry that declares the metrics is the one whose tools run on them
(`registry=`, the default registry when None).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import ProfileReport
    from pytest_kernelpro.tools.registry import ToolRegistry, ToolRun
    from pytest_kernelpro.tools.stage1 import Stage1

# The roofline keys `measure.roofline.price_measured` reads: a finding's pricing of a timed
# kernel (what a child process is sent to price it).
PRICING_KEYS = tuple(
    "flops min_bytes peak_flops peak_name bandwidth_Bps compute_time_s memory_time_s "
    "roofline_time_s flops_source bytes_source paths".split()
)


@dataclass(frozen=True)
class RooflineFacts:
    """What the tools need from the roofline of the problem the kernel solves."""

    bound: str | None = None  # theoretical class: memory | compute | mixed
    dominant_category: str | None = None
    min_bytes: float | None = None
    flops: float | None = None
    dtype: str | None = None
    roofline_time_s: float | None = None
    efficiency: float | None = None  # roofline time / the kernel's timed median
    timed_median_s: float | None = None
    # What pricing a timed kernel needs (`PRICING_KEYS` of the roofline):
    # a candidate faster than the op-level peak allows reads its share at the peak its rate
    # implies, not above 100% (which would cap every finding as "near the roofline").
    pricing: dict[str, Any] | None = None

    @classmethod
    def from_roofline(
        cls,
        roofline: Mapping[str, Any] | None,
        *,
        median_s: float | None = None,
        efficiency: float | None = None,
    ) -> RooflineFacts:
        """From a record's `roofline` dict (`measure.roofline`) and a measured median."""
        from pytest_kernelpro.measure.roofline import kernel_efficiency

        r = dict(roofline or {})
        dtype = next((op.get("dtype") for op in r.get("ops") or [] if op.get("dtype")), None)
        t = r.get("roofline_time_s")
        pricing = {k: r[k] for k in PRICING_KEYS if r.get(k) is not None} if t else None
        if efficiency is None and t and median_s:
            efficiency = kernel_efficiency(pricing, float(median_s))
        return cls(
            bound=r.get("bound"),
            dominant_category=r.get("dominant_category"),
            min_bytes=r.get("min_bytes"),
            flops=r.get("flops"),
            dtype=dtype,
            roofline_time_s=None if t is None else float(t),
            efficiency=efficiency,
            timed_median_s=median_s,
            pricing=pricing,
        )

    def for_median(self, median_s: float | None) -> RooflineFacts:
        """The same problem's facts for another kernel timed at `median_s`."""
        from dataclasses import replace

        from pytest_kernelpro.measure.roofline import kernel_efficiency

        eff = None
        if self.roofline_time_s and median_s:
            pricing = self.pricing or {"roofline_time_s": self.roofline_time_s}
            eff = kernel_efficiency(pricing, median_s)
        return replace(self, timed_median_s=median_s, efficiency=eff)

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Analysis:
    """A profile and what the tools made of it."""

    report: ProfileReport
    stage1: Stage1
    tool_run: ToolRun
    guidance_md: str  # "tools" feedback: the seed's prompt structure
    raw_md: str  # "raw" feedback: the ncu counters as name = value lines only
    text: str  # the terminal / report section
    analysis_s: float = 0.0  # Stage 1 + tools + rendering
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def profile_s(self) -> float:
        """Wall time of collecting the profile (ncu, SASS, timeline)."""
        return float(self.report.wall_s)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what a profiling child process sends back)."""
        return {
            "profile": self.report.to_dict(),
            "stage1": self.stage1.to_dict(),
            "tools": self.tool_run.to_dict(),
            "findings": [f.to_dict() for f in self.tool_run.sorted_findings()],
            "guidance_md": self.guidance_md,
            "raw_md": self.raw_md,
            "text": self.text,
            "profile_s": self.profile_s,
            "analysis_s": self.analysis_s,
            **self.extra,
        }


def requested_metrics(registry: ToolRegistry | None = None) -> tuple[str, ...]:
    """The curated ncu counters plus every metric a tool of `registry` declares that the
    catalog lacks (with its alternatives: the catalog cannot vouch for them). Launch and
    device attributes are left out: ncu writes them on every raw page without being asked."""
    from pytest_kernelpro.profile.metrics_catalog import CURATED_METRICS
    from pytest_kernelpro.tools.registry import default_registry

    registry = default_registry() if registry is None else registry
    curated = [m.name for m in CURATED_METRICS if not m.implicit]
    known = {m.name for m in CURATED_METRICS}
    names = list(curated)
    for tool_cls in registry.tool_classes():
        for request in tool_cls.required_metrics:
            if request.name in known:
                continue
            names += [
                n for n in request.names if not n.startswith(("launch__", "device__attribute"))
            ]
    return tuple(dict.fromkeys(names))


def analyze_report(
    report: ProfileReport, facts: RooflineFacts, *, registry: ToolRegistry | None = None
) -> Analysis:
    """Stage 1, every relevant tool of `registry` and the three renderings of one profile."""
    from pytest_kernelpro.profile.model import NotCollected
    from pytest_kernelpro.profile.render import render_profile_section
    from pytest_kernelpro.tools.guidance import generate_prompt_guidance, render_findings_text
    from pytest_kernelpro.tools.registry import run_tools
    from pytest_kernelpro.tools.stage1 import classify

    started = time.perf_counter()
    # SASS exists for kernels of a captured load_inline module and for Triton kernels whose
    # cubin the profile found; the profiler says why otherwise, this covers a report without.
    if report.kernels and all(k.sass is None for k in report.kernels):
        if not any(n.what == "sass" for n in report.not_collected):
            report.not_collected.append(
                NotCollected(
                    "sass",
                    "no captured load_inline module or Triton cubin holds these kernels "
                    "(PyTorch or library kernels): SASS is read from captured .so files and "
                    "from the Triton cubins the profile's runs compiled",
                )
            )
    main = next((k for k in report.kernels if k.metrics is not None), None)
    stage1 = classify(facts.bound, main.metrics if main else None)
    tool_run = run_tools(
        report,
        stage1,
        op_category=facts.dominant_category,
        min_bytes=facts.min_bytes,
        flops=facts.flops,
        roofline_fraction=facts.efficiency,
        timed_median_s=facts.timed_median_s,
        dtype=facts.dtype,
        registry=registry,
    )
    guidance = generate_prompt_guidance(report, tool_run, stage1, mode="tools")
    raw = generate_prompt_guidance(report, tool_run, stage1, mode="raw")
    if raw.strip() == "## Profiler Metrics (raw)":
        raw = ""  # no counter was collected: "raw" has nothing to say
    text = "\n".join(
        part for part in (render_profile_section(report), render_findings_text(tool_run)) if part
    )
    return Analysis(
        report=report,
        stage1=stage1,
        tool_run=tool_run,
        guidance_md=guidance,
        raw_md=raw,
        text=text,
        analysis_s=time.perf_counter() - started,
    )


def profile_and_analyze(
    locator: Any,
    facts: RooflineFacts,
    *,
    so_paths: Any = (),
    ptxas: Any = (),
    device: str = "cuda",
    timeout_s: float = 300.0,
    ncu_path: str | None = None,
    registry: ToolRegistry | None = None,
    **options: Any,
) -> Analysis:
    """Profile the kernel at `locator` (ncu of its own kernels with `requested_metrics()`,
    SASS, timeline) and analyze it with the same registry's tools; nothing raises for a
    missing profiler."""
    from pytest_kernelpro.profile.collect import profile_kernel_item

    report = profile_kernel_item(
        locator,
        so_paths=so_paths,
        ptxas=ptxas,
        device=device,
        timeout_s=timeout_s,
        ncu_path=ncu_path,
        metrics=requested_metrics(registry),
        **options,
    )
    return analyze_report(report, facts, registry=registry)


def report_from_dict(data: Mapping[str, Any]) -> ProfileReport:
    """A `ProfileReport` from its `to_dict()` form (a JSON record's `profile`)."""
    from pytest_kernelpro.profile.model import ProfileReport

    return ProfileReport.from_dict(data)
