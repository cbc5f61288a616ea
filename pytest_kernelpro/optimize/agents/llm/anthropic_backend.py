"""The Anthropic Messages API backend, through the official `anthropic` SDK.

The API key is read from the environment variable ANTHROPIC_API_KEY only (never from an
option, a file or a marker), kept inside the SDK client and a `_Secret` holder whose repr is
masked, and scrubbed from every error message this module raises. Errors are raised outside
the SDK's `except` block so that no exception chain carries the SDK's request object (with
its headers) along.

Prompt caching: the system prompt (role, strategies, GPU injection) and the stable head of
the first user message (`meta["cache_prefix_chars"]`: the input format, the problem, the
reference analysis) are sent as text blocks marked `cache_control: ephemeral`, so repeated
calls for one problem read them from the cache; cache reads and writes are priced
(`ModelPrice.cost`).

Tool use: a request with `tools` and a `ToolBox` in `meta["toolbox"]` is answered in a loop:
each `tool_use` block is run by the toolbox, its result sent back as a `tool_result`, until the
model ends its turn or `meta["max_tool_rounds"]` rounds are spent (then it is told to answer
without tools). The response's `tool_calls` lists every call; tokens and cost add up.

Long replies: the SDK refuses a non-streaming call whose `max_tokens` could take more than
10 minutes; above `stream_threshold` output tokens the backend streams and collects the
final message instead, which is the SDK's recommended path for long requests.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kernelpro.errors import KernelproWarning
from pytest_kernelpro.optimize.agents.llm.model_api import (
    LLMError,
    LLMRequest,
    LLMResponse,
    ModelPrice,
    api_failure,
    call_tool,
    compute_cost,
)

API_KEY_ENV = "ANTHROPIC_API_KEY"
BASE_URL_ENV = "ANTHROPIC_BASE_URL"
DEFAULT_MODEL = "claude-sonnet-5-5"


class _Secret:
    """Holds a credential; its repr and str never show it."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "_Secret('***')"

    __str__ = __repr__


class AnthropicBackend:
    """`LLMBackend` over the Anthropic Messages API.

    `base_url` (or ANTHROPIC_BASE_URL) points the SDK at another endpoint (a proxy, or a
    local server in tests). `prices` overrides the built-in price table.
    """

    name = "anthropic"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        base_url: str | None = None,
        timeout_s: float = 600.0,
        max_retries: int = 2,
        stream_threshold: int = 16_000,
        prices: Mapping[str, ModelPrice | Sequence[float]] | None = None,
    ) -> None:
        key = os.environ.get(API_KEY_ENV, "").strip()
        if not key:
            raise LLMError(
                f"the environment variable {API_KEY_ENV} is not set (or empty); export your "
                f"Anthropic API key as {API_KEY_ENV}, or replay a recording with "
                "--kernelpro-llm=replay:PATH"
            )
        try:
            import anthropic
        except ImportError:
            raise LLMError(
                "the anthropic package is not installed; `pip install anthropic` (or "
                "`pip install pytest-kernelpro[llm]`)"
            ) from None
        self.model = model
        self.base_url = base_url or os.environ.get(BASE_URL_ENV) or None
        self.timeout_s = float(timeout_s)
        self.stream_threshold = int(stream_threshold)
        self.prices = dict(prices or {})
        self._key = _Secret(key)
        # An explicit timeout also lifts the SDK's "streaming required" guess for calls below
        # the stream threshold; above it we stream anyway.
        self._client = anthropic.Anthropic(
            api_key=self._key.reveal(),
            base_url=self.base_url,
            timeout=self.timeout_s,
            max_retries=int(max_retries),
        )
        self._api_error = anthropic.APIError
        self._deprecation_warned: set[str] = set()

    def __repr__(self) -> str:
        return f"AnthropicBackend(model={self.model!r}, base_url={self.base_url!r})"

    __str__ = __repr__

    def _scrub(self, text: str) -> str:
        key = self._key.reveal()
        return text.replace(key, "***") if key else text

    def _rewarn(self, caught: list[warnings.WarningMessage]) -> None:
        """The SDK's model-deprecation warnings become one KernelproWarning per model, so a
        suite with filterwarnings=error is told once, in the plugin's words."""
        for item in caught:
            if issubclass(item.category, DeprecationWarning) and "deprecated" in str(item.message):
                if self.model not in self._deprecation_warned:
                    self._deprecation_warned.add(self.model)
                    warnings.warn(
                        f"{item.message} Choose another model with --kernelpro-model.",
                        KernelproWarning,
                        stacklevel=3,
                    )
            else:
                warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)

    def check_reachable(self) -> None:
        """One Models API request (no tokens spent): the endpoint answers, the key is
        accepted and the model exists. Raises `LLMError` saying which of these failed."""
        failure: str | None = None
        try:
            self._client.models.retrieve(self.model)
        except self._api_error as exc:
            failure = api_failure(
                "the Anthropic API did not accept a models request",
                exc,
                model=self.model,
                endpoint=self.base_url,
            )
        if failure is not None:
            raise LLMError(
                self._scrub(failure) + "; check the network, ANTHROPIC_API_KEY, "
                "ANTHROPIC_BASE_URL and --kernelpro-model"
            )

    def _messages(self, request: LLMRequest) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = [m.to_dict() for m in request.messages]
        cut = int(request.meta.get("cache_prefix_chars") or 0)
        first = request.messages[0].content
        if 0 < cut < len(first):
            messages[0] = {
                "role": "user",
                "content": [
                    {"type": "text", "text": first[:cut], "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": first[cut:]},
                ],
            }
        return messages

    def _send(self, kwargs: dict[str, Any], max_tokens: int) -> Any:
        failure: str | None = None
        message: Any = None
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if max_tokens > self.stream_threshold:
                    with self._client.messages.stream(**kwargs) as stream:
                        message = stream.get_final_message()
                else:
                    message = self._client.messages.create(**kwargs)
            self._rewarn(caught)
        except self._api_error as exc:
            failure = api_failure(
                "Anthropic API call failed", exc, model=self.model, endpoint=self.base_url
            )
        if failure is not None:
            # Raised here, outside the except block: no __context__ holding the SDK request.
            raise LLMError(self._scrub(failure))
        return message

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Send one Messages API request (a tool-use loop when it offers tools); API and
        network failures raise `LLMError`."""
        kwargs: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "messages": self._messages(request),
        }
        if request.system:
            kwargs["system"] = [
                {"type": "text", "text": request.system, "cache_control": {"type": "ephemeral"}}
            ]
        if request.temperature is not None:
            # Newer SDKs (2.x) dropped the `temperature` argument; the API field is sent as is
            # through extra_body, which every SDK version accepts. Leave temperature None for
            # models that no longer take it.
            kwargs["extra_body"] = {"temperature": request.temperature}
        toolbox = request.toolbox
        if toolbox is not None:
            kwargs["tools"] = [dict(t) for t in request.tools]
        rounds = request.max_tool_rounds
        calls: list[dict[str, Any]] = []
        totals = [0, 0, 0, 0]  # input, output, cache read, cache write
        while True:
            message = self._send(kwargs, request.max_tokens)
            usage = message.usage
            totals[0] += int(getattr(usage, "input_tokens", 0) or 0)
            totals[1] += int(getattr(usage, "output_tokens", 0) or 0)
            totals[2] += int(getattr(usage, "cache_read_input_tokens", 0) or 0)
            totals[3] += int(getattr(usage, "cache_creation_input_tokens", 0) or 0)
            uses = [b for b in message.content if getattr(b, "type", "") == "tool_use"]
            if toolbox is None or message.stop_reason != "tool_use" or not uses:
                break
            results = []
            for block in uses:
                arguments = dict(getattr(block, "input", None) or {})
                output = call_tool(toolbox, rounds, block.name, arguments, calls)
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": output})
            kwargs["messages"] = [
                *kwargs["messages"],
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in message.content],
                },
                {"role": "user", "content": results},
            ]
        text = "".join(
            getattr(block, "text", "")
            for block in message.content
            if getattr(block, "type", "") == "text"
        )
        model = str(getattr(message, "model", "") or self.model)
        return LLMResponse(
            text=text,
            stop_reason=str(message.stop_reason or "end_turn"),
            input_tokens=totals[0],
            output_tokens=totals[1],
            cost_usd=compute_cost(
                model,
                totals[0],
                totals[1],
                self.prices,
                cache_read=totals[2],
                cache_write=totals[3],
            ),
            model=model,
            request_hash=request.request_hash(),
            tool_calls=tuple(calls),
            cache_read_tokens=totals[2],
            cache_write_tokens=totals[3],
        )
