"""The Profiling Agent: one model call that turns the tools' guidance into a ProfileAnalysis.

The micro-profiling tools have already run (proactive orchestration: every tool of the
kernel's bottleneck class, `tools.guidance.generate_prompt_guidance`). This agent asks the
model to synthesize their Markdown into a bottleneck class, a severity and prioritized
recommendations, parsed from the JSON object of the reply, and renders that back as the
"Profiling analysis" section of the next Programmer prompt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.agents.llm.model_api import LLMBackend, LLMRequest, LLMResponse
from pytest_kernelpro.optimize.agents.llm.replay import code_hash, replay_key
from pytest_kernelpro.optimize.agents.prompts.builder import PromptBuilder, code_block

SEVERITIES = ("critical", "high", "medium", "low")
_JSON_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


class ProfileAnalysisError(KernelproError):
    """The Profiling Agent's reply holds no usable ProfileAnalysis JSON."""


@dataclass(frozen=True)
class AnalysisRecommendation:
    """One prioritized action (1 = do first)."""

    priority: int
    action: str
    rationale: str = ""
    expected_gain: str = ""


@dataclass(frozen=True)
class ProfileAnalysis:
    """Bottleneck, severity and prioritized recommendations for the next iteration."""

    bottleneck: str
    severity: str
    summary: str
    recommendations: tuple[AnalysisRecommendation, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "bottleneck": self.bottleneck,
            "severity": self.severity,
            "summary": self.summary,
            "recommendations": [vars(r).copy() for r in self.recommendations],
        }

    def render(self) -> str:
        """The Markdown section for the Programmer prompt."""
        lines = [
            "## Profiling analysis",
            f"Bottleneck: **{self.bottleneck}** (severity {self.severity}). {self.summary}".rstrip(),
        ]
        if self.recommendations:
            lines += ["", "Prioritized recommendations:"]
            for rec in self.recommendations:
                gain = f" (expected {rec.expected_gain})" if rec.expected_gain else ""
                why = f" - {rec.rationale}" if rec.rationale else ""
                lines.append(f"{rec.priority}. {rec.action}{gain}{why}")
        return "\n".join(lines) + "\n"


def _balanced_objects(text: str) -> list[str]:
    """Every top-level {...} span of `text`, braces inside JSON strings ignored."""
    spans, depth, start, in_string, escape = [], 0, -1, False, False
    for i, ch in enumerate(text):
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"' and depth > 0:
            in_string = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                spans.append(text[start : i + 1])
    return spans


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _from_mapping(data: Mapping[str, Any]) -> ProfileAnalysis:
    bottleneck = str(data.get("bottleneck") or "").strip().lower()
    if not bottleneck:
        raise ProfileAnalysisError("the analysis JSON has no 'bottleneck'")
    severity = str(data.get("severity") or "").strip().lower()
    if severity not in SEVERITIES:
        raise ProfileAnalysisError(
            f"severity {data.get('severity')!r} is not one of {', '.join(SEVERITIES)}"
        )
    raw_recs = data.get("recommendations") or []
    if not isinstance(raw_recs, list):
        raise ProfileAnalysisError("'recommendations' must be a list")
    recs = []
    for i, item in enumerate(raw_recs, 1):
        if isinstance(item, str) and item.strip():
            recs.append(AnalysisRecommendation(i, item.strip()))
        elif isinstance(item, Mapping) and str(item.get("action") or "").strip():
            recs.append(AnalysisRecommendation(
                _as_int(item.get("priority"), i),
                str(item["action"]).strip(),
                str(item.get("rationale") or "").strip(),
                str(item.get("expected_gain") or item.get("expected") or "").strip(),
            ))  # fmt: skip
    recs.sort(key=lambda r: r.priority)
    return ProfileAnalysis(
        bottleneck, severity, str(data.get("summary") or "").strip(), tuple(recs)
    )


def parse_profile_analysis(text: str) -> ProfileAnalysis:
    """The ProfileAnalysis in a reply: a ```json block, the whole reply, or the first
    balanced {...} object that has a "bottleneck". Raises ProfileAnalysisError otherwise."""
    candidates = [m.group(1) for m in _JSON_FENCE.finditer(text or "")]
    candidates.append((text or "").strip())
    candidates += _balanced_objects(text or "")
    problems: list[str] = []
    for chunk in candidates:
        try:
            data = json.loads(chunk)
        except ValueError:
            continue
        if isinstance(data, Mapping) and "bottleneck" in data:
            try:
                return _from_mapping(data)
            except ProfileAnalysisError as exc:
                problems.append(str(exc))
    excerpt = " ".join((text or "").split())[:160]
    detail = f" ({'; '.join(problems)})" if problems else ""
    raise ProfileAnalysisError(
        f"no ProfileAnalysis JSON object with 'bottleneck', 'severity' and 'recommendations' "
        f"in the Profiling Agent's reply{detail}. Reply began: {excerpt!r}"
    )


@dataclass
class AnalysisResult:
    """The analysis and the model call that produced it."""

    analysis: ProfileAnalysis
    request: LLMRequest
    response: LLMResponse


class ProfilingAgent:
    """Turns guidance Markdown into a ProfileAnalysis with one model call."""

    def __init__(
        self,
        backend: LLMBackend,
        builder: PromptBuilder | None = None,
        *,
        max_tokens: int = 2048,
        temperature: float | None = 0.0,
    ) -> None:
        self.backend = backend
        self.builder = builder or PromptBuilder()
        self.max_tokens = max_tokens
        self.temperature = temperature

    def request(
        self, guidance: str, *, reference_analysis: str | None = None, code: str | None = None
    ) -> LLMRequest:
        """The model request for `guidance` (with optional roofline text and kernel code)."""
        if not guidance.strip():
            raise KernelproError("the Profiling Agent needs non-empty guidance to analyze")
        parts = []
        if reference_analysis:
            parts.append(reference_analysis.rstrip())
        if code:
            parts += ["## Kernel under analysis", code_block(code)]
        parts += [guidance.rstrip(), "Reply with the JSON object only."]
        return LLMRequest.single(
            self.builder.part("profiling_system").rstrip(),
            "\n\n".join(parts) + "\n",
            self.max_tokens,
            self.temperature,
            # Keyed by the code analyzed, not the measured guidance (agents/llm/replay.py).
            meta={
                "purpose": "profiling",
                "replay_key": replay_key("profiling", code_hash(code), self.max_tokens),
            },
        )

    def analyze(
        self, guidance: str, *, reference_analysis: str | None = None, code: str | None = None
    ) -> AnalysisResult:
        """Call the model and parse its ProfileAnalysis (ProfileAnalysisError if unusable)."""
        request = self.request(guidance, reference_analysis=reference_analysis, code=code)
        response = self.backend.complete(request)
        return AnalysisResult(parse_profile_analysis(response.text), request, response)
