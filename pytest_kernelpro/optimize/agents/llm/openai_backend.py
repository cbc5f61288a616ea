"""An OpenAI-compatible backend (chat completions) for models a team serves itself.

vLLM, SGLang, Ollama and most inference servers speak the OpenAI chat-completions protocol;
this backend talks to them through the official `openai` SDK with a base URL and a model
name (`--kernelpro-llm=openai --kernelpro-llm-base-url=http://host:8000/v1
--kernelpro-model=NAME`). The key is read from OPENAI_API_KEY when the server wants one;
local servers usually do not, and the SDK is then given a placeholder. Without a model name
the session asks the server which models it serves (`served_models`, the SDK's
`models.list()`) and takes the only one (`optimize/loop/preflight.py`).

Mapping: the system prompt is the first `system` message; `finish_reason` "length" is the
stop reason "max_tokens" (truncation recovery works the same), "stop" is "end_turn",
"tool_calls" is "tool_use". Tools are offered as `function` tools and run in a loop as in
the Anthropic backend. A model without a price (a self-served one, usually) has its token
counts kept and its cost not counted, with a warning saying so; an API-spend budget refuses
it before any call (`base.require_price`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kernelpro.optimize.agents.llm.model_api import (
    LLMError,
    LLMRequest,
    LLMResponse,
    ModelPrice,
    api_failure,
    call_tool,
    compute_cost,
)
from pytest_kernelpro.text_safety import safe_line

API_KEY_ENV = "OPENAI_API_KEY"
BASE_URL_ENV = "OPENAI_BASE_URL"
NO_KEY = "not-needed"  # local servers accept any key; the SDK insists on one
_STOP = {"length": "max_tokens", "stop": "end_turn", "tool_calls": "tool_use"}


class ModelListError(LLMError):
    """The server's model list could not be read; `answered`: the server answered (an HTTP
    error or a body that is no model list), so a model named by hand may still work."""

    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


def import_openai() -> Any:
    """The openai SDK, or an LLMError saying how to install it."""
    try:
        import openai
    except ImportError:
        raise LLMError(
            "the openai package is not installed; `pip install openai` (or "
            "`pip install pytest-kernelpro[llm]`)"
        ) from None
    return openai


def served_models(base_url: str, *, timeout_s: float = 20.0) -> list[str]:
    """The ids of the models the OpenAI-compatible server at `base_url` serves, in its order
    (`GET {base_url}/models` through the SDK's `client.models.list()`, one request, no
    retry). Raises `ModelListError` naming the URL, what failed and the fix."""
    openai = import_openai()
    key = os.environ.get(API_KEY_ENV, "").strip()
    url = f"{base_url.rstrip('/')}/models"
    failure: str | None = None
    answered = True
    ids: list[str] = []
    try:
        client = openai.OpenAI(
            api_key=key or NO_KEY, base_url=base_url, timeout=float(timeout_s), max_retries=0
        )
        ids = [str(m.id) for m in client.models.list() if getattr(m, "id", None)]
    except openai.APIConnectionError as exc:  # refused, unresolved, timed out
        answered = False
        failure = (
            f"GET {url} got no answer ({type(exc).__name__}: {_cause(exc)}); is the server "
            "running and listening at that address? Start it, or correct the base URL"
        )
    except openai.APIStatusError as exc:
        failure = f"GET {url} answered HTTP {exc.status_code} ({_body(exc)}); " + _status_fix(
            exc.status_code
        )
    except Exception as exc:  # a body that is no model list: said, never a traceback
        failure = (
            f"GET {url} did not return a model list ({type(exc).__name__}: "
            f"{safe_line(exc, 200)}); is it an OpenAI-compatible server's base URL?"
        )
    if failure is not None:
        raise ModelListError(failure.replace(key, "***") if key else failure, answered=answered)
    return ids


def _status_fix(status: int) -> str:
    if status == 404:
        return (
            "the server has no such endpoint: check the base URL (vLLM, SGLang, llama.cpp "
            "and Ollama serve the OpenAI API under /v1, e.g. http://localhost:8000/v1)"
        )
    if status in (401, 403):
        return f"the server wants a key: set {API_KEY_ENV}"
    return "the server failed to list its models: check its log"


def _cause(exc: BaseException) -> str:
    """The connection error's root cause (the SDK's own message is "Connection error.")."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__
    return safe_line(cause if cause is not None and str(cause) else exc, 200)


def _body(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error", body)
        text = error.get("message", error) if isinstance(error, dict) else error
    else:
        text = body if body is not None else getattr(exc, "message", "")
    return safe_line(text, 200) or "no body"


class OpenAICompatibleBackend:
    """`LLMBackend` over an OpenAI-compatible chat-completions endpoint."""

    name = "openai"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        prices: Mapping[str, ModelPrice | Sequence[float]] | None = None,
    ) -> None:
        if not model:
            raise LLMError(
                "the openai backend needs a model name: pass --kernelpro-model=NAME (the name "
                "the server serves, e.g. the vLLM --served-model-name)"
            )
        openai = import_openai()
        self.model = model
        self.base_url = base_url or os.environ.get(BASE_URL_ENV) or None
        self.prices = dict(prices or {})
        key = os.environ.get(API_KEY_ENV, "").strip()
        self._has_key = bool(key)
        self._client = openai.OpenAI(
            api_key=key or NO_KEY,
            base_url=self.base_url,
            timeout=float(timeout_s),
            max_retries=int(max_retries),
        )
        self._api_error = openai.APIError
        self._key = key

    def __repr__(self) -> str:
        return f"OpenAICompatibleBackend(model={self.model!r}, base_url={self.base_url!r})"

    __str__ = __repr__

    def _scrub(self, text: str) -> str:
        return text.replace(self._key, "***") if self._key else text

    def _send(self, kwargs: dict[str, Any]) -> Any:
        failure: str | None = None
        completion: Any = None
        try:
            completion = self._client.chat.completions.create(**kwargs)
        except self._api_error as exc:
            failure = api_failure(
                "OpenAI-compatible API call failed", exc, model=self.model, endpoint=self.base_url
            )
        if failure is not None:
            raise LLMError(self._scrub(failure))
        return completion

    def complete(self, request: LLMRequest) -> LLMResponse:
        """One chat completion (a tool loop when the request offers tools)."""
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages += [m.to_dict() for m in request.messages]
        kwargs: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": request.max_tokens,
        }
        if request.temperature is not None:
            kwargs["temperature"] = request.temperature
        toolbox = request.toolbox
        if toolbox is not None:
            kwargs["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("description", ""),
                        "parameters": t.get("input_schema", {"type": "object"}),
                    },
                }
                for t in request.tools
            ]
        rounds = request.max_tool_rounds
        calls: list[dict[str, Any]] = []
        tokens = [0, 0]
        while True:
            completion = self._send(kwargs)
            usage = getattr(completion, "usage", None)
            tokens[0] += int(getattr(usage, "prompt_tokens", 0) or 0)
            tokens[1] += int(getattr(usage, "completion_tokens", 0) or 0)
            if not completion.choices:
                raise LLMError(f"the server at {self.base_url} returned no choices")
            choice = completion.choices[0]
            message = choice.message
            tool_calls = list(getattr(message, "tool_calls", None) or ())
            if toolbox is None or choice.finish_reason != "tool_calls" or not tool_calls:
                break
            kwargs["messages"] = [
                *kwargs["messages"],
                message.model_dump(exclude_none=True),
            ]
            for call in tool_calls:
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                except ValueError:
                    arguments = {}
                output = call_tool(toolbox, rounds, call.function.name, arguments, calls)
                kwargs["messages"].append(
                    {"role": "tool", "tool_call_id": call.id, "content": output}
                )
        model = str(getattr(completion, "model", "") or self.model)
        return LLMResponse(
            text=str(message.content or ""),
            stop_reason=_STOP.get(
                str(choice.finish_reason), str(choice.finish_reason or "end_turn")
            ),
            input_tokens=tokens[0],
            output_tokens=tokens[1],
            cost_usd=compute_cost(model, tokens[0], tokens[1], self.prices),
            model=model,
            request_hash=request.request_hash(),
            tool_calls=tuple(calls),
        )
