"""A loopback HTTP server that plays the Anthropic Messages API for the real SDK.

`POST /v1/messages` answers with the next scripted reply (text, stop reason, output tokens),
as a message JSON or, when the request asks to stream, as the API's server-sent events. Every
request's headers and JSON body are kept for the test to inspect.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from loopback_server import QuietHandler, serving


@dataclass
class Reply:
    text: str
    stop_reason: str = "end_turn"
    output_tokens: int = 50
    input_tokens: int = 100
    status: int = 200
    error_message: str = ""
    # (tool name, input) blocks after the text; the stop reason becomes "tool_use".
    tool_uses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


@dataclass
class FakeMessagesAPI:
    replies: list[Reply]
    model: str = "claude-sonnet-5-5-20260915"
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    url: str = ""

    def next_reply(self) -> Reply:
        if not self.replies:
            return Reply("", status=500, error_message="fake API: no scripted reply left")
        return self.replies.pop(0)


def _message(api: FakeMessagesAPI, reply: Reply) -> dict[str, Any]:
    return {
        "id": f"msg_{len(api.requests)}",
        "type": "message",
        "role": "assistant",
        "model": api.model,
        "content": [{"type": "text", "text": reply.text}]
        + [
            {"type": "tool_use", "id": f"toolu_{len(api.requests)}_{i}", "name": n, "input": a}
            for i, (n, a) in enumerate(reply.tool_uses)
        ],
        "stop_reason": "tool_use" if reply.tool_uses else reply.stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens},
    }


def _events(api: FakeMessagesAPI, reply: Reply) -> Iterator[tuple[str, dict[str, Any]]]:
    start = _message(api, reply)
    start.update(content=[], stop_reason=None)
    start["usage"] = {"input_tokens": reply.input_tokens, "output_tokens": 1}
    yield "message_start", {"type": "message_start", "message": start}
    yield (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        },
    )
    for i in range(0, len(reply.text), 64):
        yield (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": reply.text[i : i + 64]},
            },
        )
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reply.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": reply.output_tokens},
        },
    )
    yield "message_stop", {"type": "message_stop"}


def _handler(api: FakeMessagesAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            api.requests.append({"path": self.path, "body": body})
            api.headers.append({k.lower(): v for k, v in self.headers.items()})
            reply = api.next_reply() if self.path == "/v1/messages" else Reply("", status=404)
            if reply.status != 200:
                payload = {
                    "type": "error",
                    "error": {"type": "api_error", "message": reply.error_message or "error"},
                }
                self._send(reply.status, "application/json", json.dumps(payload).encode())
                return
            if body.get("stream"):
                chunks = "".join(
                    f"event: {name}\ndata: {json.dumps(data)}\n\n"
                    for name, data in _events(api, reply)
                )
                self._send(200, "text/event-stream", chunks.encode())
            else:
                self._send(200, "application/json", json.dumps(_message(api, reply)).encode())

        def do_GET(self) -> None:
            # The Models API (GET /v1/models/ID): the plugin's reachability check before a search.
            api.requests.append({"path": self.path, "body": None})
            if self.path.startswith("/v1/models/"):
                model_id = self.path.removeprefix("/v1/models/").split("?")[0]
                data = {
                    "type": "model",
                    "id": model_id,
                    "display_name": model_id,
                    "created_at": "2026-01-01T00:00:00Z",
                }
                self._send(200, "application/json", json.dumps(data).encode())
            else:
                self._send(
                    404,
                    "application/json",
                    b'{"type":"error","error":{"type":"not_found_error","message":"not found"}}',
                )

    return Handler


@contextmanager
def running_fake_api(replies: list[Reply]) -> Iterator[FakeMessagesAPI]:
    """Serve `replies` on 127.0.0.1 (a free port) for the duration of the block."""
    api = FakeMessagesAPI(list(replies))
    with serving(_handler(api)) as url:
        api.url = url
        yield api
