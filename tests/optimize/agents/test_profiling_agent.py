"""The Profiling Agent: JSON parsing, the request it sends, rendering for the Programmer."""

from __future__ import annotations

import json

import pytest
from scripted_backend import ScriptedBackend

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.optimize.agents.profiling import (
    ProfileAnalysisError,
    ProfilingAgent,
    parse_profile_analysis,
)

ANALYSIS = {
    "bottleneck": "Tensor-Core-Underuse",
    "severity": "High",
    "summary": "The GEMM runs on FP32 CUDA cores; HMMA count is 0.",
    "recommendations": [
        {"priority": 2, "action": "Fuse the bias and ReLU epilogue", "expected_gain": "1.2x"},
        {"priority": 1, "action": "Use wgmma m64n128k16 bf16", "rationale": "0 HMMA/HGMMA",
         "expected_gain": "3-5x"},
        "Increase the tile to 128x128",
    ],
}  # fmt: skip
GUIDANCE = "## Automated Bottleneck Analysis\n#### 1. [CRITICAL] No tensor-core instructions\n"


def test_parse_plain_fenced_and_embedded_json() -> None:
    plain = parse_profile_analysis(json.dumps(ANALYSIS))
    assert plain.bottleneck == "tensor-core-underuse"
    assert plain.severity == "high"
    assert [r.priority for r in plain.recommendations] == [1, 2, 3]
    assert plain.recommendations[0].action == "Use wgmma m64n128k16 bf16"
    assert plain.recommendations[0].rationale == "0 HMMA/HGMMA"
    assert plain.recommendations[2].action == "Increase the tile to 128x128"
    fenced = parse_profile_analysis("Here you go:\n```json\n" + json.dumps(ANALYSIS) + "\n```\n")
    assert fenced == plain
    # Braces inside strings do not confuse the scan for the object.
    chatty = "Note {this}. " + json.dumps({**ANALYSIS, "summary": "a } b { c"}) + " Done."
    assert parse_profile_analysis(chatty).summary == "a } b { c"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("no json here", "no ProfileAnalysis JSON"),
        ('{"bottleneck": "compute", "severity": "urgent"}', "severity 'urgent' is not one of"),
        ('{"bottleneck": "", "severity": "low"}', "has no 'bottleneck'"),
        ('{"bottleneck": "x", "severity": "low", "recommendations": "do it"}', "must be a list"),
        ('{"bottleneck": "x", "severity": "low", ', "no ProfileAnalysis JSON"),
    ],
)
def test_unusable_replies_raise(text: str, message: str) -> None:
    with pytest.raises(ProfileAnalysisError, match=message):
        parse_profile_analysis(text)


def test_agent_call_and_render() -> None:
    backend = ScriptedBackend([json.dumps(ANALYSIS)])
    agent = ProfilingAgent(backend, max_tokens=1000)
    result = agent.analyze(
        GUIDANCE, reference_analysis="## Reference analysis\ncompute-bound", code="k()"
    )
    request = backend.requests[0]
    assert request.max_tokens == 1000
    assert request.temperature == 0.0
    assert request.meta["purpose"] == "profiling"
    assert "Reply with ONE JSON object" in request.system
    user = request.messages[0].content
    assert GUIDANCE.strip() in user
    assert "compute-bound" in user
    assert "k()" in user
    text = result.analysis.render()
    assert text.startswith(
        "## Profiling analysis\nBottleneck: **tensor-core-underuse** (severity high)"
    )
    assert "1. Use wgmma m64n128k16 bf16 (expected 3-5x) - 0 HMMA/HGMMA" in text
    assert result.analysis.to_dict()["recommendations"][0]["priority"] == 1
    with pytest.raises(KernelproError, match="non-empty guidance"):
        agent.analyze("  ")
