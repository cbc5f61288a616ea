"""Prompt parts, the PromptBuilder, GPU-aware injection and the reply parser."""

from __future__ import annotations

from pytest_kernelpro.optimize.agents.prompts.builder import (
    LANGUAGES,
    MODES,
    PARTS_DIR,
    Prompt,
    PromptBuilder,
    check_language,
    code_block,
)
from pytest_kernelpro.optimize.agents.prompts.gpu import GpuContext, gpu_context
from pytest_kernelpro.optimize.agents.prompts.parse import (
    CompletionParseError,
    ParsedCandidate,
    parse_multiple_completions,
)

__all__ = [
    "LANGUAGES",
    "MODES",
    "PARTS_DIR",
    "CompletionParseError",
    "GpuContext",
    "ParsedCandidate",
    "Prompt",
    "PromptBuilder",
    "check_language",
    "code_block",
    "gpu_context",
    "parse_multiple_completions",
]
