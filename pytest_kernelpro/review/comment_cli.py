"""`kernelpro comment`: the PR comment from JSON reports or JUnit XML files, written to a file
or stdout and, with `--post`, created or updated as the one sticky comment."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.review.comment import render_comment
from pytest_kernelpro.review.github import (
    GITHUB_ACTIONS_BOT,
    MARKER,
    BotIdentity,
    post_comment,
    pull_request_head,
)

__all__ = ["MARKER", "comment_main", "post_comment"]


def _load_inputs(paths: Sequence[str]) -> dict[str, Any]:
    from pytest_kernelpro.gate.report import build_report
    from pytest_kernelpro.review.junit_read import read_junit_records
    from pytest_kernelpro.review.report_load import load_report, merge_report_dicts

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
            from pytest_kernelpro.review.plot import roofline_plot
            from pytest_kernelpro.review.report_load import records_of

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
