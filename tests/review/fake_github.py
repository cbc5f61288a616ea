"""A tiny GitHub REST API on loopback: issue comments (paginated), pull requests, errors.

Plays just enough of https://docs.github.com/en/rest/issues/comments for `post_comment`:
GET/POST /repos/{o}/{r}/issues/{n}/comments, PATCH /repos/{o}/{r}/issues/comments/{id},
GET /repos/{o}/{r}/pulls/{n}; and for `approval.decide`: GET /repos/{o}/{r}/pulls/{n}/reviews
(paginated) and GET /repos/{o}/{r}/collaborators/{user}/permission (404: no collaborator). Every request is recorded; a request without the expected
bearer token gets 401.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class FakeGitHub:
    token: str
    page_size: int = 2  # small, so a handful of comments spans several pages
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # pr -> comments
    heads: dict[int, str] = field(default_factory=dict)  # pr -> head sha
    authors: dict[int, str] = field(default_factory=dict)  # pr -> author login
    reviews: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # pr -> reviews
    permissions: dict[str, str] = field(default_factory=dict)  # login -> admin/write/read
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)
    fail_with: tuple[int, str] | None = None  # (status, message) for every request
    next_id: int = 1000
    url: str = ""
    link_host: str | None = None  # put another host into Link headers (token-leak check)

    def add_comment(
        self, pr: int, body: str, user_type: str = "User", login: str = "someone", uid: int = 1
    ) -> dict[str, Any]:
        self.next_id += 1
        comment = {
            "id": self.next_id,
            "body": body,
            "user": {"login": login, "id": uid, "type": user_type},
            "html_url": f"https://github.example/pr/{pr}#issuecomment-{self.next_id}",
        }
        self.comments.setdefault(pr, []).append(comment)
        return comment

    def all_comments(self, pr: int) -> list[dict[str, Any]]:
        return self.comments.get(pr, [])

    def add_review(self, pr: int, login: str, state: str, commit_id: str) -> dict[str, Any]:
        self.next_id += 1
        review = {
            "id": self.next_id,
            "user": {"login": login, "id": self.next_id, "type": "User"},
            "state": state,
            "commit_id": commit_id,
        }
        self.reviews.setdefault(pr, []).append(review)
        return review


def _handler(state: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def _handle(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            payload = json.loads(self.rfile.read(length)) if length else None
            parts = urlsplit(self.path)
            state.requests.append((method, self.path, dict(self.headers), payload))
            if self.headers.get("Authorization") != f"Bearer {state.token}":
                return self._send(401, {"message": "Bad credentials"})
            if state.fail_with:
                status, message = state.fail_with
                return self._send(status, {"message": message})
            m = re.fullmatch(r"/repos/[^/]+/[^/]+/issues/(\d+)/comments", parts.path)
            reviews = re.fullmatch(r"/repos/[^/]+/[^/]+/pulls/(\d+)/reviews", parts.path)
            if (m or reviews) and method == "GET":
                pr = int((m or reviews).group(1))  # type: ignore[union-attr]
                page = int(parse_qs(parts.query).get("page", ["1"])[0])
                items = state.all_comments(pr) if m else state.reviews.get(pr, [])
                chunk = items[(page - 1) * state.page_size : page * state.page_size]
                headers = {}
                if page * state.page_size < len(items):
                    host = state.link_host or state.url
                    nxt = f"{host}{parts.path}?per_page=100&page={page + 1}"
                    headers["Link"] = f'<{nxt}>; rel="next", <{nxt}>; rel="last"'
                return self._send(200, chunk, headers)
            if m and method == "POST":
                # The token posts as the GitHub Actions bot.
                comment = state.add_comment(
                    int(m.group(1)),
                    payload["body"],
                    user_type="Bot",
                    login="github-actions[bot]",
                    uid=41898282,
                )
                return self._send(201, comment)
            m = re.fullmatch(r"/repos/[^/]+/[^/]+/issues/comments/(\d+)", parts.path)
            if m and method == "PATCH":
                cid = int(m.group(1))
                for comments in state.comments.values():
                    for comment in comments:
                        if comment["id"] == cid:
                            comment["body"] = payload["body"]
                            return self._send(200, comment)
                return self._send(404, {"message": "Not Found"})
            m = re.fullmatch(r"/repos/[^/]+/[^/]+/pulls/(\d+)", parts.path)
            if m and method == "GET":
                pr = int(m.group(1))
                if pr not in state.heads:
                    return self._send(404, {"message": "Not Found"})
                return self._send(
                    200,
                    {
                        "number": pr,
                        "head": {"sha": state.heads[pr]},
                        "user": {"login": state.authors.get(pr, "contributor")},
                    },
                )
            m = re.fullmatch(r"/repos/[^/]+/[^/]+/collaborators/([^/]+)/permission", parts.path)
            if m and method == "GET":
                if m.group(1) not in state.permissions:
                    return self._send(404, {"message": "Not Found"})
                return self._send(200, {"permission": state.permissions[m.group(1)]})
            return self._send(404, {"message": "Not Found"})

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PATCH(self) -> None:
            self._handle("PATCH")

    return Handler


class running_fake_github:
    """Context manager: a FakeGitHub served on 127.0.0.1 on a free port."""

    def __init__(self, token: str = "ghs_testtoken123") -> None:
        self.state = FakeGitHub(token=token)

    def __enter__(self) -> FakeGitHub:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.state.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        return self.state

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)
