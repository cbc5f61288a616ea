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
import sys
from collections.abc import Sequence
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    cross_device,
    record_status,
    sort_key,
)
from pytest_kernelpro.gate.github import (
    GITHUB_ACTIONS_BOT,
    MARKER,
    BotIdentity,
    post_comment,
    pull_request_head,
)
from pytest_kernelpro.gate.optimize_table import optimize_markdown
from pytest_kernelpro.gate.render import (
    COMMENT_HEADER,
    comment_details,
    comment_row,
    literal_text,
    status_emoji,
)
from pytest_kernelpro.record import KernelRecord

__all__ = ["MARKER", "comment_main", "post_comment", "render_comment"]

MAX_BODY = 60_000  # GitHub refuses comments over 65,536 characters
FOLD_OK_ABOVE = 12  # more kernels than this: unchanged ones go in a collapsed table
_DETAIL_STATUSES = ("regressed", "below-roofline", "suspect", "failed", "error")


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
