"""One kernel's part of the pull-request comment: its row in the kernel table
(`COMMENT_HEADER`, `comment_row`) and the folded details of one that needs attention
(`comment_details`). Every string from the record is literal text (`gate.comment_escape`);
status and bound words are ours only when they are known ones. The comment's frame (summary,
folding, footer) is `gate/comment.py`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kernelpro.gate.comment_escape import html_text, literal_block, literal_text
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    bar,
    cross_device,
    format_change,
    format_time,
    peak_used_words,
    record_status,
    short_device,
    stat,
)
from pytest_kernelpro.record import KernelRecord

BOUNDS = ("memory", "compute", "mixed", "latency")  # bound words the comment shows as ours


def _number_text(value: Any) -> str:
    return f"{float(value):.3g}" if isinstance(value, (int, float)) else "–"


def _pct_or_dash(value: Any) -> str:
    return f"{float(value):.1%}" if isinstance(value, (int, float)) else "–"


def status_emoji(status: str) -> str:
    """The emoji of a status word (❔ for one we do not know)."""
    return STATUS_STYLE.get(status, ("❔", status, ""))[0]


def status_label(status: str) -> str:
    """A status word: ours as plain text, an unknown one (from the artifact) as literal text."""
    if status in STATUS_STYLE:
        return status.replace("-", " ")
    return "unknown status " + literal_text(status, limit=40)


def _comment_bar(eff: float | None) -> str:
    if eff is None:
        return "–"
    return f"`{bar(eff, 8)}` {eff:.0%}"


COMMENT_HEADER = (
    "| Kernel | Baseline | Now | Change | % of roofline | Bound | Verdict |\n"
    "|:--|--:|--:|--:|:--|:--|:--|"
)


def comment_row(record: KernelRecord) -> str:
    """One row of the comment's kernel table (`COMMENT_HEADER`); strings from the artifact as
    literal text, a bound word ours only when it is a known one."""
    gate = record.gate
    status = record_status(record)
    cross = cross_device(record)
    base = gate.baseline_median_s if gate else None
    now = stat(record, "median_s")
    change = gate.change if gate and status not in ("new", "unmeasured") else None
    change_text = format_change(change) + ("\\*" if cross and change is not None else "")
    if change is not None and status in ("regressed", "improved"):
        change_text = f"**{change_text}**"
    bound = record.roofline.bound if record.roofline else None
    cells = [
        literal_text(record.name),
        format_time(base) if base else "–",
        format_time(now),
        change_text,
        _comment_bar(record.efficiency),
        (bound if bound in BOUNDS else literal_text(bound) if bound else "–")
        + (f" ({peak_used_words(record)})" if peak_used_words(record) else ""),
        f"{status_emoji(status)} {status_label(status)}",
    ]
    return "| " + " | ".join(cells) + " |"


def comment_details(record: KernelRecord, with_guidance: bool) -> str:
    """The folded details of a kernel that needs attention: the numbers behind its verdict."""
    gate = record.gate
    status = record_status(record)
    conf = (gate.confirmation if gate else None) or {}
    # HTML only around our own words: a name inside <summary> is an HTML-escaped <code>.
    summary = (
        f"<details><summary>{status_emoji(status)} <code>{html_text(record.name)}</code>: "
        f"{html_text(status.replace('-', ' ') if status in STATUS_STYLE else 'unknown status')}"
    )
    if not gate:
        lines = [f"{summary}</summary>", ""]
        lines.append(
            f"- **Failure:** {literal_text(record.message or 'see the test log', limit=1000, table=False)}"
        )
        lines += ["", "</details>"]
        return "\n".join(lines)
    lines = [
        f"{summary} {format_change(gate.change)}</summary>",
        "",
        "| | Baseline | Now | Re-measured |",
        "|:--|--:|--:|--:|",
        f"| Median | {format_time(gate.baseline_median_s)} | "
        f"{format_time(stat(record, 'median_s'))} | {format_time(conf.get('current_median_s'))} |",
        f"| Samples | {gate.n_baseline or '–'} | {gate.n_current or '–'} | "
        f"{conf.get('n') or '–'} |",
        f"| % of roofline | {_pct_or_dash(gate.baseline_efficiency)} | "
        f"{_pct_or_dash(record.efficiency)} | |",
        f"| Device | {literal_text(short_device(gate.baseline_device))} | "
        f"{literal_text(short_device(record.device))} | |",
        "",
    ]
    lines.append(
        f"- **Basis:** {literal_text(gate.basis, table=False)}; "
        f"tolerance {_pct_or_dash(gate.tolerance)}"
    )
    if isinstance(record.peak_used, Mapping) and record.peak_used.get("note"):
        lines.append(
            f"- **Peak used:** {literal_text(record.peak_used['note'], limit=500, table=False)}"
        )
    if gate.p_value is not None:
        lines.append(
            f"- **Mann-Whitney U:** one-sided p = {float(gate.p_value):.2g} "
            f"(alpha {_number_text(gate.alpha)})"
        )
    if conf:
        done = "reproduced" if conf.get("reproduced") else "**not reproduced**"
        p_text = f", p = {float(conf['p_value']):.2g}" if conf.get("p_value") is not None else ""
        lines.append(
            f"- **Confirmation re-measurement:** {done} "
            f"({format_change(conf.get('change'))}{p_text})"
        )
    for label, note in (("Autotune", gate.autotune_note), ("Environment", gate.environment_note)):
        if note:
            lines.append(f"- **{label}:** {literal_text(note, limit=1000, table=False)}")
    why = gate.reason or gate.message or ""
    lines.append(f"- **Why:** {literal_text(why, limit=1000, table=False)}")
    if record.outcome in ("failed", "error") and record.message and not gate.failed:
        lines.append(f"- **Test failure:** {literal_text(record.message, limit=1000, table=False)}")
    if with_guidance and record.guidance:
        # Written by the job that ran the PR's code: shown as text, never rendered.
        lines += [
            "",
            "Bottleneck analysis (from the report, verbatim):",
            "",
            literal_block(record.guidance),
        ]
    lines += ["", "</details>"]
    return "\n".join(lines)
