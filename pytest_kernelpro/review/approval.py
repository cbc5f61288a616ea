"""`kernelpro approval`: may the GPU job run this pull request's commit? Only the commit a
maintainer approved.

The GPU job runs the pull request's code on a self-hosted runner, so "a maintainer added the
label" is not enough: a push between the review and the label would run unreviewed code.
The rule, checked through the GitHub REST API before the GPU job starts:

- the commit to run is the head SHA of the labeling event, and it is still the pull
  request's head (a push since the label: stop, the push revoked the approval);
- and it is approved by a person with write access to the repository (permission admin,
  maintain or write): an `APPROVED` review whose `commit_id` is exactly that SHA (a
  review of an earlier commit approves nothing, a dismissed review approves nothing), or a
  pull-request comment by such a person whose line reads `/gpu-ci approve <40-hex SHA>`
  naming exactly that SHA;
- the pull request's author never approves their own commit.

Otherwise it stops with the reason (exit status 1, a `::error::` line). The approved SHA is
printed and, in a workflow, written to `$GITHUB_OUTPUT` as `sha=...`: the GPU job checks
out that SHA, never a branch name.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.review.github import (
    DEFAULT_API_URL,
    GitHubApiError,
    _Client,
    _next_link,
    _validate,
)

WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
_SHA = re.compile(r"^[0-9a-f]{40}$")
_COMMAND = re.compile(r"^\s*/gpu-ci\s+approve\s+([0-9a-f]{40})\s*$", re.MULTILINE)
_MAX_PAGES = 50


@dataclass(frozen=True)
class Decision:
    """Whether the GPU job may run `sha`, and why (`reason`: one line)."""

    ok: bool
    sha: str
    reason: str
    approver: str | None = None


def _pages(client: _Client, url: str) -> Iterator[dict[str, Any]]:
    next_url: str | None = url
    for _ in range(_MAX_PAGES):
        if next_url is None:
            return
        items, headers = client.request("GET", next_url)
        if not isinstance(items, list):
            raise GitHubApiError(f"GitHub API GET {next_url}: expected a list")
        yield from (i for i in items if isinstance(i, dict))
        next_url = _next_link(headers.get("link"))


def _permission(client: _Client, repo: str, login: str, cache: dict[str, str]) -> str:
    if login not in cache:
        try:
            data, _ = client.request(
                "GET", f"{client.base}/repos/{repo}/collaborators/{login}/permission"
            )
        except GitHubApiError as exc:
            if "HTTP 404" in str(exc):  # not a collaborator
                cache[login] = "none"
                return "none"
            raise
        cache[login] = str((data or {}).get("permission") or "none")
    return cache[login]


def decide(
    repo: str,
    pr_number: int,
    head_sha: str,
    *,
    token: str,
    api_url: str = DEFAULT_API_URL,
    timeout: float = 30,
) -> Decision:
    """The rule of the module doc, for `head_sha` (the labeling event's head)."""
    _validate(repo, pr_number, token)
    sha = head_sha.strip().lower()
    if not _SHA.match(sha):
        return Decision(False, head_sha, f"the head SHA {head_sha!r} is not a 40-hex commit id")
    client = _Client(api_url, token, timeout)
    pr, _ = client.request("GET", f"{client.base}/repos/{repo}/pulls/{pr_number}")
    current = str(((pr or {}).get("head") or {}).get("sha") or "").lower()
    author = str(((pr or {}).get("user") or {}).get("login") or "")
    if current != sha:
        return Decision(
            False,
            sha,
            f"the pull request's head moved since the label was added ({sha[:12]} -> "
            f"{current[:12] or 'unknown'}): a push revokes the approval; review the new "
            "commit and add the gpu-ci label again",
        )
    permissions: dict[str, str] = {}
    seen: list[str] = []
    base = f"{client.base}/repos/{repo}"
    for review in _pages(client, f"{base}/pulls/{pr_number}/reviews?per_page=100"):
        login = str((review.get("user") or {}).get("login") or "")
        if review.get("state") != "APPROVED" or not login:
            continue
        commit = str(review.get("commit_id") or "").lower()
        if commit != sha:
            seen.append(f"{login} approved {commit[:12] or 'no commit'}")
            continue
        if login == author:
            seen.append(f"{login} is the author")
            continue
        permission = _permission(client, repo, login, permissions)
        if permission in WRITE_PERMISSIONS:
            return Decision(
                True,
                sha,
                f"approved by {login} ({permission}) in review {review.get('id')} of commit {sha}",
                login,
            )
        seen.append(f"{login} approved it but has {permission} access")
    for comment in _pages(client, f"{base}/issues/{pr_number}/comments?per_page=100"):
        named = _COMMAND.findall(str(comment.get("body") or ""))
        login = str((comment.get("user") or {}).get("login") or "")
        if sha not in named or not login or login == author:
            continue
        permission = _permission(client, repo, login, permissions)
        if permission in WRITE_PERMISSIONS:
            return Decision(
                True,
                sha,
                f"named by {login} ({permission}) in comment {comment.get('id')}: "
                f"/gpu-ci approve {sha}",
                login,
            )
        seen.append(f"{login} named it but has {permission} access")
    found = "; ".join(seen[:6]) if seen else "no approving review"
    return Decision(
        False,
        sha,
        f"commit {sha} has no approval by someone with write access ({found}): approve "
        f"this exact commit in a review, or comment `/gpu-ci approve {sha}`",
    )


def approval_main(argv: Sequence[str] | None = None) -> int:
    """`kernelpro approval --repo O/R --pr N --head-sha SHA`: exit 0 and the approved SHA,
    or exit 1 with the reason."""
    parser = argparse.ArgumentParser(
        prog="kernelpro approval",
        description="Stop unless the pull request's head commit was approved by someone "
        "with write access (a review of that exact commit, or `/gpu-ci approve SHA`).",
    )
    parser.add_argument("--repo", required=True, help="OWNER/NAME")
    parser.add_argument("--pr", required=True, type=int, help="pull request number")
    parser.add_argument("--head-sha", required=True, help="the labeling event's head SHA")
    parser.add_argument("--api-url", default=os.environ.get("GITHUB_API_URL", DEFAULT_API_URL))
    args = parser.parse_args(argv)
    token = os.environ.get("GITHUB_TOKEN", "")
    try:
        decision = decide(args.repo, args.pr, args.head_sha, token=token, api_url=args.api_url)
    except GitHubApiError as exc:
        sys.stderr.write(f"::error::kernelpro approval: {exc}\n")
        return 1
    if not decision.ok:
        sys.stderr.write(f"::error::kernelpro approval: {decision.reason}\n")
        return 1
    sys.stdout.write(f"kernelpro approval: {decision.reason}\n")
    output = os.environ.get("GITHUB_OUTPUT")
    if output:
        with open(output, "a", encoding="utf-8") as handle:
            handle.write(f"sha={decision.sha}\n")
    return 0
