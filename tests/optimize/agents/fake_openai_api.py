"""A loopback HTTP server that plays an OpenAI-compatible server (what vLLM, SGLang, llama.cpp
and Ollama serve) for the real `openai` SDK: chat completions, and the model list."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from loopback_server import QuietHandler, serving


@dataclass
class ChatReply:
    text: str = ""
    finish_reason: str = "stop"
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    prompt_tokens: int = 120
    completion_tokens: int = 40


@dataclass
class FakeChatAPI:
    replies: list[ChatReply]
    model: str = "qwen3-coder-30b"
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    served: list[str] | None = None  # what GET /v1/models lists (None: `model` alone)
    models_status: int = 200  # another status: GET /v1/models fails with it

    def models_listed(self) -> int:
        """How many times the model list was asked for."""
        return sum(1 for r in self.requests if r["path"] == "/v1/models")


def _completion(api: FakeChatAPI, reply: ChatReply, model: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{len(api.requests)}_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(args)},
            }
            for i, (name, args) in enumerate(reply.tool_calls)
        ]
    return {
        "id": f"chatcmpl-{len(api.requests)}",
        "object": "chat.completion",
        "created": 0,
        "model": model,  # a server answers with the model asked for
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if reply.tool_calls else reply.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def _handler(api: FakeChatAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            api.requests.append(
                {"path": self.path, "body": None, "auth": self.headers.get("authorization")}
            )
            status = api.models_status if self.path == "/v1/models" else 404
            if status != 200:
                data = json.dumps({"error": {"message": f"GET {self.path} fails here"}})
                self._send(status, "application/json", data.encode())
                return
            served = [api.model] if api.served is None else api.served
            models = [
                {"id": m, "object": "model", "created": 0, "owned_by": "loopback"} for m in served
            ]
            data = json.dumps({"object": "list", "data": models})
            self._send(200, "application/json", data.encode())

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            api.requests.append(
                {"path": self.path, "body": body, "auth": self.headers.get("authorization")}
            )
            if self.path != "/v1/chat/completions" or not api.replies:
                data = json.dumps(
                    {"error": {"message": "no scripted reply", "type": "server_error"}}
                )
                self._send(500, "application/json", data.encode())
                return
            self._send(
                200,
                "application/json",
                json.dumps(
                    _completion(api, api.replies.pop(0), body.get("model") or api.model)
                ).encode(),
            )

    return Handler


@contextmanager
def running_fake_chat_api(
    replies: list[ChatReply], *, served: list[str] | None = None, models_status: int = 200
) -> Iterator[FakeChatAPI]:
    """Serve `replies` on 127.0.0.1 (a free port) for the duration of the block; GET
    /v1/models lists `served` (default: the one model), or fails with `models_status`."""
    api = FakeChatAPI(list(replies), served=served, models_status=models_status)
    with serving(_handler(api)) as url:
        api.url = f"{url}/v1"
        yield api
