"""The pull-request comment: Markdown from a report (`kernelpro comment` is `comment_cli.py`).

The privileged `workflow_run` job renders the comment itself from the report's data (it
does not post Markdown that the PR's job wrote). That data came from a job that ran the pull
request's code, so nothing in it is rendered: every string is shown as a code span or a fenced
text block (`gate.comment_escape.literal_text`, `literal_block`), status and bound words are ours only
when they are known values, and every field is type-checked first (`comment_check.check_report`:
a wrong type is an error that names the field, and nothing is posted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.gate.comment_check import check_report
from pytest_kernelpro.gate.comment_escape import literal_text
from pytest_kernelpro.gate.comment_kernel import (
    COMMENT_HEADER,
    comment_details,
    comment_row,
    status_emoji,
)
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    cross_device,
    record_status,
    sort_key,
)
from pytest_kernelpro.gate.github import MARKER
from pytest_kernelpro.gate.optimize_table import optimize_markdown
from pytest_kernelpro.gate.process_notes import comment_notes
from pytest_kernelpro.record import KernelRecord

__all__ = ["MARKER", "check_report", "render_comment"]

MAX_BODY = 60_000  # GitHub refuses comments over 65,536 characters
FOLD_OK_ABOVE = 12  # more kernels than this: unchanged ones go in a collapsed table
_DETAIL_STATUSES = ("regressed", "below-roofline", "suspect", "failed", "error")


def _summary_line(records: Sequence[KernelRecord]) -> str:
    counts: dict[str, int] = {}
    for r in records:
        counts[record_status(r)] = counts.get(record_status(r), 0) + 1
    if not records:
        return "### kernelpro: no kernel items ran"
    parts = []
    for status, word in (
        ("failed", "failed"),
        ("error", "errors"),
        ("regressed", "regressed"),
        ("below-roofline", "below their roofline floor"),
        ("suspect", "suspect"),
        ("improved", "improved"),
        ("new", "new"),
        ("incomparable", "incomparable"),
        ("skipped", "skipped"),  # never hidden under "all passed"
        ("unmeasured", "not timed"),
    ):
        if counts.get(status):
            parts.append(f"{status_emoji(status)} {counts[status]} {word}")
    unknown = sum(n for status, n in counts.items() if status not in STATUS_STYLE)
    if unknown:
        parts.append(f"❔ {unknown} with an unknown status")
    gated = any(r.gate for r in records)
    if not parts:
        parts.append("✅ no regressions" if gated else "✅ all passed")
    return f"### kernelpro: {' · '.join(parts)} ({len(records)} kernels)"


def _coverage_lines(meta: dict[str, Any]) -> list[str]:
    """Baseline entries no kernel matched, and kernels without an entry (renames show both)."""
    lines = []
    for key, words in (
        (
            "baseline_entries_without_kernel",
            "baseline entries matched no kernel of this run (removed, renamed or deselected)",
        ),
        ("kernels_without_baseline_entry", "kernels have no baseline entry (new or renamed)"),
    ):
        names = meta.get(key) or []
        if names:
            shown = ", ".join(literal_text(n, limit=120, table=False) for n in names[:20])
            more = f" and {len(names) - 20} more" if len(names) > 20 else ""
            lines += [f"⚠️ {len(names)} {words}: {shown}{more}", ""]
    return lines


def _footer(report: dict[str, Any]) -> str:
    meta = report.get("meta") or {}
    parts = []
    devices = meta.get("devices") or ([meta["device"]] if meta.get("device") else [])
    if devices:
        parts.append(", ".join(literal_text(d, limit=80, table=False) for d in devices))
    if meta.get("commit"):
        parts.append(f"commit {literal_text(str(meta['commit'])[:12], table=False)}")
    if meta.get("baseline_commit"):
        parts.append(f"baseline {literal_text(str(meta['baseline_commit'])[:12], table=False)}")
    if meta.get("torch"):
        parts.append(f"torch {literal_text(meta['torch'], limit=40, table=False)}")
    if isinstance(meta.get("wall_s"), (int, float)):
        parts.append(f"{meta['wall_s']:.0f} s")
    parts.append(f"pytest-kernelpro {__version__}")
    return " · ".join(parts)


def render_comment(report: dict[str, Any], *, with_guidance: bool = True) -> str:
    """The Markdown body of the sticky PR comment for one (possibly merged) report.

    Raises `KernelproError` naming the field when the report does not have the types the
    comment needs (`check_report`).
    """
    check_report(report)
    records = sorted((KernelRecord.from_dict(r) for r in report.get("records") or []), key=sort_key)
    out = [MARKER, _summary_line(records), ""]
    if records:
        quiet = [r for r in records if record_status(r) in ("ok", "passed", "skipped")]
        shown = records
        if len(records) > FOLD_OK_ABOVE and quiet:
            shown = [r for r in records if r not in quiet]
        if shown:
            out += [COMMENT_HEADER, *(comment_row(r) for r in shown), ""]
        if shown is not records:
            out += [
                f"<details><summary>{len(quiet)} unchanged or skipped kernels</summary>",
                "",
                COMMENT_HEADER,
                *(comment_row(r) for r in quiet),
                "",
                "</details>",
                "",
            ]
        if any(cross_device(r) for r in records):
            out += [
                "\\* measured on another device than the baseline: compared by efficiency "
                "(time relative to the roofline) with the wider cross-device tolerance.",
                "",
            ]
        out += comment_notes(records, literal_text)
        for r in records:
            if record_status(r) in _DETAIL_STATUSES:
                out += [comment_details(r, with_guidance), ""]
        out += optimize_markdown(records, literal_text)
    out += _coverage_lines(report.get("meta") or {})
    out += ["---", _footer(report)]
    body = "\n".join(out) + "\n"
    if len(body) > MAX_BODY and with_guidance:
        return render_comment(report, with_guidance=False)
    if len(body) > MAX_BODY:
        cut = body[: MAX_BODY - 200].rsplit("\n", 1)[0]
        body = cut + "\n\n…(truncated: see the JSON report in the workflow artifact)\n"
    return body
