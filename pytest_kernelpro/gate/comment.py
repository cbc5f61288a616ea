"""The pull-request comment: Markdown from a report, and `kernelpro comment`.

The privileged `workflow_run` job renders the comment itself from the report's data (it
does not post Markdown that the PR's job wrote). That data came from a job that ran the pull
request's code, so nothing in it is rendered: every string is shown as a code span or a fenced
text block (`_text`, `_block`), status and bound words are ours only when they are known
values, and every field is type-checked first (`check_report`: a wrong type is an error that
names the field, and nothing is posted).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    bar,
    cross_device,
    format_change,
    format_time,
    record_status,
    short_device,
    sort_key,
    stat,
)
from pytest_kernelpro.gate.github import (
    GITHUB_ACTIONS_BOT,
    MARKER,
    BotIdentity,
    post_comment,
    pull_request_head,
)
from pytest_kernelpro.gate.optimize_table import optimize_markdown
from pytest_kernelpro.record import KernelRecord

__all__ = ["MARKER", "comment_main", "post_comment", "render_comment"]

MAX_BODY = 60_000  # GitHub refuses comments over 65,536 characters
FOLD_OK_ABOVE = 12  # more kernels than this: unchanged ones go in a collapsed table
_DETAIL_STATUSES = ("regressed", "below-roofline", "suspect", "failed", "error")
_BOUNDS = ("memory", "compute", "mixed", "latency")


# What the comment reads from a report, and the type each must have: "num" (int or float,
# not bool), "int", "str", "bool", "dict", "list" (of str). None is always allowed.
_RECORD_FIELDS = {
    "name": "str",
    "outcome": "str",
    "message": "str",
    "device": "str",
    "efficiency": "num",
    "guidance": "str",
    "roofline": "dict",
    "timing": "dict",
    "gate": "dict",
}
_GATE_FIELDS = {
    "status": "str",
    "basis": "str",
    "reason": "str",
    "message": "str",
    "baseline_device": "str",
    "change": "num",
    "baseline_median_s": "num",
    "baseline_efficiency": "num",
    "tolerance": "num",
    "p_value": "num",
    "alpha": "num",
    "n_baseline": "int",
    "n_current": "int",
    "failed": "bool",
    "confirmation": "dict",
}
_CONFIRMATION_FIELDS = {
    "current_median_s": "num",
    "n": "int",
    "reproduced": "bool",
    "change": "num",
    "p_value": "num",
}
_META_FIELDS = {
    "baseline_entries_without_kernel": "list",
    "kernels_without_baseline_entry": "list",
    "devices": "list",
    "device": "str",
    "commit": "str",
    "baseline_commit": "str",
    "torch": "str",
    "wall_s": "num",
}
_KIND_WORDS = {
    "num": "a number",
    "int": "an integer",
    "str": "a string",
    "bool": "true or false",
    "dict": "an object",
    "list": "a list of strings",
}


def _type_ok(value: Any, kind: str) -> bool:
    if value is None:
        return True
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "list":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, {"str": str, "bool": bool, "dict": dict}[kind])


def _check_fields(data: Any, table: dict[str, str], where: str) -> None:
    if not isinstance(data, dict):
        raise KernelproError(
            f"kernelpro comment: {where} is {type(data).__name__}, expected an object; the "
            "report artifact is malformed (not written by pytest-kernelpro)"
        )
    for key, kind in table.items():
        value = data.get(key)
        if not _type_ok(value, kind):
            raise KernelproError(
                f"kernelpro comment: {where}.{key} is {value!r:.80} ({type(value).__name__}), "
                f"expected {_KIND_WORDS[kind]}; the report artifact is malformed (not written "
                "by pytest-kernelpro, or edited): nothing was posted"
            )


def check_report(report: Any) -> None:
    """Raise `KernelproError` naming the first field the comment needs that has a wrong type."""
    if not isinstance(report, dict):
        raise KernelproError(
            f"kernelpro comment: the report is {type(report).__name__}, expected an object"
        )
    records = report.get("records") or []
    if not isinstance(records, list):
        raise KernelproError(
            f"kernelpro comment: report.records is {type(records).__name__}, expected a list"
        )
    if report.get("meta") is not None:
        _check_fields(report["meta"], _META_FIELDS, "report.meta")
    for i, record in enumerate(records):
        where = f"report.records[{i}]"
        _check_fields(record, _RECORD_FIELDS, where)
        if not isinstance(record.get("name"), str):
            raise KernelproError(f"kernelpro comment: {where}.name is missing or not a string")
        if record.get("gate") is not None:
            _check_fields(record["gate"], _GATE_FIELDS, f"{where}.gate")
            if record["gate"].get("confirmation") is not None:
                _check_fields(
                    record["gate"]["confirmation"],
                    _CONFIRMATION_FIELDS,
                    f"{where}.gate.confirmation",
                )
        stats = (record.get("timing") or {}).get("stats")
        if stats is not None:
            _check_fields(stats, {"median_s": "num"}, f"{where}.timing.stats")
        if record.get("roofline") is not None:
            _check_fields(record["roofline"], {"bound": "str"}, f"{where}.roofline")


def _text(value: Any, *, limit: int = 300, table: bool = True) -> str:
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


def _block(value: Any, *, limit: int = 20_000) -> str:
    """A multi-line string from the report as a fenced text block (never rendered)."""
    text = "".join(c if (c in "\n\t" or ord(c) >= 32) else " " for c in str(value)).strip()
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    longest = max((len(run) for run in re.findall(r"`{3,}|~{3,}", text)), default=2)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _emoji(status: str) -> str:
    return STATUS_STYLE.get(status, ("❔", status, ""))[0]


def _label(status: str) -> str:
    """A status word: ours as plain text, an unknown one (from the artifact) as literal text."""
    if status in STATUS_STYLE:
        return status.replace("-", " ")
    return "unknown status " + _text(status, limit=40)


def _roofline_cell(eff: float | None) -> str:
    if eff is None:
        return "–"
    return f"`{bar(eff, 8)}` {eff:.0%}"


def _row(record: KernelRecord) -> str:
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
        _text(record.name),
        format_time(base) if base else "–",
        format_time(now),
        change_text,
        _roofline_cell(record.efficiency),
        bound if bound in _BOUNDS else _text(bound) if bound else "–",
        f"{_emoji(status)} {_label(status)}",
    ]
    return "| " + " | ".join(cells) + " |"


_HEADER = (
    "| Kernel | Baseline | Now | Change | % of roofline | Bound | Verdict |\n"
    "|:--|--:|--:|--:|:--|:--|:--|"
)


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
            parts.append(f"{_emoji(status)} {counts[status]} {word}")
    unknown = sum(n for status, n in counts.items() if status not in STATUS_STYLE)
    if unknown:
        parts.append(f"❔ {unknown} with an unknown status")
    gated = any(r.gate for r in records)
    if not parts:
        parts.append("✅ no regressions" if gated else "✅ all passed")
    return f"### kernelpro: {' · '.join(parts)} ({len(records)} kernels)"


_HTML_ESCAPES = {
    "&": "&amp;",
    "<": "&lt;",
    ">": "&gt;",
    '"': "&quot;",
    # GitHub turns @name and #123 into mentions and links after rendering: break them.
    "@": "&#64;\u200b",
    "#": "&#35;\u200b",
}


def _html(value: Any, limit: int = 200) -> str:
    text = " ".join(str(value).split())[:limit]
    return "".join(_HTML_ESCAPES.get(c, c) for c in text)


def _number_text(value: Any) -> str:
    return f"{float(value):.3g}" if isinstance(value, (int, float)) else "–"


def _pct_or_dash(value: Any) -> str:
    return f"{float(value):.1%}" if isinstance(value, (int, float)) else "–"


def _details(record: KernelRecord, with_guidance: bool) -> str:
    gate = record.gate
    status = record_status(record)
    conf = (gate.confirmation if gate else None) or {}
    # HTML only around our own words: a name inside <summary> is an HTML-escaped <code>.
    summary = (
        f"<details><summary>{_emoji(status)} <code>{_html(record.name)}</code>: "
        f"{_html(status.replace('-', ' ') if status in STATUS_STYLE else 'unknown status')}"
    )
    if not gate:
        lines = [f"{summary}</summary>", ""]
        lines.append(
            f"- **Failure:** {_text(record.message or 'see the test log', limit=1000, table=False)}"
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
        f"| Device | {_text(short_device(gate.baseline_device))} | "
        f"{_text(short_device(record.device))} | |",
        "",
    ]
    lines.append(
        f"- **Basis:** {_text(gate.basis, table=False)}; "
        f"tolerance {_pct_or_dash(gate.tolerance)}"
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
    why = gate.reason or gate.message or ""
    lines.append(f"- **Why:** {_text(why, limit=1000, table=False)}")
    if record.outcome in ("failed", "error") and record.message and not gate.failed:
        lines.append(f"- **Test failure:** {_text(record.message, limit=1000, table=False)}")
    if with_guidance and record.guidance:
        # Written by the job that ran the PR's code: shown as text, never rendered.
        lines += [
            "",
            "Bottleneck analysis (from the report, verbatim):",
            "",
            _block(record.guidance),
        ]
    lines += ["", "</details>"]
    return "\n".join(lines)


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
            shown = ", ".join(_text(n, limit=120, table=False) for n in names[:20])
            more = f" and {len(names) - 20} more" if len(names) > 20 else ""
            lines += [f"⚠️ {len(names)} {words}: {shown}{more}", ""]
    return lines


def _footer(report: dict[str, Any]) -> str:
    meta = report.get("meta") or {}
    parts = []
    devices = meta.get("devices") or ([meta["device"]] if meta.get("device") else [])
    if devices:
        parts.append(", ".join(_text(d, limit=80, table=False) for d in devices))
    if meta.get("commit"):
        parts.append(f"commit {_text(str(meta['commit'])[:12], table=False)}")
    if meta.get("baseline_commit"):
        parts.append(f"baseline {_text(str(meta['baseline_commit'])[:12], table=False)}")
    if meta.get("torch"):
        parts.append(f"torch {_text(meta['torch'], limit=40, table=False)}")
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
            out += [_HEADER, *(_row(r) for r in shown), ""]
        if shown is not records:
            out += [
                f"<details><summary>{len(quiet)} unchanged or skipped kernels</summary>",
                "",
                _HEADER,
                *(_row(r) for r in quiet),
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
        for r in records:
            if record_status(r) in _DETAIL_STATUSES:
                out += [_details(r, with_guidance), ""]
        out += optimize_markdown(records, _text)
    out += _coverage_lines(report.get("meta") or {})
    out += ["---", _footer(report)]
    body = "\n".join(out) + "\n"
    if len(body) > MAX_BODY and with_guidance:
        return render_comment(report, with_guidance=False)
    if len(body) > MAX_BODY:
        cut = body[: MAX_BODY - 200].rsplit("\n", 1)[0]
        body = cut + "\n\n…(truncated: see the JSON report in the workflow artifact)\n"
    return body


def _load_inputs(paths: Sequence[str]) -> dict[str, Any]:
    from pytest_kernelpro.gate.junit import read_junit_records
    from pytest_kernelpro.gate.report import build_report, load_report, merge_report_dicts

    reports = []
    for path in paths:
        if path.lower().endswith(".xml"):
            reports.append(build_report(read_junit_records(path), meta={"source": path}))
        else:
            reports.append(load_report(path))
    return reports[0] if len(reports) == 1 else merge_report_dicts(reports)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kernelpro comment",
        description="Build the PR comment from kernelpro JSON reports or JUnit XML files "
        "(several are merged) and, with --post, create or update the one sticky comment.",
    )
    parser.add_argument("inputs", nargs="+", metavar="REPORT.json|JUNIT.xml")
    parser.add_argument("--out", metavar="PATH", help="write the Markdown to PATH")
    parser.add_argument("--plot", metavar="PNG", help="also write the roofline plot to PNG")
    parser.add_argument("--post", action="store_true", help="post or update the PR comment")
    parser.add_argument(
        "--repo",
        default=os.environ.get("GITHUB_REPOSITORY"),
        metavar="OWNER/NAME",
        help="repository (default: $GITHUB_REPOSITORY)",
    )
    parser.add_argument("--pr", metavar="N", help="pull request number")
    parser.add_argument(
        "--head-sha",
        metavar="SHA",
        help="only post if the PR's head is still this commit (guards against stale or "
        "misdirected reports from an artifact)",
    )
    parser.add_argument(
        "--bot-login",
        default=GITHUB_ACTIONS_BOT.login,
        metavar="LOGIN",
        help="the account the token posts as; only its own comment is updated "
        f"(default: {GITHUB_ACTIONS_BOT.login}, the workflow's GITHUB_TOKEN)",
    )
    parser.add_argument(
        "--bot-id",
        default=str(GITHUB_ACTIONS_BOT.id),
        metavar="ID",
        help=f"that account's numeric user id (default: {GITHUB_ACTIONS_BOT.id})",
    )
    parser.add_argument(
        "--api-url",
        default=os.environ.get("GITHUB_API_URL", "https://api.github.com"),
        metavar="URL",
        help="GitHub REST API root (default: $GITHUB_API_URL or https://api.github.com)",
    )
    return parser


def comment_main(argv: Sequence[str] | None = None) -> int:
    """`kernelpro comment`: 0 on success, 1 on a failure it explains, 2 on bad usage.

    The token is read from GITHUB_TOKEN (or GH_TOKEN) only, never from the command line.
    """
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    err = sys.stderr.write
    pr_number = None
    if args.post:
        if not args.repo:
            err("kernelpro comment: --post needs --repo OWNER/NAME (or $GITHUB_REPOSITORY)\n")
            return 2
        text = (args.pr or "").strip()
        if not text.isdigit() or int(text) < 1:
            err(f"kernelpro comment: --post needs --pr N, a pull request number (got {text!r})\n")
            return 2
        pr_number = int(text)
        if not str(args.bot_id).isdigit() or not args.bot_login:
            err(f"kernelpro comment: --bot-id must be a user id number (got {args.bot_id!r})\n")
            return 2
    try:
        report = _load_inputs(args.inputs)
        body = render_comment(report)
        if args.out:
            from pytest_kernelpro.fileio import atomic_write_text

            atomic_write_text(args.out, body)
        if args.plot:
            from pytest_kernelpro.gate.plot import roofline_plot
            from pytest_kernelpro.gate.report import records_of

            roofline_plot(records_of(report), args.plot)
        if not args.out and not args.post:
            sys.stdout.write(body)
        if args.post:
            token = os.environ.get("GITHUB_TOKEN") or os.environ.get("GH_TOKEN") or ""
            assert pr_number is not None
            if args.head_sha:
                head = pull_request_head(args.repo, pr_number, token=token, api_url=args.api_url)
                if head != args.head_sha:
                    err(
                        f"kernelpro comment: PR #{pr_number} head is {head}, not {args.head_sha} "
                        "that this report measured; not posting (a newer run will comment)\n"
                    )
                    return 0
            url = post_comment(
                body,
                repo=args.repo,
                pr_number=pr_number,
                token=token,
                api_url=args.api_url,
                bot=BotIdentity(args.bot_login, int(args.bot_id)),
            )
            err(f"kernelpro comment: posted {url}\n")
    except (KernelproError, OSError) as exc:
        err(f"kernelpro comment: {exc}\n")
        return 1
    return 0
