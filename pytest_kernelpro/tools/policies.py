"""The two severity policies `run_tools` applies to every kernel-scope finding.

- Near the roofline: when a kernel already runs at >= `near_roofline_pct` of a hardware peak
  (DRAM bandwidth or a compute pipe) or the item at that share of its roofline (the highest
  of these, `signals.saturation`), findings of tools whose fix cannot move that roof
  (`bounded_by_saturation`) drop to "low" and their estimates to the headroom (100 / pct).
- Library kernels (cuBLAS, CUTLASS, nvjet, PyTorch's own, `ToolContext.library_match`):
  capped at `library_max_severity`, since the user can change the call but not the kernel.

Each lowered severity leaves a note on the finding saying why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_kernelpro.tools.finding import Finding, cap_severity, severity_rank
from pytest_kernelpro.tools.signals import saturation

if TYPE_CHECKING:
    from pytest_kernelpro.tools.contract import ProfilingTool
    from pytest_kernelpro.tools.tool_context import ToolContext


def apply_policies(
    tool: ProfilingTool,
    ctx: ToolContext,
    finding: Finding,
    near_roofline_pct: float,
    library_max_severity: str,
) -> Finding:
    """`finding` of a kernel-scope tool with the two caps applied (module doc); item-scope
    findings unchanged."""
    if tool.scope != "kernel":
        return finding
    sat = saturation(ctx) if tool.bounded_by_saturation else None
    if sat is not None and sat[1] >= near_roofline_pct:
        resource, value, _ = sat
        headroom = 100.0 / max(value, 1e-9)
        if finding.rank < severity_rank("low"):
            finding.notes.append(
                f"Severity lowered from {finding.severity} to low: the kernel already runs at "
                f"{value:.1f}% of its {resource} peak, so this fix can gain at most "
                f"{headroom:.2f}x."
            )
            finding.severity = "low"
        finding.recommendations = [
            r.capped(headroom) if r.bounded_by_saturation else r for r in finding.recommendations
        ]
    library = ctx.library_match
    if library is not None:
        capped = cap_severity(finding.severity, library_max_severity)
        if capped != finding.severity:
            finding.notes.append(
                f"Severity lowered from {finding.severity} to {capped}: this is a library "
                f"kernel (name contains {library!r}); change the call (dtype, layout, shape, "
                "library settings) or replace it, you cannot edit it."
            )
            finding.severity = capped
    return finding
