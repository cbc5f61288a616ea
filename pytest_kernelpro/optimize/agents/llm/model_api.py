"""The model interface every agent talks to: one request type, one response type, one protocol.

A backend turns an `LLMRequest` (system prompt, messages, output-token limit, temperature)
into an `LLMResponse` (text, stop reason, token counts, cost, model). Backends: the Anthropic
Messages API (`anthropic_backend.py`), OpenAI-compatible chat completions
(`openai_backend.py`) and the replay of recorded responses (`replay.py`);
`make_backend` (in `factory.py`) picks one by name.

Costs come from `prices.yaml` (list prices per million tokens, with its source); a model that
is not in the table (a self-served one, usually) has its tokens counted and its cost not
(0, with a `KernelproWarning` saying so), and an API-spend budget refuses it before any call.
"""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

from pytest_kernelpro.errors import KernelproError, KernelproWarning
from pytest_kernelpro.text_safety import safe_text

Role = Literal["user", "assistant"]
PRICES_FILE = Path(__file__).with_name("prices.yaml")
# What may follow a priced model id: a release date, "-latest", or a cloud provider suffix.
_MODEL_SUFFIX = re.compile(r"^(?:-\d{8}|-latest|-v\d+(?::\d+)?|@\d{8})*$")


class LLMError(KernelproError):
    """A model call failed (network, API error, missing key, missing recording)."""


def api_failure(what: str, exc: BaseException, *, model: str, endpoint: str | None) -> str:
    """The text of an SDK failure as every backend reports it: what failed, the SDK's error
    class and HTTP status, its message, and the model and endpoint the call went to.
    Callers scrub the key out of it and raise `LLMError` outside the `except` block, so no
    exception context keeps the SDK request (and its headers) alive."""
    status = getattr(exc, "status_code", None)
    return (
        f"{what} ({type(exc).__name__}"
        + (f", HTTP {status}" if status else "")
        + f"): {exc} [model {model!r}, endpoint {endpoint or 'default'}]"
    )


@dataclass(frozen=True)
class Message:
    """One turn of the conversation."""

    role: Role
    content: str

    def __post_init__(self) -> None:
        if self.role not in ("user", "assistant"):
            raise KernelproError(f"message role {self.role!r} must be 'user' or 'assistant'")

    def to_dict(self) -> dict[str, str]:
        """{"role": ..., "content": ...} as the Messages API takes it."""
        return {"role": self.role, "content": self.content}


@runtime_checkable
class ToolBox(Protocol):
    """Tools a model may call while answering (the Messages API's tool use).

    `specs()` are JSON-schema descriptions in the Anthropic format (name, description,
    input_schema); `call` runs one call and returns its result as text (errors as text too:
    the model reads them and may try again)."""

    def specs(self) -> list[dict[str, Any]]:
        """The tools' descriptions."""
        ...

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        """The result of one call."""
        ...


@dataclass(frozen=True)
class LLMRequest:
    """One model call. `meta` (purpose, prompt id) travels with it but is not sent or hashed.

    `tools` (JSON specs) are sent and hashed; the `ToolBox` that answers them travels in
    `meta["toolbox"]`, and `meta["max_tool_rounds"]` caps the calls (default 8).
    """

    system: str
    messages: tuple[Message, ...]
    max_tokens: int
    temperature: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)
    tools: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        msgs = tuple(
            m if isinstance(m, Message) else Message(str(m["role"]), str(m["content"]))  # type: ignore[arg-type]
            for m in self.messages
        )
        # A prompt carries candidates' errors and output: never a secret or an escape
        # sequence to the model (text_safety), whoever built the request.
        msgs = tuple(Message(m.role, safe_text(m.content)) for m in msgs)
        object.__setattr__(self, "messages", msgs)
        object.__setattr__(self, "system", safe_text(self.system))
        if not msgs or msgs[0].role != "user":
            raise KernelproError("an LLM request needs at least one message, starting with 'user'")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise KernelproError(f"max_tokens={self.max_tokens!r} must be a positive integer")
        if self.temperature is not None and not 0.0 <= self.temperature <= 1.0:
            raise KernelproError(f"temperature={self.temperature!r} must be within [0, 1]")

    @classmethod
    def single(
        cls,
        system: str,
        user: str,
        max_tokens: int,
        temperature: float | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> LLMRequest:
        """A request with one user message."""
        return cls(system, (Message("user", user),), max_tokens, temperature, dict(meta or {}))

    def to_dict(self) -> dict[str, Any]:
        """What is sent (no model: the backend decides it), JSON-ready. `tools` only when
        there are any, so a request without tools hashes as it always did."""
        data: dict[str, Any] = {
            "system": self.system,
            "messages": [m.to_dict() for m in self.messages],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        if self.tools:
            data["tools"] = [dict(t) for t in self.tools]
        return data

    @property
    def toolbox(self) -> ToolBox | None:
        """The tools' handler, when the request offers tools."""
        box = self.meta.get("toolbox")
        return box if self.tools and box is not None else None

    @property
    def max_tool_rounds(self) -> int:
        """How many tool calls one reply may make (`meta["max_tool_rounds"]`, default 8)."""
        return int(self.meta.get("max_tool_rounds") or 8)

    def request_hash(self) -> str:
        """A stable 16-hex-digit hash of what is sent; the key of a recorded response.

        The model is left out on purpose: a recording replays whatever model option the
        replaying run was given.
        """
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]


def call_tool(
    toolbox: ToolBox,
    rounds: int,
    name: str,
    arguments: dict[str, Any],
    calls: list[dict[str, Any]],
) -> str:
    """One tool call of a reply, as every backend answers it: the toolbox's result, or, once
    `rounds` calls were made (the request's `max_tool_rounds`), an error telling the model
    to answer now; either way the call is appended to `calls` (the response's `tool_calls`)."""
    if len(calls) >= rounds:
        output = "error: the tool budget of this reply is spent; answer now."
    else:
        output = toolbox.call(name, arguments)
    calls.append({"name": name, "input": arguments, "output": output})
    return output


@dataclass(frozen=True)
class LLMResponse:
    """A model's reply and what it cost."""

    text: str
    stop_reason: str
    input_tokens: int
    output_tokens: int
    cost_usd: float
    model: str
    request_hash: str = ""
    # The tool calls made while answering: {"name", "input", "output"} each, in order.
    tool_calls: tuple[Mapping[str, Any], ...] = ()
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def truncated(self) -> bool:
        """True when the reply hit the output-token limit (stop reason "max_tokens")."""
        return self.stop_reason == "max_tokens"

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "text": self.text,
            "stop_reason": self.stop_reason,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost_usd": self.cost_usd,
            "model": self.model,
            "request_hash": self.request_hash,
            **({"tool_calls": [dict(c) for c in self.tool_calls]} if self.tool_calls else {}),
            **(
                {"cache_read_tokens": self.cache_read_tokens,
                 "cache_write_tokens": self.cache_write_tokens}
                if self.cache_read_tokens or self.cache_write_tokens else {}
            ),
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LLMResponse:
        """Inverse of `to_dict`; a missing `text` or `stop_reason` raises KernelproError."""
        try:
            return cls(
                text=str(data["text"]),
                stop_reason=str(data["stop_reason"]),
                input_tokens=int(data.get("input_tokens") or 0),
                output_tokens=int(data.get("output_tokens") or 0),
                cost_usd=float(data.get("cost_usd") or 0.0),
                model=str(data.get("model") or ""),
                request_hash=str(data.get("request_hash") or ""),
                tool_calls=tuple(dict(c) for c in data.get("tool_calls") or ()),
                cache_read_tokens=int(data.get("cache_read_tokens") or 0),
                cache_write_tokens=int(data.get("cache_write_tokens") or 0),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise KernelproError(
                f"recorded LLM response is malformed ({type(exc).__name__}: {exc}); it needs at "
                "least 'text' and 'stop_reason'"
            ) from None


@runtime_checkable
class LLMBackend(Protocol):
    """A language model: `complete` one request. Raises `LLMError` when the call fails."""

    name: str

    def complete(self, request: LLMRequest) -> LLMResponse:
        """Send `request` and return the reply."""
        ...


# ------------------------------------------------------------------------------- prices


@dataclass(frozen=True)
class ModelPrice:
    """US dollars per million input and output tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(
        self, input_tokens: int, output_tokens: int, cache_read: int = 0, cache_write: int = 0
    ) -> float:
        """Dollars for a call with these token counts. Prompt-cache reads cost 0.1x and
        5-minute cache writes 1.25x the input price (Anthropic's published multipliers)."""
        inputs = input_tokens + 0.1 * cache_read + 1.25 * cache_write
        return (inputs * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


def _as_price(model: str, value: Any, where: str) -> ModelPrice:
    if isinstance(value, ModelPrice):
        return value
    if (
        isinstance(value, Sequence)
        and len(value) == 2
        and all(isinstance(v, (int, float)) and v >= 0 for v in value)
    ):
        return ModelPrice(float(value[0]), float(value[1]))
    raise KernelproError(
        f"price of {model!r} in {where} is {value!r}; give [input, output] dollars per million "
        "tokens, e.g. [3.0, 15.0]"
    )


@lru_cache(maxsize=1)
def builtin_prices() -> dict[str, ModelPrice]:
    """The price table of `prices.yaml`."""
    import yaml

    data = yaml.safe_load(PRICES_FILE.read_text(encoding="utf-8")) or {}
    return {str(k): _as_price(str(k), v, str(PRICES_FILE)) for k, v in data.items()}


def find_price(
    model: str, prices: Mapping[str, ModelPrice | Sequence[float]] | None = None
) -> ModelPrice | None:
    """The price of `model`: `prices` first, then the built-in table; None if unknown.

    A key matches the model id exactly or followed only by a date/"-latest"/provider suffix,
    so "claude-sonnet-4-5-20250929" is priced as "claude-sonnet-4-5" but "claude-sonnet-4-6"
    is not priced as "claude-sonnet-4".
    """
    for table, where in ((prices or {}, "the prices option"), (builtin_prices(), "prices.yaml")):
        best: str | None = None
        for key in table:
            if model.startswith(key) and _MODEL_SUFFIX.match(model[len(key) :]):
                if best is None or len(key) > len(best):
                    best = key
        if best is not None:
            return _as_price(best, table[best], where)
    return None


_WARNED_UNPRICED: set[str] = set()


def compute_cost(
    model: str,
    input_tokens: int,
    output_tokens: int,
    prices: Mapping[str, ModelPrice | Sequence[float]] | None = None,
    *,
    cache_read: int = 0,
    cache_write: int = 0,
) -> float:
    """Dollar cost of a call; the cost of an unpriced model is not counted (0), said once per
    model (a search with an API-spend budget refuses it before any call: `require_price`)."""
    price = find_price(model, prices)
    if price is None:
        if model not in _WARNED_UNPRICED:
            _WARNED_UNPRICED.add(model)
            warnings.warn(
                f"no price known for model {model!r}: its cost is not counted (it shows as "
                "$0.00), its token counts are. To count it, set --kernelpro-llm-price=IN,OUT "
                "(dollars per million tokens).",
                KernelproWarning,
                stacklevel=3,
            )
        return 0.0
    return price.cost(input_tokens, output_tokens, cache_read, cache_write)


def require_price(
    model: str, prices: Mapping[str, ModelPrice | Sequence[float]] | None = None, *, where: str
) -> ModelPrice:
    """The price of `model`, or a `KernelproConfigError` saying an API-spend budget cannot be
    kept for it (raised before any call is made)."""
    price = find_price(model, prices)
    if price is None:
        from pytest_kernelpro.errors import KernelproConfigError

        raise KernelproConfigError(
            f"{where}: an API-spend budget was given but model {model!r} has no price, so "
            "its spend cannot be counted. Give its price with --kernelpro-llm-price=IN,OUT "
            "(dollars per million input and output tokens), or give a budget in evaluations or "
            "time instead."
        )
    return price
