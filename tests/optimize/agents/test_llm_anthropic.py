"""The Anthropic backend through the real `anthropic` SDK against a loopback Messages API."""

from __future__ import annotations

import json
import re
import warnings

import pytest
from fake_messages_api import Reply, running_fake_api
from lookup_toolbox import BUDGET_SPENT, LookupBox, budget_request

from pytest_kernelpro.errors import KernelproWarning
from pytest_kernelpro.optimize.agents.llm import LLMError, LLMRequest, make_backend
from pytest_kernelpro.optimize.agents.llm.anthropic_backend import API_KEY_ENV, AnthropicBackend
from pytest_kernelpro.optimize.agents.llm.model_api import find_price
from pytest_kernelpro.optimize.agents.programmer import ProgrammerAgent

anthropic = pytest.importorskip("anthropic")

KEY = "sk-ant-test-k3y-0123456789abcdef"
GOOD = """### Strategy: fused relu
```python
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x)
```
"""


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(API_KEY_ENV, KEY)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    return KEY


def test_request_body_header_and_response(api_key: str) -> None:
    with running_fake_api([Reply("hello back", output_tokens=7, input_tokens=11)]) as api:
        backend = AnthropicBackend("claude-sonnet-5-5", base_url=api.url, max_retries=0)
        request = LLMRequest.single("be brief", "hello", 512, temperature=0.2)
        response = backend.complete(request)
    body = api.requests[0]["body"]
    assert api.requests[0]["path"] == "/v1/messages"
    assert body["model"] == "claude-sonnet-5-5"
    assert body["max_tokens"] == 512
    assert body["messages"] == [{"role": "user", "content": "hello"}]
    # The system prompt is the stable part of every call: sent as a cached block.
    assert body["system"] == [
        {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["temperature"] == 0.2
    assert "stream" not in body or body["stream"] is False
    # Older SDKs send the key as `x-api-key`; anthropic 2.x sends `Authorization: Bearer`.
    sent = api.headers[0]
    assert sent.get("x-api-key") == api_key or sent.get("authorization") == f"Bearer {api_key}"
    assert response.text == "hello back"
    assert response.stop_reason == "end_turn"
    assert (response.input_tokens, response.output_tokens) == (11, 7)
    # The server reports the dated model id; it is priced as claude-sonnet-5-5 ($2 / $10).
    assert response.model == "claude-sonnet-5-5-20260915"
    assert response.cost_usd == pytest.approx((11 * 2.0 + 7 * 10.0) / 1e6)
    assert response.request_hash == request.request_hash()
    for text in (repr(backend), str(backend), repr(backend._key), str(vars(backend))):
        assert api_key not in text


def test_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with pytest.raises(LLMError, match=API_KEY_ENV):
        AnthropicBackend()
    with pytest.raises(LLMError, match=API_KEY_ENV):
        make_backend("anthropic")


def test_api_error_never_shows_the_key(api_key: str) -> None:
    # A hostile or buggy endpoint echoes the key back in its error message.
    reply = Reply("", status=401, error_message=f"invalid x-api-key {api_key}")
    with running_fake_api([reply]) as api:
        backend = AnthropicBackend(base_url=api.url, max_retries=0)
        with pytest.raises(LLMError) as info:
            backend.complete(LLMRequest.single("", "hi", 16))
    message = str(info.value)
    assert "HTTP 401" in message
    assert "invalid x-api-key ***" in message
    assert api_key not in message
    assert api_key not in repr(info.value)
    # Raised outside the SDK's except block: no chained exception carries the request.
    assert info.value.__cause__ is None
    assert info.value.__context__ is None


def test_tool_calls_past_the_budget_are_refused_and_recorded(api_key: str) -> None:
    """With `max_tool_rounds=1` the second call is not run: the model is told to answer now."""
    box = LookupBox()
    replies = [
        Reply("", tool_uses=[("lookup", {"q": "1"})]),
        Reply("", tool_uses=[("lookup", {"q": "2"})]),
        Reply("done"),
    ]
    with running_fake_api(replies) as api:
        backend = make_backend("anthropic", model="claude-sonnet-5-5", base_url=api.url)
        response = backend.complete(budget_request(box, rounds=1))
    assert box.ran == ["1"]
    assert [c["output"] for c in response.tool_calls] == ["lookup says 1", BUDGET_SPENT]
    result = api.requests[2]["body"]["messages"][-1]["content"][0]
    assert (result["type"], result["content"]) == ("tool_result", BUDGET_SPENT)
    assert response.text == "done"


def test_long_requests_stream(api_key: str) -> None:
    text = "x" * 300 + " end"
    with running_fake_api([Reply(text, stop_reason="max_tokens", output_tokens=4000)]) as api:
        backend = AnthropicBackend(base_url=api.url, max_retries=0, stream_threshold=1000)
        response = backend.complete(LLMRequest.single("", "long please", 4000))
    assert api.requests[0]["body"]["stream"] is True
    assert api.requests[0]["body"]["max_tokens"] == 4000
    assert response.text == text
    assert response.truncated
    assert response.output_tokens == 4000


def _sdk_deprecated_model() -> str:
    """A model the installed SDK itself warns about, priced where one is (each SDK release
    moves models onto and off its list: a fixed name breaks on a fresh install)."""
    from anthropic.resources import messages

    deprecated = sorted(getattr(messages, "DEPRECATED_MODELS", {}) or {})
    if not deprecated:
        pytest.skip(f"anthropic {anthropic.__version__} lists no deprecated models")
    priced = [m for m in deprecated if find_price(m) is not None]
    return (priced or deprecated)[0]


def test_sdk_model_deprecation_becomes_one_kernelpro_warning(api_key: str) -> None:
    model = _sdk_deprecated_model()
    with running_fake_api([Reply("a"), Reply("b")]) as api:
        api.model = model
        backend = AnthropicBackend(model, base_url=api.url, max_retries=0)
        with pytest.warns(KernelproWarning, match=f"{re.escape(model)}' is deprecated") as first:
            backend.complete(LLMRequest.single("", "one", 8))
        with warnings.catch_warnings(record=True) as second:
            warnings.simplefilter("always")
            backend.complete(LLMRequest.single("", "two", 8))
    assert len([w for w in first if "deprecated" in str(w.message)]) == 1
    assert second == []  # told once per model


def test_base_url_from_environment(api_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_fake_api([Reply("ok")]) as api:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
        backend = make_backend("anthropic", max_retries=0)
        assert backend.complete(LLMRequest.single("", "hi", 8)).text == "ok"
    assert len(api.requests) == 1


def test_unpriced_model_warns_and_costs_nothing(api_key: str) -> None:
    with running_fake_api([Reply("ok")]) as api:
        api.model = "claude-experimental-zz"
        backend = AnthropicBackend("claude-experimental-zz", base_url=api.url, max_retries=0)
        with pytest.warns(
            KernelproWarning, match="no price known for model 'claude-experimental-zz'"
        ):
            response = backend.complete(LLMRequest.single("", "hi", 8))
    assert response.cost_usd == 0.0


def test_truncation_recovery_doubles_then_restarts_concisely(api_key: str) -> None:
    replies = [
        Reply("### Strategy: cut off\n```python\nimport torch\n", "max_tokens", 1000),
        Reply("### Strategy: cut off again\n```python\nimport torch\n", "max_tokens", 2000),
        Reply(GOOD, "end_turn", 300),
    ]
    with running_fake_api(replies) as api:
        backend = AnthropicBackend(base_url=api.url, max_retries=0)
        agent = ProgrammerAgent(
            backend,
            problem_source="class Model: ...",
            language="pytorch",
            device_name="NVIDIA H200",
            n_candidates=1,
            max_tokens=1000,
        )
        candidates = agent.generate("initial", None, None, max_candidates=1)
    bodies = [r["body"] for r in api.requests]
    assert [b["max_tokens"] for b in bodies] == [1000, 2000, 2000]
    directive = "Start over and be concise"
    contents = [b["messages"][0]["content"] for b in bodies]
    # The problem's stable head is a cached block, the node's part follows uncached.
    assert all(c[0]["cache_control"] == {"type": "ephemeral"} for c in contents)
    assert all("cache_control" not in c[1] for c in contents)
    prompts = ["".join(block["text"] for block in c) for c in contents]
    assert "class Model: ..." in contents[0][0]["text"]
    assert "## Task" in contents[0][1]["text"]
    assert directive not in prompts[0]
    assert directive not in prompts[1]
    assert directive in prompts[2]
    assert prompts[0] == prompts[1]  # Phase A: same prompt, bigger budget
    assert len(candidates) == 1
    assert "torch.relu" in candidates[0].code
    assert candidates[0].meta["phase"] == "B"
    assert candidates[0].strategy == "fused relu"
    # Every call is paid for by the candidate: 3 x 100 input + 1000 + 2000 + 300 output.
    assert candidates[0].tokens == 300 + 3300
    assert candidates[0].cost_usd == pytest.approx((300 * 2 + 3300 * 10) / 1e6)
    calls = candidates[0].meta["llm_calls"]
    assert [c["response"]["stop_reason"] for c in calls] == ["max_tokens", "max_tokens", "end_turn"]
    assert len({c["request_hash"] for c in calls}) == 3  # budget and directive change the request


def test_recordings_and_candidates_never_hold_the_key(api_key: str, tmp_path) -> None:
    with running_fake_api([Reply(GOOD, output_tokens=40)]) as api:
        backend = make_backend(
            "anthropic", base_url=api.url, max_retries=0, record_to=tmp_path / "calls.jsonl"
        )
        agent = ProgrammerAgent(
            backend,
            problem_source="class Model: ...",
            language="cuda",
            device_name="NVIDIA H100 SXM",
        )
        candidates = agent.generate("initial", None, None)
    assert len(candidates) == 1
    assert api_key not in (tmp_path / "calls.jsonl").read_text()
    assert api_key not in json.dumps([c.to_dict() for c in candidates]) + repr(agent)
