"""Create or update one sticky pull-request comment through the GitHub REST API (urllib).

The comment is found across every page of the PR's comments by its author (the bot the token
posts as: login and id, `BotIdentity`) and the hidden marker its body starts with; a comment
by anyone else is never edited, whatever it contains. The token is
sent only to `api_url`'s own host (a `Link: next` URL elsewhere is refused) and never appears
in an error message.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError

MARKER = "<!-- kernelpro-report -->"
DEFAULT_API_URL = "https://api.github.com"
_REPO_RE = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_MAX_PAGES = 100  # 10,000 comments: far beyond any PR; bounds the loop
_RETRY_STATUS = (502, 503, 504)


class GitHubApiError(KernelproError):
    """A GitHub REST call failed; the message says which call, why, and what to change."""


def _hint(status: int, message: str) -> str:
    if status == 401:
        return "the token is invalid or expired: pass the workflow's GITHUB_TOKEN in the env"
    if status == 403 and "not accessible by integration" in message.lower():
        return (
            "the token may not write to this pull request: give the job `permissions: "
            "pull-requests: write`, and post from the workflow_run workflow for fork PRs"
        )
    if status == 403:
        return "forbidden (permissions or rate limit): check the job's `permissions:`"
    if status == 404:
        return "repository or pull request not found: check --repo OWNER/NAME and --pr N"
    if status == 422:
        return "GitHub rejected the body (a comment is at most 65536 characters)"
    return "see the GitHub API status page and retry"


class _Client:
    def __init__(self, api_url: str, token: str, timeout: float) -> None:
        self.base = api_url.rstrip("/")
        parsed = urllib.parse.urlsplit(self.base)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise GitHubApiError(
                f"--api-url {api_url!r} is not an http(s) URL; use e.g. {DEFAULT_API_URL}"
            )
        self.origin = (parsed.scheme, parsed.netloc)
        self.token = token
        self.timeout = timeout

    def _scrub(self, text: str) -> str:
        return text.replace(self.token, "***") if self.token else text

    def request(
        self, method: str, url: str, payload: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, str]]:
        parsed = urllib.parse.urlsplit(url)
        if (parsed.scheme, parsed.netloc) != self.origin:
            raise GitHubApiError(
                f"refusing to send the token to {parsed.scheme}://{parsed.netloc}, which is "
                f"not the API host {self.base}"
            )
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        headers = {
            "Accept": "application/vnd.github+json",
            "Authorization": f"Bearer {self.token}",
            "X-GitHub-Api-Version": "2022-11-28",
            "User-Agent": f"pytest-kernelpro/{__version__}",
        }
        if data is not None:
            headers["Content-Type"] = "application/json"
        where = f"{method} {parsed.path}"
        for attempt in range(3):
            req = urllib.request.Request(url, data=data, method=method, headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310
                    body = resp.read().decode("utf-8") or "null"
                    return json.loads(body), {k.lower(): v for k, v in resp.headers.items()}
            except urllib.error.HTTPError as exc:
                if exc.code in _RETRY_STATUS and attempt < 2:
                    time.sleep(1.0 + attempt)
                    continue
                raw = exc.read().decode("utf-8", "replace")
                try:
                    message = str(json.loads(raw).get("message", raw))
                except (json.JSONDecodeError, AttributeError):
                    message = raw
                message = self._scrub(message.strip())[:300]
                raise GitHubApiError(
                    f"GitHub API {where} failed: HTTP {exc.code} {exc.reason}: {message}. "
                    f"Fix: {_hint(exc.code, message)}"
                ) from None
            except (urllib.error.URLError, TimeoutError, OSError) as exc:
                if attempt < 2:
                    time.sleep(1.0 + attempt)
                    continue
                reason = self._scrub(str(getattr(exc, "reason", exc)))
                raise GitHubApiError(
                    f"GitHub API {where}: cannot reach {self.base} ({reason}); check the "
                    "network and --api-url"
                ) from None
            except json.JSONDecodeError as exc:
                raise GitHubApiError(
                    f"GitHub API {where}: the answer is not JSON ({exc})"
                ) from None
        raise AssertionError("unreachable")  # pragma: no cover


def _next_link(link_header: str | None) -> str | None:
    """The rel="next" URL of a GitHub `Link` header, if any."""
    if not link_header:
        return None
    for part in link_header.split(","):
        match = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', part)
        if match:
            return match.group(1)
    return None


def _validate(repo: str, pr_number: int, token: str) -> None:
    if not _REPO_RE.match(repo or ""):
        raise GitHubApiError(f"--repo {repo!r} is not OWNER/NAME (e.g. octo-org/kernels)")
    if not isinstance(pr_number, int) or isinstance(pr_number, bool) or pr_number < 1:
        raise GitHubApiError(f"--pr {pr_number!r} is not a pull request number")
    if not token:
        raise GitHubApiError(
            "no GitHub token: set GITHUB_TOKEN in the environment (in a workflow: "
            "`env: GITHUB_TOKEN: ${{ secrets.GITHUB_TOKEN }}`)"
        )


@dataclass(frozen=True)
class BotIdentity:
    """Who the sticky comment belongs to: the account the workflow's token posts as.

    With the workflow's GITHUB_TOKEN that is the GitHub Actions app's bot user (its public
    login and id below); with a GitHub App's token, pass that app's bot login and id. A
    comment is ours only when its author matches both *and* its body starts with the marker:
    a person quoting the marker, or another bot, is never edited.
    """

    login: str = "github-actions[bot]"
    id: int = 41898282

    def owns(self, comment: dict[str, Any], marker: str) -> bool:
        user = comment.get("user") or {}
        return (
            isinstance(user, dict)
            and user.get("login") == self.login
            and user.get("id") == self.id
            and user.get("type") == "Bot"
            and str(comment.get("body") or "").startswith(marker)
        )


GITHUB_ACTIONS_BOT = BotIdentity()


def find_comment(
    client: _Client,
    repo: str,
    pr_number: int,
    marker: str,
    bot: BotIdentity = GITHUB_ACTIONS_BOT,
) -> dict[str, Any] | None:
    """The PR's comment written by `bot` that starts with `marker` (the first), else None."""
    url: str | None = f"{client.base}/repos/{repo}/issues/{pr_number}/comments?per_page=100"
    for _ in range(_MAX_PAGES):
        if url is None:
            break
        comments, headers = client.request("GET", url)
        if not isinstance(comments, list):
            raise GitHubApiError(f"GitHub API GET {url}: expected a list of comments")
        for comment in comments:
            if isinstance(comment, dict) and bot.owns(comment, marker):
                return comment
        url = _next_link(headers.get("link"))
    return None


def pull_request_head(
    repo: str, pr_number: int, *, token: str, api_url: str = DEFAULT_API_URL, timeout: float = 30
) -> str | None:
    """The head commit SHA of a pull request."""
    _validate(repo, pr_number, token)
    client = _Client(api_url, token, timeout)
    pr, _ = client.request("GET", f"{client.base}/repos/{repo}/pulls/{pr_number}")
    return ((pr or {}).get("head") or {}).get("sha")


def post_comment(
    body: str,
    *,
    repo: str,
    pr_number: int,
    token: str,
    api_url: str = DEFAULT_API_URL,
    marker: str = MARKER,
    timeout: float = 30,
    bot: BotIdentity = GITHUB_ACTIONS_BOT,
) -> str:
    """Update the PR's sticky kernelpro comment, or create it; returns the comment's URL.

    Only a comment by `bot` whose body starts with `marker` is updated; anyone else's is
    left alone. The marker is prepended to `body` when it does not start with it.
    """
    _validate(repo, pr_number, token)
    if not body.startswith(marker):
        body = f"{marker}\n{body}"
    client = _Client(api_url, token, timeout)
    existing = find_comment(client, repo, pr_number, marker, bot)
    if existing is not None:
        url = f"{client.base}/repos/{repo}/issues/comments/{int(existing['id'])}"
        result, _ = client.request("PATCH", url, {"body": body})
    else:
        url = f"{client.base}/repos/{repo}/issues/{pr_number}/comments"
        result, _ = client.request("POST", url, {"body": body})
    return str((result or {}).get("html_url") or (result or {}).get("url") or "")
