"""The agents of the optimizer: Programmer (an LLM-backed `CandidateGenerator`), Profiling
(guidance -> ProfileAnalysis), Benchmarking (the reference's roofline as prompt text), the
PromptBuilder and its parts, and the model backends (`agents.llm`).

Importing this package does not import torch or the anthropic SDK.
"""

from __future__ import annotations

from pytest_kernelpro.optimize.agents.benchmarking import (
    BenchmarkingAgent,
    render_reference_analysis,
)
from pytest_kernelpro.optimize.agents.feedback import (
    FEEDBACK_MODES,
    render_failure,
    render_guidance,
)
from pytest_kernelpro.optimize.agents.llm import (
    LLMBackend,
    LLMError,
    LLMRequest,
    LLMResponse,
    RecordingBackend,
    ReplayBackend,
    make_backend,
)
from pytest_kernelpro.optimize.agents.profiling import (
    ProfileAnalysis,
    ProfileAnalysisError,
    ProfilingAgent,
    parse_profile_analysis,
)
from pytest_kernelpro.optimize.agents.programmer import GenerationFailure, ProgrammerAgent
from pytest_kernelpro.optimize.agents.prompts import (
    CompletionParseError,
    ParsedCandidate,
    Prompt,
    PromptBuilder,
    parse_multiple_completions,
)

__all__ = [
    "FEEDBACK_MODES",
    "BenchmarkingAgent",
    "CompletionParseError",
    "GenerationFailure",
    "LLMBackend",
    "LLMError",
    "LLMRequest",
    "LLMResponse",
    "ParsedCandidate",
    "ProfileAnalysis",
    "ProfileAnalysisError",
    "ProfilingAgent",
    "ProgrammerAgent",
    "Prompt",
    "PromptBuilder",
    "RecordingBackend",
    "ReplayBackend",
    "make_backend",
    "parse_multiple_completions",
    "parse_profile_analysis",
    "render_failure",
    "render_guidance",
    "render_reference_analysis",
]
