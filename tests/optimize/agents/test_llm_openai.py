"""The OpenAI-compatible backend through the real `openai` SDK against a loopback server."""

from __future__ import annotations

import pytest
from fake_openai_api import ChatReply, running_fake_chat_api
from lookup_toolbox import BUDGET_SPENT, LookupBox, budget_request

from pytest_kernelpro.errors import KernelproConfigError, KernelproWarning
from pytest_kernelpro.optimize.agents.llm import LLMError, LLMRequest, make_backend
from pytest_kernelpro.optimize.agents.llm.model_api import compute_cost, require_price
from pytest_kernelpro.optimize.agents.llm.openai_backend import ModelListError, served_models
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


def test_the_model_list_is_what_the_server_serves() -> None:
    with running_fake_chat_api([], served=["qwen3-coder-30b", "llama-3.3-70b"]) as api:
        assert served_models(api.url) == ["qwen3-coder-30b", "llama-3.3-70b"]
    assert api.requests == [{"path": "/v1/models", "body": None, "auth": "Bearer not-needed"}]


@pytest.mark.parametrize(
    ("status", "fix"),
    [
        (500, r"answered HTTP 500 \(GET /v1/models fails here\); the server failed to list"),
        (404, r"answered HTTP 404 .*no such endpoint: check the base URL .*under /v1"),
        (401, r"answered HTTP 401 .*the server wants a key: set OPENAI_API_KEY"),
    ],
)
def test_a_model_list_the_server_refuses_names_the_url_status_and_fix(
    status: int, fix: str
) -> None:
    with running_fake_chat_api([], models_status=status) as api:
        with pytest.raises(ModelListError, match=rf"^GET {api.url}/models {fix}") as caught:
            served_models(api.url)
    assert caught.value.answered  # the server answered: a model named by hand may still do
    assert api.models_listed() == 1  # one request, no retry


def test_a_model_list_nobody_answers_says_start_the_server() -> None:
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(ModelListError, match=r"got no answer \(APIConnectionError: .*"
                       r"refused\); is the server running") as caught:  # fmt: skip
        served_models(url, timeout_s=5.0)
    assert not caught.value.answered


def test_an_unpriced_model_says_its_cost_is_not_counted_and_its_tokens_are(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_kernelpro.optimize.agents.llm import model_api as base

    monkeypatch.setattr(base, "_WARNED_UNPRICED", set())  # said once per model and process
    with pytest.warns(KernelproWarning) as caught:
        assert compute_cost("self-served-coder-7b", 100, 50) == 0.0
    text = str(caught[0].message)
    assert text.startswith("no price known for model 'self-served-coder-7b': its cost is not "
                           "counted (it shows as $0.00), its token counts are.")  # fmt: skip
    assert "API-spend" not in text  # no budget in dollars is involved unless one was given
    # The fix is a setting the user has, not an edit of the installed package's table.
    assert text.endswith("To count it, set --kernelpro-llm-price=IN,OUT (dollars per million "
                         "tokens).")  # fmt: skip
    # With the user's price (what `--kernelpro-llm-price` hands the backend) it is counted.
    priced = {"self-served-coder-7b": (2.0, 10.0)}
    assert compute_cost("self-served-coder-7b", 1_000_000, 500_000, priced) == pytest.approx(7.0)
