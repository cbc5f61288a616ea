"""`make_backend(name, **options)`: the model backend an option string names."""

from __future__ import annotations

import os
from typing import Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.optimize.agents.llm.model_api import LLMBackend

BACKEND_NAMES = ("anthropic", "openai", "replay:PATH")


def make_backend(
    name: str, *, record_to: str | os.PathLike[str] | None = None, **options: Any
) -> LLMBackend:
    """The backend for `name`: "anthropic", "openai" (any OpenAI-compatible server: vLLM,
    SGLang, Ollama) or "replay:PATH".

    `options` go to the backend's constructor (for "anthropic": model, base_url, timeout_s,
    max_retries, stream_threshold, prices; for "openai": model, base_url, timeout_s,
    max_retries, prices). `record_to` wraps the backend in a
    `RecordingBackend` that appends every call to that JSONL file, for a later replay.
    """
    text = (name or "").strip()
    backend: LLMBackend
    if text == "anthropic":
        from pytest_kernelpro.optimize.agents.llm.anthropic_backend import AnthropicBackend

        backend = AnthropicBackend(**options)
    elif text == "openai":
        from pytest_kernelpro.optimize.agents.llm.openai_backend import OpenAICompatibleBackend

        backend = OpenAICompatibleBackend(**options)
    elif text.startswith("replay:"):
        path = text.removeprefix("replay:").strip()
        if not path:
            raise KernelproConfigError(
                f"LLM backend {name!r} names no file; use replay:PATH with a recording or "
                "trajectory file"
            )
        if options:
            raise KernelproConfigError(
                f"LLM backend {name!r} takes no options (got {sorted(options)}); the replay "
                "serves what was recorded"
            )
        from pytest_kernelpro.optimize.agents.llm.replay import ReplayBackend

        backend = ReplayBackend(path)
    else:
        raise KernelproConfigError(
            f"Unknown LLM backend {name!r}; use one of: {', '.join(BACKEND_NAMES)}"
        )
    if record_to is not None:
        from pytest_kernelpro.optimize.agents.llm.replay import RecordingBackend

        backend = RecordingBackend(backend, record_to)
    return backend
