"""Micro-profiling tools: turn profiler counters into ranked, actionable findings.

Public API:
- `ProfilingTool`, `MetricRequest`, `ToolContext`, `Finding`, `Evidence`, `Recommendation`
  (the tool contract, `base`);
- `ToolRegistry` (`@ToolRegistry.register`, entry-point group `pytest_kernelpro.tools`),
  `run_tools`, `ToolRun`, `SkippedTool` (`registry`);
- `classify`, `Stage1` (`stage1`);
- `generate_prompt_guidance`, `render_findings_text` (`guidance`).

Only pure-Python modules are imported here; the built-in tools load on first registry use.
"""

from __future__ import annotations

from pytest_kernelpro.tools.base import (
    AFFINITIES,
    SEVERITIES,
    Evidence,
    Finding,
    MetricRequest,
    ProfilingTool,
    Recommendation,
    ToolContext,
)
from pytest_kernelpro.tools.guidance import generate_prompt_guidance, render_findings_text
from pytest_kernelpro.tools.registry import (
    ENTRY_POINT_GROUP,
    SkippedTool,
    ToolRegistry,
    ToolRun,
    affinity_allows,
    run_tools,
)
from pytest_kernelpro.tools.stage1 import Stage1, classify

__all__ = [
    "AFFINITIES",
    "ENTRY_POINT_GROUP",
    "SEVERITIES",
    "Evidence",
    "Finding",
    "MetricRequest",
    "ProfilingTool",
    "Recommendation",
    "SkippedTool",
    "Stage1",
    "ToolContext",
    "ToolRegistry",
    "ToolRun",
    "affinity_allows",
    "classify",
    "generate_prompt_guidance",
    "render_findings_text",
    "run_tools",
]
