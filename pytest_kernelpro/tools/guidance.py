"""Render tool findings as prompt guidance (Markdown) and as a terminal report section.

`generate_prompt_guidance` has three modes for the feedback ablation of the paper:
- "tools": "## Automated Bottleneck Analysis" - SASS summary, timeline summary, findings by
  severity (critical first), then ncu metrics by category;
- "raw": only the curated ncu metrics as `name = value` lines (no interpretation);
- "none": an empty string.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.tools.contract import Finding
from pytest_kernelpro.tools.signals import TENSOR_OPS, WGMMA_OPS

if TYPE_CHECKING:
    from pytest_kernelpro.profile.model import KernelMetrics, KernelProfile, ProfileReport
    from pytest_kernelpro.tools.registry import ToolRun
    from pytest_kernelpro.tools.stage1 import Stage1

MODES = ("tools", "raw", "none")
HEADING = "## Automated Bottleneck Analysis"
RAW_HEADING = "## Profiler Metrics (raw)"
CATEGORY_TITLES = {
    "sol": "Speed of light",
    "memory": "Memory",
    "occupancy": "Occupancy",
    "launch": "Launch",
    "scheduler": "Scheduler",
    "stalls": "Warp stalls (% of active warp-cycles)",
    "pipes": "Compute pipes (% of peak)",
    "instructions": "Instructions",
}


def _fmt(value: float | str) -> str:
    if isinstance(value, str):
        return value
    if float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    return f"{value:.4g}"


def _code_block(code: str, lang: str) -> str:
    return f"```{lang}\n{code.rstrip()}\n```"


def _not_collected(report: ProfileReport, what: str) -> str | None:
    for entry in report.not_collected:
        if entry.what == what:
            return entry.why
    return None


def _sass_line(kernel: KernelProfile) -> str | None:
    sass, ptxas = kernel.sass, kernel.ptxas
    if sass is None and ptxas is None:
        return None
    parts: list[str] = []
    if sass is not None:
        tc = {op: sass.count(op) for op in TENSOR_OPS if sass.count(op)}
        if tc:
            kinds = "wgmma" if any(op in tc for op in WGMMA_OPS) else "mma.sync only"
            tensor = ", ".join(f"{op} {n}" for op, n in tc.items()) + f" ({kinds})"
        else:
            tensor = "none"
        parts.append(f"{sass.total_instructions:,} instructions")
        parts.append(f"tensor cores: {tensor}")
        parts.append(
            f"async copy: LDGSTS {sass.count('LDGSTS')}, TMA {sum(sass.count(o) for o in ('UTMALDG', 'UTMASTG', 'UBLKCP'))}"
        )
        parts.append(f"local memory: LDL {sass.count('LDL')}, STL {sass.count('STL')}")
        for label, widths in (
            ("global loads", sass.global_load_widths),
            ("global stores", sass.global_store_widths),
        ):
            if widths:
                parts.append(
                    f"{label}: "
                    + ", ".join(f"{n}x {bits}-bit" for bits, n in sorted(widths.items()))
                )
    if ptxas is not None:
        parts.append(
            f"ptxas: {ptxas.registers} registers, {ptxas.stack_frame_bytes} B stack, "
            f"{ptxas.spill_store_bytes}/{ptxas.spill_load_bytes} B spill stores/loads"
        )
    return "; ".join(parts)


def _sass_section(report: ProfileReport) -> list[str]:
    lines = ["### SASS summary"]
    rows = [(k.name, _sass_line(k)) for k in report.kernels]
    present = [(name, line) for name, line in rows if line]
    if present:
        arch = f" ({report.arch})" if report.arch else ""
        lines += [f"- `{name}`{arch}: {line}" for name, line in present]
    else:
        why = _not_collected(report, "sass")
        lines.append(f"- not collected{f': {why}' if why else ''}")
    return lines


def _timeline_section(report: ProfileReport) -> list[str]:
    lines = ["### Timeline summary"]
    tl = report.timeline
    if tl is None:
        why = _not_collected(report, "timeline")
        lines.append(f"- not collected{f': {why}' if why else ''}")
        return lines
    lines.append(
        f"- {tl.source}: {tl.kernel_count} kernel launches, end-to-end {tl.end_to_end_us:.1f} us, "
        f"kernels {tl.kernel_time_us:.1f} us, launch overhead {100 * tl.launch_overhead_share:.1f}%, "
        f"{tl.sync_calls} sync calls"
    )
    if tl.gaps:
        worst = max(tl.gaps, key=lambda g: g.duration_us)
        lines.append(
            f"- {len(tl.gaps)} gap(s) > {tl.gap_threshold_us:.1f} us (max(1% of end-to-end, 5 us)); "
            f"largest {worst.duration_us:.1f} us before `{worst.before_kernel}`"
        )
    else:
        lines.append(f"- no gaps > {tl.gap_threshold_us:.1f} us")
    return lines


def _finding_lines(finding: Finding, n: int) -> list[str]:
    lines = [
        f"#### {n}. [{finding.severity.upper()}] {finding.title}",
        f"Kernel `{finding.kernel}` - tool `{finding.tool}`",
        "",
        f"**Root cause:** {finding.root_cause}",
    ]
    if finding.evidence:
        lines.append("")
        lines.append("**Evidence:**")
        for name, ev in finding.evidence.items():
            unit = ev.unit if ev.unit and ev.unit != "%" else ""
            value = _fmt(ev.value) + ("%" if ev.unit == "%" else f" {unit}" if unit else "")
            lines.append(f"- `{name}` = {value}: {ev.condition}")
    if finding.recommendations:
        lines.append("")
        lines.append("**Recommendations (ranked):**")
        for i, rec in enumerate(finding.recommendations, 1):
            lines.append(f"{i}. {rec.action} - expected {rec.expected}")
    for note in finding.notes:
        lines.append("")
        lines.append(f"_Note: {note}_")
    if finding.code_example:
        lang = (
            "python"
            if "torch." in finding.code_example and "__global__" not in finding.code_example
            else "cuda"
        )
        lines += ["", _code_block(finding.code_example, lang)]
    return lines


def _findings_section(tool_run: ToolRun) -> list[str]:
    lines = ["### Findings (by severity)"]
    findings = tool_run.sorted_findings()
    if not findings:
        lines.append(
            "No tool fired: none of the heuristics found a bottleneck in the metrics collected."
        )
    for n, finding in enumerate(findings, 1):
        lines.append("")
        lines += _finding_lines(finding, n)
    missing = [s for s in tool_run.skipped if s.reason == "missing_metrics"]
    if missing:
        lines.append("")
        lines.append(
            "Not run (inputs missing): "
            + "; ".join(f"`{s.tool}` ({', '.join(s.missing)})" for s in _unique_skips(missing))
        )
    return lines


def _unique_skips(skips: Iterable) -> list:
    seen: set[str] = set()
    out = []
    for s in skips:
        if s.tool not in seen:
            seen.add(s.tool)
            out.append(s)
    return out


def _catalog() -> dict:
    from pytest_kernelpro.profile.metrics_catalog import metrics_by_category

    return metrics_by_category()


def _metric_lines(metrics: KernelMetrics, with_labels: bool) -> list[str]:
    lines: list[str] = []
    for category, entries in _catalog().items():
        cells = []
        for entry in entries:
            value = metrics.get(entry.name)
            if value is None:
                continue
            unit = "%" if entry.unit == "%" else f" {entry.unit}" if entry.unit else ""
            if with_labels:
                cells.append(f"{entry.label} {_fmt(value)}{unit}")
            else:
                lines.append(f"{entry.name} = {_fmt(value)}{unit}")
        if with_labels and cells:
            lines.append(f"- **{CATEGORY_TITLES.get(category, category)}**: " + "; ".join(cells))
    return lines


def _metrics_section(report: ProfileReport) -> list[str]:
    lines = ["### ncu metrics by category"]
    any_metrics = False
    for kernel in report.kernels:
        if kernel.metrics is None:
            continue
        any_metrics = True
        lines.append(f"#### `{kernel.name}`")
        lines += _metric_lines(kernel.metrics, with_labels=True)
    if not any_metrics:
        why = _not_collected(report, "ncu")
        lines.append(f"- not collected{f': {why}' if why else ''}")
    return lines


def generate_prompt_guidance(
    report: ProfileReport,
    tool_run: ToolRun,
    stage1: Stage1 | None = None,
    mode: str = "tools",
) -> str:
    """Markdown guidance for the next prompt: "tools", "raw" or "none" (see module doc)."""
    if mode not in MODES:
        raise KernelproError(f"Unknown guidance mode {mode!r}; use one of {', '.join(MODES)}")
    if mode == "none":
        return ""
    if mode == "raw":
        lines = [RAW_HEADING]
        for kernel in report.kernels:
            if kernel.metrics is None:
                continue
            lines.append(f"### `{kernel.name}`")
            lines += _metric_lines(kernel.metrics, with_labels=False)
        return "\n".join(lines) + "\n"
    lines = [HEADING, ""]
    classes = [stage1] if stage1 is not None else list(dict.fromkeys(tool_run.stage1.values()))
    for s1 in classes:
        lines.append(f"Bottleneck class (Stage 1): {s1.describe()}. {s1.reason}".rstrip(". ") + ".")
    if classes:
        lines.append("")
    for section in (
        _sass_section(report),
        _timeline_section(report),
        _findings_section(tool_run),
        _metrics_section(report),
    ):
        lines += section
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def render_findings_text(tool_run: ToolRun, *, max_recommendations: int = 2) -> str:
    """Plain text for a terminal/report section: one block per finding, critical first."""
    lines: list[str] = []
    for kernel, s1 in tool_run.stage1.items():
        lines.append(f"stage 1 [{kernel}]: {s1.describe()}")
    findings = tool_run.sorted_findings()
    if not findings:
        lines.append("tools: no finding")
    for f in findings:
        lines.append(f"[{f.severity.upper()}] {f.kernel} :: {f.tool}: {f.title}")
        lines.append(f"    cause: {f.root_cause}")
        for i, rec in enumerate(f.recommendations[:max_recommendations], 1):
            lines.append(f"    {i}. {rec.action} ({rec.expected})")
        for note in f.notes:
            lines.append(f"    note: {note}")
    missing = _unique_skips(s for s in tool_run.skipped if s.reason == "missing_metrics")
    if missing:
        lines.append(
            "not run (inputs missing): "
            + ", ".join(f"{s.tool} ({', '.join(s.missing)})" for s in missing)
        )
    errors = [s for s in tool_run.skipped if s.reason == "error"]
    for s in errors:
        lines.append(f"tool error: {s.tool} on {s.kernel}: {s.detail}")
    return "\n".join(lines) + "\n"
