"""Model backends: one protocol (`LLMBackend`), the Anthropic API, OpenAI-compatible servers
and recorded replays.

Nothing here imports an SDK (`anthropic`, `openai`) at import time; a backend does when built.
"""

from __future__ import annotations

from pytest_kernelpro.optimize.agents.llm.factory import BACKEND_NAMES, make_backend
from pytest_kernelpro.optimize.agents.llm.model_api import (
    LLMBackend,
    LLMError,
    LLMRequest,
    LLMResponse,
    Message,
    ModelPrice,
    compute_cost,
    find_price,
)
from pytest_kernelpro.optimize.agents.llm.replay import RecordingBackend, ReplayBackend, call_record

__all__ = [
    "BACKEND_NAMES",
    "LLMBackend",
    "LLMError",
    "LLMRequest",
    "LLMResponse",
    "Message",
    "ModelPrice",
    "RecordingBackend",
    "ReplayBackend",
    "call_record",
    "compute_cost",
    "find_price",
    "make_backend",
]
