"""The pull-request comment: Markdown from a report (`kernelpro comment` is `comment_cli.py`).

The privileged `workflow_run` job renders the comment itself from the report's data (it
does not post Markdown that the PR's job wrote). That data came from a job that ran the pull
request's code, so nothing in it is rendered: every string is shown as a code span or a fenced
text block (`review.comment.literal_text`, `literal_block`), status and bound words are ours only
when they are known values, and every field is type-checked first (`comment_check.check_report`:
a wrong type is an error that names the field, and nothing is posted).

One module holds the comment's parts: the literal-text escaping of every string taken from a
record (`literal_text`: an inline code span, `literal_block`: a fenced text block, `html_text`:
escaped inside our own HTML; nothing in a record is ever rendered as Markdown or HTML), one
kernel's row in the kernel table (`COMMENT_HEADER`, `comment_row`) and the folded details of one
that needs attention (`comment_details`), and the comment around them (`render_comment`:
summary, folding, footer).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    bar,
    cross_device,
    format_change,
    format_time,
    gated_elsewhere,
    gated_times,
    peak_used_words,
    record_status,
    short_device,
    sort_key,
    stat,
)
from pytest_kernelpro.gate.process_notes import QUIET_PICKS, process_notes
from pytest_kernelpro.record import KernelRecord, SectionPart
from pytest_kernelpro.review.comment_check import check_report
from pytest_kernelpro.review.github import MARKER
from pytest_kernelpro.review.report_load import records_of


def literal_text(value: Any, *, limit: int = 300, table: bool = True) -> str:
    """Any string from the report, shown as literal text: an inline code span.

    The report is an artifact of a job that ran the pull request's code, so every string in it
    may be hostile. Inside a code span GitHub renders no Markdown, HTML, link, image, mention
    or issue reference, and a `</details>` is text. The fence is one backtick longer than the
    longest run inside; line breaks and control characters become spaces (a code span is
    one line); in a table a pipe is escaped (GFM splits cells before it parses code spans).
    """
    text = "".join(" " if (ord(c) < 32 or 0x7F <= ord(c) < 0xA0) else c for c in str(value))
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text:
        return "–"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    if table:
        text = text.replace("|", "\\|")
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def comment_notes(records: Sequence[KernelRecord]) -> list[str]:
    """The process notes (`gate.process_notes.process_notes`) as Markdown lines, each string
    from the report as literal text."""
    notes = process_notes(records)

    def kernel_line(icon: str, name: str, note: str) -> str:
        return (
            f"- {icon} {literal_text(name, limit=120, table=False)}: "
            f"{literal_text(note, limit=600, table=False)}"
        )

    lines = [kernel_line("🔧", name, note) for name, note in notes.picks]
    lines += [kernel_line("⚠️", name, note) for name, note in notes.fresh_failures]
    if notes.quiet_picks:
        lines.append(f"- 🔧 {notes.quiet_picks} {QUIET_PICKS}")
    if notes.environment:
        env = literal_text(notes.environment, limit=600, table=False)
        lines.append(f"- 🌐 environment changed since the baseline: {env}")
    return [*lines, ""] if lines else []


def literal_block(value: Any, *, limit: int = 20_000) -> str:
    """A multi-line string from the report as a fenced text block (never rendered)."""
    text = "".join(c if (c in "\n\t" or ord(c) >= 32) else " " for c in str(value)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    longest = max((len(run) for run in re.findall(r"`{3,}|~{3,}", text)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


_HTML_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    '"': "&quot;",
    # GitHub turns @name and #123 into mentions and links after rendering: break them.
    "@": "&#64;\u200b",
    "#": "&#35;\u200b",
}


def html_text(value: Any, limit: int = 200) -> str:
    """A string from the artifact inside our own HTML: escaped, mentions and links broken."""
    text = " ".join(str(value).split())[:limit]
    return "".join(_HTML_ESCAPES.get(c, c) for c in text)


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


_PLAIN_LABEL = re.compile(r"[A-Za-z][A-Za-z ,'-]{0,79}")

COMMENT_HEADER = (
    "| Kernel | Baseline | Now | Change | % of roofline | Bound | Verdict |\n"
    "|:--|--:|--:|--:|:--|:--|:--|"
)


def _time_cell(wall: float | None, gated: float | None, label: str | None) -> str:
    """The compared time first, labelled, the wall median second ("2.05 ms on-CPU (wall
    2.19 ms)"); the wall median alone when the verdict compared it."""
    if gated is None or label is None:
        return format_time(wall) if wall else "–"
    return f"{format_time(gated)} {_label_text(label)} (wall {format_time(wall) if wall else '–'})"


def _label_text(label: str) -> str:
    """A gated time's label as plain words when it is only words ("on-CPU, anchor-scaled"),
    else literal text (it comes from the artifact)."""
    return label if _PLAIN_LABEL.fullmatch(label) else literal_text(label, limit=80)


def comment_row(record: KernelRecord) -> str:
    """One row of the comment's kernel table (`COMMENT_HEADER`); strings from the artifact as
    literal text, a bound word ours only when it is a known one."""
    gate = record.gate
    status = record_status(record)
    cross = cross_device(record)
    base = gate.baseline_median_s if gate else None
    now = stat(record, "median_s")
    times = gated_times(record) if gated_elsewhere(record) else None
    change = gate.change if gate and status not in ("new", "unmeasured") else None
    change_text = format_change(change) + ("\\*" if cross and change is not None else "")
    if change is not None and status in ("regressed", "improved"):
        change_text = f"**{change_text}**"
    bound = record.roofline.bound if record.roofline else None
    cells = [
        literal_text(record.name),
        _time_cell(base, times[1] if times else None, times[0] if times else None),
        _time_cell(now, times[2] if times else None, times[0] if times else None),
        change_text,
        _comment_bar(record.efficiency),
        (bound if bound in BOUNDS else literal_text(bound) if bound else "–")
        + (f" ({peak_used_words(record)})" if peak_used_words(record) else ""),
        f"{status_emoji(status)} {status_label(status)}",
    ]
    return "| " + " | ".join(cells) + " |"


def _gated_detail_row(record: KernelRecord, conf: Mapping[str, Any]) -> list[str]:
    """The compared time's row above the wall medians, where the verdict compared another."""
    times = gated_times(record) if gated_elsewhere(record) else None
    if times is None:
        return []
    label, base, now = times
    again = conf.get("gated_now_s")
    return [
        f"| Gated ({_label_text(label)}) | {format_time(base)} | {format_time(now)} | "
        f"{format_time(again) if isinstance(again, (int, float)) else ''} |"
    ]


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
        *_gated_detail_row(record, conf),
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


__all__ = ["MARKER", "check_report", "render_comment"]

MAX_BODY = 60_000  # GitHub refuses comments over 65,536 characters
FOLD_OK_ABOVE = 12  # more kernels than this: unchanged ones go in a collapsed table
_DETAIL_STATUSES = ("regressed", "below-roofline", "suspect", "unresolved", "failed", "error")


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
        ("unresolved", "unresolved"),
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


def section_tables(records: Sequence[KernelRecord]) -> list[str]:
    """The tables other plugins attached to records (`record.sections`: the optimizer's
    search), one per title; every cell is report text and goes through `literal_text`."""
    tables: dict[str, list[SectionPart]] = {}
    for record in records:
        for section in record.sections:
            if section.comment_rows:
                tables.setdefault(section.title, []).append(section)
    out: list[str] = []
    for title, sections in tables.items():
        columns = sections[0].comment_columns
        out += [f"#### {plain_words(title)}", ""]
        out.append("| " + " | ".join(plain_words(c) for c in columns) + " |")
        out.append("|" + "---|" * len(columns))
        for section in sections:
            for row in section.comment_rows:
                out.append("| " + " | ".join(literal_text(c) for c in row) + " |")
        out.append("")
        for note in sections[0].comment_notes:
            out += [plain_words(note), ""]
    return out


def plain_words(value: Any, limit: int = 400) -> str:
    """A heading or note from the report as plain prose: only word characters, spaces and
    punctuation that Markdown does not act on (no backtick, bracket, angle bracket, pipe,
    asterisk or underscore run), so it renders as the words it holds and nothing else."""
    text = re.sub(r"[^\w\s.,:;()→%/+'-]|_", "", str(value))
    return " ".join(text.split())[:limit]


def _session_notes(meta: dict[str, Any]) -> list[str]:
    """The session's notes in full (the terminal says them in one short line each), folded."""
    notes = [n for n in meta.get("notes") or [] if isinstance(n, str)]
    if not notes:
        return []
    return [
        f"<details><summary>{len(notes)} session note(s)</summary>",
        "",
        *(f"- {literal_text(n, limit=1500, table=False)}" for n in notes),
        "",
        "</details>",
        "",
    ]


def render_comment(report: dict[str, Any], *, with_guidance: bool = True) -> str:
    """The Markdown body of the sticky PR comment for one (possibly merged) report.

    Raises `KernelproError` naming the field when the report does not have the types the
    comment needs (`check_report`).
    """
    check_report(report)
    records = sorted(records_of(report), key=sort_key)
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
        out += comment_notes(records)
        for r in records:
            if record_status(r) in _DETAIL_STATUSES:
                out += [comment_details(r, with_guidance), ""]
        out += section_tables(records)
    out += _coverage_lines(report.get("meta") or {})
    out += _session_notes(report.get("meta") or {})
    out += ["---", _footer(report)]
    body = "\n".join(out) + "\n"
    if len(body) > MAX_BODY and with_guidance:
        return render_comment(report, with_guidance=False)
    if len(body) > MAX_BODY:
        cut = body[: MAX_BODY - 200].rsplit("\n", 1)[0]
        body = cut + "\n\n…(truncated: see the JSON report in the workflow artifact)\n"
    return body
