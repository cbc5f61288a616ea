"""The OpenAI-compatible backend through the real `openai` SDK against a loopback server."""

from __future__ import annotations

import pytest
from fake_openai_api import ChatReply, running_fake_chat_api
from lookup_toolbox import BUDGET_SPENT, LookupBox, budget_request

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.agents.llm import LLMError, LLMRequest, make_backend
from pytest_kernelpro.optimize.agents.llm.base import require_price
from pytest_kernelpro.optimize.agents.programmer import ProgrammerAgent

pytest.importorskip("openai")

PRICES = {"qwen3-coder-30b": [0.0, 0.0]}  # a self-hosted model: free, but priced
GOOD = "### Strategy: fused relu\n```python\nimport torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x)\n```\n"


@pytest.fixture(autouse=True)
def no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def test_chat_completion_request_and_response() -> None:
    with running_fake_chat_api([ChatReply("hello back")]) as api:
        backend = make_backend("openai", model="qwen3-coder-30b", base_url=api.url, prices=PRICES)
        response = backend.complete(LLMRequest.single("be brief", "hello", 256, temperature=0.2))
    body = api.requests[0]["body"]
    assert api.requests[0]["path"] == "/v1/chat/completions"
    assert body["model"] == "qwen3-coder-30b"
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
    ]
    assert body["max_tokens"] == 256
    assert body["temperature"] == 0.2
    assert api.requests[0]["auth"] == "Bearer not-needed"  # a local server needs no key
    assert response.text == "hello back"
    assert response.stop_reason == "end_turn"
    assert (response.input_tokens, response.output_tokens) == (120, 40)
    assert response.model == "qwen3-coder-30b"


def test_length_is_truncation_and_the_programmer_recovers() -> None:
    replies = [ChatReply("cut", "length"), ChatReply(GOOD)]
    with running_fake_chat_api(replies) as api:
        backend = make_backend("openai", model="qwen3-coder-30b", base_url=api.url, prices=PRICES)
        agent = ProgrammerAgent(
            backend, problem_source="class Model: ...", language="pytorch", device_name=None,
            n_candidates=1, max_tokens=500,
        )  # fmt: skip
        out = agent.generate("initial", None, None)
    assert [r["body"]["max_tokens"] for r in api.requests] == [500, 1000]
    assert out[0].strategy == "fused relu"


def test_tool_calls_run_in_a_loop() -> None:
    box = LookupBox()
    replies = [ChatReply(tool_calls=[("lookup", {"q": "42"})]), ChatReply("done")]
    with running_fake_chat_api(replies) as api:
        backend = make_backend("openai", model="qwen3-coder-30b", base_url=api.url, prices=PRICES)
        request = LLMRequest(
            "sys", ({"role": "user", "content": "go"},), 100, meta={"toolbox": box},
            tools=tuple(box.specs()),
        )  # fmt: skip
        response = backend.complete(request)
    assert api.requests[0]["body"]["tools"][0]["function"]["name"] == "lookup"
    tool_message = api.requests[1]["body"]["messages"][-1]
    assert tool_message == {"role": "tool", "tool_call_id": "call_1_0", "content": "lookup says 42"}
    assert response.text == "done"
    assert response.tool_calls[0]["output"] == "lookup says 42"
    assert response.input_tokens == 240


def test_tool_calls_past_the_budget_are_refused_and_recorded() -> None:
    """With `max_tool_rounds=1` the second call is not run: the model is told to answer now."""
    box = LookupBox()
    replies = [
        ChatReply(tool_calls=[("lookup", {"q": "1"})]),
        ChatReply(tool_calls=[("lookup", {"q": "2"})]),
        ChatReply("done"),
    ]
    with running_fake_chat_api(replies) as api:
        backend = make_backend("openai", model="qwen3-coder-30b", base_url=api.url, prices=PRICES)
        response = backend.complete(budget_request(box, rounds=1))
    assert box.ran == ["1"]
    assert [c["output"] for c in response.tool_calls] == ["lookup says 1", BUDGET_SPENT]
    assert api.requests[2]["body"]["messages"][-1]["content"] == BUDGET_SPENT
    assert response.text == "done"


def test_errors_are_clear() -> None:
    with running_fake_chat_api([]) as api:
        backend = make_backend(
            "openai", model="qwen3-coder-30b", base_url=api.url, max_retries=0, prices=PRICES
        )
        with pytest.raises(LLMError, match=r"HTTP 500.*model 'qwen3-coder-30b', endpoint http"):
            backend.complete(LLMRequest.single("", "hi", 10))
    with pytest.raises(LLMError, match="needs a model name"):
        make_backend("openai", model="")


def test_a_spend_budget_refuses_an_unpriced_model_before_any_call() -> None:
    with pytest.raises(KernelproConfigError, match="'qwen3-coder-30b' has no price"):
        require_price("qwen3-coder-30b", where="--kernelpro-optimize=5usd")
    assert require_price("claude-sonnet-5-5", where="x").input_per_mtok > 0
