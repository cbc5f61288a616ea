"""Micro-profiling tools: turn profiler counters into ranked, actionable findings.

Public API:
- `ProfilingTool`, `MetricRequest`, `ToolContext`, `Finding`, `Evidence`, `Recommendation`
  (the tool contract, `contract`: a tool implements `evaluate(ctx) -> Finding | None`; what it
  reads is in `context`, what it returns in `finding`);
- `ToolRegistry` (an instance per set of tools; `@ToolRegistry.register` and the entry-point
  group `pytest_kernelpro.tools` add to the default one, `default_registry()`),
  `run_tools` (`registry`), `ToolRun`, `SkippedTool` (`outcome`), the severity caps
  (`policies`);
- `classify`, `Stage1` (`stage1`);
- `generate_prompt_guidance`, `render_findings_text` (`guidance`).

Each tool module (divergence, dram, fusion, instructions, launch, memory, occupancy, pipes,
shared, spills, stalls, tensorcore, timeline, work) is a self-contained rule file: it imports the contract (`contract`),
the shared signals (`signals`, `streaming`) and its words (`advice`: advice.yaml), never
another tool module (`tests/tools/test_tools_isolation.py`); `builtin` lists the tools.

Only pure-Python modules are imported here; the built-in tools load on first registry use.
"""

from __future__ import annotations

from pytest_kernelpro.tools.contract import (
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
    default_registry,
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
    "default_registry",
    "generate_prompt_guidance",
    "render_findings_text",
    "run_tools",
]
