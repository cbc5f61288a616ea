"""example_repo/replays/: the recordings are made from the hand-written candidates (never
stale) and each recorded reply parses into exactly that candidate."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kernelpro.optimize.agents.llm.replay import load_recorded_calls
from pytest_kernelpro.optimize.agents.prompts.parse import parse_multiple_completions
from pytest_kernelpro.optimize.loop.corpus import render

REPLAYS = Path(__file__).resolve().parents[2] / "example_repo" / "replays"
KERNELS = sorted(p.name for p in (REPLAYS / "candidates").iterdir() if p.is_dir())


def test_three_kernels_of_different_kinds() -> None:
    assert KERNELS == ["bias_gelu", "matmul", "softmax_rows"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_recording_is_made_from_the_candidates(kernel: str) -> None:
    recording = REPLAYS / f"{kernel}.jsonl"
    assert recording.read_text(encoding="utf-8") == render(REPLAYS / "candidates" / kernel), (
        "stale: run python -m pytest_kernelpro.optimize.loop.corpus example_repo/replays"
    )


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_recorded_reply_is_its_candidate(kernel: str) -> None:
    sources = sorted((REPLAYS / "candidates" / kernel).glob("*.py"))
    calls = [
        c for c in load_recorded_calls(REPLAYS / f"{kernel}.jsonl") if c["purpose"] == "programmer"
    ]
    assert len(calls) == len(sources) >= 4
    for call, source in zip(calls, sources, strict=True):
        (parsed,) = parse_multiple_completions(call["response"]["text"])
        assert parsed.code == source.read_text(encoding="utf-8")
        assert "class ModelNew" in parsed.code
        assert call["purpose"] == "programmer"


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_profiling_agent_has_a_reply_for_every_correct_candidate(kernel: str) -> None:
    """With --kernelpro-feedback=tools the Profiling Agent asks once per profiled candidate:
    the corpus answers as many as a search of its candidates can profile."""
    from pytest_kernelpro.optimize.agents.profiling import parse_profile_analysis

    calls = load_recorded_calls(REPLAYS / f"{kernel}.jsonl")
    analyses = [c for c in calls if c["purpose"] == "profiling"]
    programmer = [c for c in calls if c["purpose"] == "programmer"]
    assert len(analyses) == len(programmer)
    for call in analyses:
        analysis = parse_profile_analysis(call["response"]["text"])
        assert analysis.recommendations
