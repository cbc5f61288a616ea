"""The optimize preflight accepts each model backend the optimizer can build, and names the
fix for the ones it cannot; without a model, an OpenAI-compatible server (a loopback one,
through the real `openai` SDK) is asked which models it serves."""

from __future__ import annotations

import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_kernelpro.optimize.loop.preflight import PreflightError, check_backend, served_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "agents"))
from fake_openai_api import running_fake_chat_api  # noqa: E402

pytest.importorskip("openai")

MODEL_SETTINGS = (
    "--kernelpro-model=NAME, ini key kernelpro_model or environment variable KERNELPRO_MODEL"
)


@pytest.fixture(autouse=True)
def no_openai_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def _settings(
    llm: str, model: str | None = None, url: str | None = "http://127.0.0.1:9/v1"
) -> SimpleNamespace:
    """`model` None: the default model, as a session without --kernelpro-model has it."""
    return SimpleNamespace(
        optimize="2",
        dask=None,
        llm=llm,
        model=model or "claude-sonnet-5-5",
        llm_base_url=url,
        sources={
            "llm": "command line",
            "model": "default" if model is None else "command line",
            "llm_base_url": "command line --kernelpro-llm-base-url",
        },
    )


def test_openai_backend_with_a_model_name_passes() -> None:
    with running_fake_chat_api([], served=["qwen3-coder-30b"]) as api:
        check_backend(_settings("openai", "qwen3-coder-30b", url=api.url))
    assert api.models_listed() == 1  # asked once whether it answers, no tokens spent


def _unused_port_url() -> str:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def test_a_set_model_on_a_server_that_is_down_stops_the_session_before_any_work() -> None:
    """The search against a server nobody listens on used to run every kernel and end "no
    correct candidate", exit 0."""
    url = _unused_port_url()
    with pytest.raises(PreflightError) as caught:
        check_backend(_settings("openai", "qwen3-coder-30b", url=url))
    text = str(caught.value)
    assert text.startswith(
        f"the model server at {url} (command line --kernelpro-llm-base-url) for model "
        f"'qwen3-coder-30b' does not answer: GET {url}/models got no answer"
    )
    assert text.endswith("Start it, or correct the base URL")
    # Without the API check (reach_api=False) nothing is asked.
    check_backend(_settings("openai", "qwen3-coder-30b", url=url), reach_api=False)


def test_a_server_that_answers_with_an_http_error_is_up() -> None:
    with running_fake_chat_api([], models_status=404) as api:
        check_backend(_settings("openai", "qwen3-coder-30b", url=api.url))


def test_openai_backend_with_the_default_anthropic_model_names_the_option() -> None:
    with pytest.raises(PreflightError, match=r"needs the name of the model.*--kernelpro-model"):
        check_backend(_settings("openai"))
    with pytest.raises(PreflightError) as caught:  # no server to ask: says how to name one
        check_backend(_settings("openai", url=None))
    assert MODEL_SETTINGS in str(caught.value)
    assert "or set --kernelpro-llm-base-url to your server's URL" in str(caught.value)


def test_the_one_model_a_server_serves_is_taken_and_said() -> None:
    with running_fake_chat_api([], served=["qwen3-coder-30b"]) as api:
        served = served_model(_settings("openai", url=api.url))
    assert served is not None
    assert served.model == "qwen3-coder-30b"
    assert served.source == f"the only model {api.url} serves"
    assert served.line == (
        f"kernelpro: optimizing with model 'qwen3-coder-30b', the only model the server at "
        f"{api.url} serves (no --kernelpro-model set)"
    )
    assert api.models_listed() == 1


def test_a_server_serving_several_models_names_them_and_the_setting() -> None:
    with running_fake_chat_api([], served=["qwen3-coder-30b", "llama-3.3-70b"]) as api:
        with pytest.raises(PreflightError) as caught:
            served_model(_settings("openai", url=api.url))
    assert str(caught.value) == (
        f"no model is set for --kernelpro-llm=openai (set it with {MODEL_SETTINGS}), and the "
        f"server at {api.url} (command line --kernelpro-llm-base-url) serves 2 models: "
        "'qwen3-coder-30b', 'llama-3.3-70b'; choose one"
    )


def test_a_long_model_list_is_cut() -> None:
    served = [f"model-{i}" for i in range(30)]
    with running_fake_chat_api([], served=served) as api:
        with pytest.raises(
            PreflightError,
            match=r"serves 30 models: 'model-0', .*'model-11' and 18 more; choose one$",
        ):
            served_model(_settings("openai", url=api.url))


def test_a_server_serving_no_model_says_load_one() -> None:
    with running_fake_chat_api([], served=[]) as api:
        with pytest.raises(PreflightError, match=rf"lists no models at GET {api.url}/models; load"):
            served_model(_settings("openai", url=api.url))


@pytest.mark.parametrize("status", [500, 404])
def test_a_model_list_that_fails_names_the_url_the_failure_and_the_fix(status: int) -> None:
    with running_fake_chat_api([], models_status=status) as api:
        with pytest.raises(PreflightError) as caught:
            served_model(_settings("openai", url=api.url))
    text = str(caught.value)
    assert text.startswith(
        f"no model is set for --kernelpro-llm=openai (set it with {MODEL_SETTINGS}), and asking "
        f"the server at {api.url} (command line --kernelpro-llm-base-url) which models it "
        f"serves failed: GET {api.url}/models answered HTTP {status} (GET /v1/models fails here); "
    )
    assert text.endswith("; or set the model, and the server is not asked")


def test_a_server_that_is_down_says_start_it() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    with pytest.raises(PreflightError) as caught:
        served_model(_settings("openai", url=url))
    text = str(caught.value)
    assert f"asking the server at {url} (command line --kernelpro-llm-base-url)" in text
    assert f"GET {url}/models got no answer (APIConnectionError:" in text
    assert text.endswith(
        "is the server running and listening at that address? Start it, or correct the base URL"
    )


def test_the_base_url_may_come_from_openai_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    with running_fake_chat_api([], served=["a", "b"]) as api:
        monkeypatch.setenv("OPENAI_BASE_URL", api.url)
        with pytest.raises(
            PreflightError, match=r"\(environment variable OPENAI_BASE_URL\) serves 2"
        ):
            served_model(_settings("openai", url=None))


def test_the_server_is_not_asked_when_a_model_is_set_or_none_is_needed() -> None:
    with running_fake_chat_api([], served=["a", "b"]) as api:
        assert served_model(_settings("openai", "qwen3-coder-30b", url=api.url)) is None
        assert served_model(_settings("anthropic", url=api.url)) is None
        assert served_model(_settings("openai", url=None)) is None  # check_backend says why
    assert api.requests == []


def test_an_unknown_backend_lists_the_ones_there_are() -> None:
    with pytest.raises(PreflightError, match=r"'gemini'.*use anthropic, openai or replay:PATH"):
        check_backend(_settings("gemini"))


def test_a_model_the_server_just_listed_is_not_asked_for_again() -> None:
    with running_fake_chat_api([], served=["qwen3-coder-30b"]) as api:
        settings = _settings("openai", url=api.url)
        served = served_model(settings)
        assert served is not None
        settings.model = served.model
        settings.sources["model"] = served.source
        check_backend(settings)
    assert api.models_listed() == 1
