"""The optimize preflight accepts each model backend the optimizer can build, and names the
fix for the ones it cannot (no network: the OpenAI-compatible server is not asked here)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_kernelpro.optimize.loop.preflight import PreflightError, check_backend

pytest.importorskip("openai")


def _settings(llm: str, model: str | None = None) -> SimpleNamespace:
    """`model` None: the default model, as a session without --kernelpro-model has it."""
    return SimpleNamespace(
        optimize="2",
        dask=None,
        llm=llm,
        model=model or "claude-sonnet-5-5",
        llm_base_url="http://127.0.0.1:9/v1",
        sources={"llm": "command line", "model": "default" if model is None else "command line"},
    )


def test_openai_backend_with_a_model_name_passes() -> None:
    check_backend(_settings("openai", "qwen3-coder-30b"))


def test_openai_backend_with_the_default_anthropic_model_names_the_option() -> None:
    with pytest.raises(PreflightError, match=r"needs the name of the model.*--kernelpro-model"):
        check_backend(_settings("openai"))


def test_an_unknown_backend_lists_the_ones_there_are() -> None:
    with pytest.raises(PreflightError, match=r"'gemini'.*use anthropic, openai or replay:PATH"):
        check_backend(_settings("gemini"))
