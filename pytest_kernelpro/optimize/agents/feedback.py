"""What the Programmer is told about its parent: failure details (debug) and profiler
feedback (optimize), rendered from a search `Evaluation`.

Feedback modes (the paper's ablation):
- "tools": the micro-profiling tools' guidance Markdown. Taken from
  `evaluation.metrics["guidance_md"]` when the evaluator put it there (the output of
  `tools.guidance.generate_prompt_guidance(mode="tools")`), else rendered here from
  `evaluation.findings` (`Finding.to_dict()` records or `{severity, title, message}`).
- "raw": only raw metric values, `name = value` lines, no interpretation
  (`metrics["raw_guidance_md"]`, else the numbers of `metrics["ncu"]`, else the numeric
  entries of `metrics`).
- "none": no profiling text at all.
The speedup and timing line is given in every mode: it is the search's reward, not profiling.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproConfigError

if TYPE_CHECKING:
    from pytest_kernelpro.optimize.search.interfaces import Evaluation

FEEDBACK_MODES = ("tools", "raw", "none")
TOOLS_HEADING = "## Automated Bottleneck Analysis"  # tools.guidance.HEADING
RAW_HEADING = "## Profiler Metrics (raw)"  # tools.guidance.RAW_HEADING
_SEVERITY_ORDER = {"critical": 0, "high": 1, "medium": 2, "low": 3}
LOG_TAIL_CHARS = 3000


def check_feedback_mode(mode: str) -> str:
    """`mode` if it is one of FEEDBACK_MODES, else a KernelproConfigError naming the choices."""
    if mode not in FEEDBACK_MODES:
        raise KernelproConfigError(
            f"Unknown feedback mode {mode!r}; use one of {', '.join(FEEDBACK_MODES)}"
        )
    return mode


def tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    """The last `limit` characters of `text`, starting at a line boundary."""
    text = text.strip()
    if len(text) <= limit:
        return text
    cut = text[-limit:]
    newline = cut.find("\n")
    return "[...]\n" + (cut[newline + 1 :] if 0 <= newline < 200 else cut)


def _fmt_seconds(value: Any) -> str:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return str(value)
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def speedup_line(evaluation: Evaluation | None) -> str:
    """ "Its speedup over the reference is 1.42x (reference 2.1 ms, this 1.48 ms)." or ""."""
    if evaluation is None or evaluation.speedup is None:
        return ""
    metrics = evaluation.metrics
    ref, new = metrics.get("ref_median_s"), metrics.get("candidate_median_s")
    if ref is None and isinstance(evaluation.timing.get("reference"), Mapping):
        ref = evaluation.timing["reference"].get("median_s")
        new = (evaluation.timing.get("candidate") or {}).get("median_s")
    times = f" (reference {_fmt_seconds(ref)}, this {_fmt_seconds(new)})" if ref and new else ""
    return f"Its speedup over the reference is {evaluation.speedup:.3g}x{times}."


def render_failure(evaluation: Evaluation | None) -> str:
    """The debug-mode details: status, reason, build log / logs tail, correctness report."""
    if evaluation is None:
        return "No evaluation was recorded for this solution."
    labels = {
        "build_error": "It did not build",
        "run_error": "It failed while running",
        "timeout": "It timed out",
        "wrong": "It produced wrong results",
        "cheat": "It was rejected as a cheat",
    }
    lines = [
        f"{labels.get(evaluation.status, evaluation.status)}: {evaluation.reason or 'no reason given'}."
    ]
    if evaluation.correctness:
        detail = {k: v for k, v in evaluation.correctness.items() if v not in (None, "", [], {})}
        if detail:
            lines += [
                "",
                "Correctness check:",
                "```json",
                json.dumps(detail, indent=1, default=str)[:2000],
                "```",
            ]
    if evaluation.build_log.strip():
        lines += ["", "Build log (end):", "```text", tail(evaluation.build_log), "```"]
    if evaluation.logs.strip() and evaluation.status != "build_error":
        lines += ["", "Output (end):", "```text", tail(evaluation.logs, 1500), "```"]
    return "\n".join(lines)


def _finding_markdown(n: int, finding: Mapping[str, Any]) -> list[str]:
    severity = str(finding.get("severity", "medium")).upper()
    title = finding.get("title") or finding.get("tool") or "finding"
    lines = [f"#### {n}. [{severity}] {title}"]
    cause = finding.get("root_cause") or finding.get("message")
    if cause:
        lines.append(f"**Root cause:** {cause}")
    evidence = finding.get("evidence") or {}
    if isinstance(evidence, Mapping) and evidence:
        lines.append("**Evidence:** " + "; ".join(
            f"`{name}` = {ev.get('value')}{ev.get('unit', '') if ev.get('unit') == '%' else ''} ({ev.get('condition', '')})"
            if isinstance(ev, Mapping) else f"`{name}` = {ev}"
            for name, ev in evidence.items()
        ))  # fmt: skip
    recs = finding.get("recommendations") or []
    if recs:
        lines.append("**Recommendations (ranked):**")
        for i, rec in enumerate(recs, 1):
            if isinstance(rec, Mapping):
                expected = f" - expected {rec['expected']}" if rec.get("expected") else ""
                lines.append(f"{i}. {rec.get('action', '')}{expected}")
            else:
                lines.append(f"{i}. {rec}")
    if finding.get("code_example"):
        lines += ["```cuda", str(finding["code_example"]).rstrip(), "```"]
    return lines


def render_findings(findings: list[dict[str, Any]]) -> str:
    """Tools-mode Markdown from finding dicts, critical first; "" when there are none."""
    if not findings:
        return ""
    ordered = sorted(findings, key=lambda f: _SEVERITY_ORDER.get(str(f.get("severity")), 9))
    lines = [TOOLS_HEADING, "", "### Findings (by severity)"]
    for n, finding in enumerate(ordered, 1):
        lines.append("")
        lines += _finding_markdown(n, finding)
    return "\n".join(lines) + "\n"


def _numbers(data: Mapping[str, Any]) -> list[str]:
    out = []
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out.append(f"{name} = {value:.6g}" if isinstance(value, float) else f"{name} = {value}")
    return out


def render_raw(evaluation: Evaluation) -> str:
    """Raw-mode text: metric values without interpretation; "" when there are none."""
    metrics = evaluation.metrics
    if isinstance(metrics.get("raw_guidance_md"), str) and metrics["raw_guidance_md"].strip():
        return metrics["raw_guidance_md"]
    source = metrics.get("ncu") if isinstance(metrics.get("ncu"), Mapping) else metrics
    lines = _numbers(source)
    return "\n".join([RAW_HEADING, *lines]) + "\n" if lines else ""


def render_guidance(evaluation: Evaluation | None, mode: str) -> str:
    """The optimize-mode profiling text for `mode` ("tools", "raw" or "none")."""
    check_feedback_mode(mode)
    if evaluation is None or mode == "none":
        return ""
    if mode == "raw":
        return render_raw(evaluation)
    guidance = evaluation.metrics.get("guidance_md")
    if isinstance(guidance, str) and guidance.strip():
        return guidance if guidance.endswith("\n") else guidance + "\n"
    return render_findings(evaluation.findings)
