"""The pull-request comment: Markdown from a report, and `kernelpro comment`.

The privileged `workflow_run` job renders the comment itself from the report's data (it
does not post Markdown that the PR's job wrote), escaping every name that goes in a table.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    bar,
    format_change,
    format_time,
    record_status,
    short_device,
    sort_key,
    stat,
)
from pytest_kernelpro.gate.github import MARKER, post_comment, pull_request_head
from pytest_kernelpro.gate.optimize_table import optimize_markdown
from pytest_kernelpro.results import KernelRecord

__all__ = ["MARKER", "comment_main", "post_comment", "render_comment"]

MAX_BODY = 60_000  # GitHub refuses comments over 65,536 characters
FOLD_OK_ABOVE = 12  # more kernels than this: unchanged ones go in a collapsed table
_DETAIL_STATUSES = ("regressed", "below-roofline", "suspect", "failed", "error")


def _cell(text: Any) -> str:
    """Safe in a Markdown table cell: no pipes, no HTML, no line breaks."""
    out = str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return out.replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def _emoji(status: str) -> str:
    return STATUS_STYLE.get(status, ("❔", status, ""))[0]


def _label(status: str) -> str:
    return status.replace("-", " ")


def _roofline_cell(eff: float | None) -> str:
    if eff is None:
        return "–"
    return f"`{bar(eff, 8)}` {eff:.0%}"


def _row(record: KernelRecord) -> str:
    gate = record.gate or {}
    status = record_status(record)
    cross = str(gate.get("basis", "")).startswith("efficiency")
    base = gate.get("baseline_median_s")
    now = stat(record, "median_s")
    change = gate.get("change") if status not in ("new", "unmeasured") else None
    change_text = format_change(change) + ("\\*" if cross and change is not None else "")
    if change is not None and status in ("regressed", "improved"):
        change_text = f"**{change_text}**"
    bound = (record.roofline or {}).get("bound") or "–"
    cells = [
        _cell(record.name),
        format_time(base) if base else "–",
        format_time(now),
        change_text,
        _roofline_cell(record.efficiency),
        _cell(bound),
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
    ):
        if counts.get(status):
            parts.append(f"{_emoji(status)} {counts[status]} {word}")
    gated = any(r.gate for r in records)
    if not parts:
        parts.append("✅ no regressions" if gated else "✅ all passed")
    return f"### kernelpro: {' · '.join(parts)} ({len(records)} kernels)"


def _pct_or_dash(value: Any) -> str:
    return f"{float(value):.1%}" if isinstance(value, (int, float)) else "–"


def _details(record: KernelRecord, with_guidance: bool) -> str:
    gate = record.gate or {}
    status = record_status(record)
    conf = gate.get("confirmation") or {}
    summary = (
        f"<details><summary>{_emoji(status)} <b>{_cell(record.name)}</b>: {_cell(_label(status))}"
    )
    if not gate:
        lines = [f"{summary}</summary>", ""]
        lines.append(f"- **Failure:** {_cell((record.message or 'see the test log')[:1000])}")
        lines += ["", "</details>"]
        return "\n".join(lines)
    lines = [
        f"{summary} {format_change(gate.get('change'))}</summary>",
        "",
        "| | Baseline | Now | Re-measured |",
        "|:--|--:|--:|--:|",
        f"| Median | {format_time(gate.get('baseline_median_s'))} | "
        f"{format_time(stat(record, 'median_s'))} | {format_time(conf.get('current_median_s'))} |",
        f"| Samples | {gate.get('n_baseline') or '–'} | {gate.get('n_current') or '–'} | "
        f"{conf.get('n') or '–'} |",
        f"| % of roofline | {_pct_or_dash(gate.get('baseline_efficiency'))} | "
        f"{_pct_or_dash(record.efficiency)} | |",
        f"| Device | {_cell(short_device(gate.get('baseline_device')))} | "
        f"{_cell(short_device(record.device))} | |",
        "",
    ]
    lines.append(
        f"- **Basis:** {_cell(gate.get('basis'))}; tolerance {_pct_or_dash(gate.get('tolerance'))}"
    )
    if gate.get("p_value") is not None:
        lines.append(
            f"- **Mann-Whitney U:** one-sided p = {float(gate['p_value']):.2g} "
            f"(alpha {gate.get('alpha')})"
        )
    if conf:
        done = "reproduced" if conf.get("reproduced") else "**not reproduced**"
        p_text = f", p = {float(conf['p_value']):.2g}" if conf.get("p_value") is not None else ""
        lines.append(
            f"- **Confirmation re-measurement:** {done} "
            f"({format_change(conf.get('change'))}{p_text})"
        )
    lines.append(f"- **Why:** {_cell(gate.get('reason') or gate.get('message') or '')}")
    if record.outcome in ("failed", "error") and record.message and not gate.get("failed"):
        lines.append(f"- **Test failure:** {_cell(record.message[:1000])}")
    if with_guidance and record.guidance:
        guidance = record.guidance.replace("<!--", "&lt;!--")  # keep the marker unique
        lines += ["", guidance.strip()]
    lines += ["", "</details>"]
    return "\n".join(lines)


def _footer(report: dict[str, Any]) -> str:
    meta = report.get("meta") or {}
    parts = []
    devices = meta.get("devices") or ([meta["device"]] if meta.get("device") else [])
    if devices:
        parts.append(", ".join(_cell(d) for d in devices))
    if meta.get("commit"):
        parts.append(f"commit `{_cell(str(meta['commit'])[:12])}`")
    if meta.get("baseline_commit"):
        parts.append(f"baseline `{_cell(str(meta['baseline_commit'])[:12])}`")
    if meta.get("torch"):
        parts.append(f"torch {_cell(meta['torch'])}")
    if isinstance(meta.get("wall_s"), (int, float)):
        parts.append(f"{meta['wall_s']:.0f} s")
    parts.append(f"pytest-kernelpro {__version__}")
    return "<sub>" + " · ".join(parts) + "</sub>"


def render_comment(report: dict[str, Any], *, with_guidance: bool = True) -> str:
    """The Markdown body of the sticky PR comment for one (possibly merged) report."""
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
        if any(str((r.gate or {}).get("basis", "")).startswith("efficiency") for r in records):
            out += [
                "\\* measured on another device than the baseline: compared by efficiency "
                "(time relative to the roofline) with the wider cross-device tolerance.",
                "",
            ]
        for r in records:
            if record_status(r) in _DETAIL_STATUSES:
                out += [_details(r, with_guidance), ""]
        out += optimize_markdown(records, _cell)
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
                body, repo=args.repo, pr_number=pr_number, token=token, api_url=args.api_url
            )
            err(f"kernelpro comment: posted {url}\n")
    except (KernelproError, OSError) as exc:
        err(f"kernelpro comment: {exc}\n")
        return 1
    return 0
