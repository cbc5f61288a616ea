"""Replay keyed by what a request asks, not by the measured numbers in its prompt."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scripted_backend import ScriptedBackend, search_rules

from pytest_kernelpro.errors import KernelproWarning
from pytest_kernelpro.optimize.agents import ProfilingAgent, ProgrammerAgent
from pytest_kernelpro.optimize.agents.llm import (
    LLMRequest,
    LLMResponse,
    RecordingBackend,
    ReplayBackend,
)
from pytest_kernelpro.optimize.search import MCTS, Candidate, Evaluation, MCTSConfig

REFERENCE = (Path(__file__).parents[2] / "data" / "agents" / "reference.py").read_text()
ANALYSIS = json.dumps(
    {"bottleneck": "memory", "severity": "high", "summary": "DRAM bound.",
     "recommendations": [{"priority": 1, "action": "fuse the epilogue"}]}
)  # fmt: skip
RULES = search_rules(ANALYSIS, faster=["faster speedup=2.0", "faster speedup=2.5"])


@dataclass
class Capture:
    """Wraps a backend and keeps every request it was sent."""

    inner: object
    requests: list[LLMRequest] = field(default_factory=list)
    name: str = "capture"

    def complete(self, request: LLMRequest) -> LLMResponse:
        self.requests.append(request)
        return self.inner.complete(request)  # type: ignore[attr-defined]


class NoisyEvaluator:
    """The marker decides status and speedup; `noise` scales every measured number, as a
    second run on the same GPU does, without changing the order of the candidates."""

    def __init__(self, noise: float = 1.0) -> None:
        self.noise = noise

    def evaluate(self, candidate: Candidate) -> Evaluation:
        marker = candidate.code.split("# ", 1)[1].split("\n", 1)[0]
        if "wrong" in marker:
            return Evaluation(status="wrong", reason="max abs error 0.5")
        speedup = float(marker.rsplit("speedup=", 1)[1]) * self.noise
        median = 1e-3 / speedup
        guidance = (
            "## Automated Bottleneck Analysis\n\n#### 1. [HIGH] DRAM bound\n"
            f"**Evidence:** `dram__throughput` = {91.3 * self.noise:.4g}% (median {median:.6g} s)\n"
        )
        return Evaluation(
            status="correct",
            speedup=speedup,
            metrics={"guidance_md": guidance, "ref_median_s": 1e-3, "candidate_median_s": median},
        )


def _agent(backend) -> ProgrammerAgent:
    return ProgrammerAgent(
        backend, problem_source=REFERENCE, language="pytorch", device_name="NVIDIA H200",
        n_candidates=2, max_tokens=4000, cutlass="off", profiling_agent=ProfilingAgent(backend),
    )  # fmt: skip


def _search(backend, path: Path, noise: float = 1.0):
    search = MCTS(MCTSConfig(candidates_per_expansion=2), seed=3)
    return search.run(_agent(backend), NoisyEvaluator(noise), "6", trajectory=path)


def _record(tmp_path: Path) -> tuple[Path, Capture, object]:
    capture = Capture(RecordingBackend(ScriptedBackend(RULES), tmp_path / "calls.jsonl"))
    result = _search(capture, tmp_path / "live.jsonl")
    return tmp_path / "live.jsonl", capture, result


def _shape(result) -> list[tuple[int, int, str, str]]:
    return [(n.id, n.parent.id, n.mode, n.candidate.code) for n in result.nodes]


def test_same_measurements_replay_byte_for_byte(tmp_path: Path) -> None:
    trajectory, live, first = _record(tmp_path)
    assert any(r.meta.get("mode") == "optimize" for r in live.requests)
    replay = ReplayBackend(trajectory)
    capture = Capture(replay)
    again = _search(capture, tmp_path / "again.jsonl")
    assert [(r.system, r.messages, r.max_tokens) for r in capture.requests] == [
        (r.system, r.messages, r.max_tokens) for r in live.requests
    ]
    assert replay.divergent == 0
    assert _shape(again) == _shape(first)
    assert again.best.candidate.code == first.best.candidate.code


def test_timing_noise_does_not_derail_the_replay(tmp_path: Path) -> None:
    trajectory, live, first = _record(tmp_path)
    replay = ReplayBackend(trajectory)
    capture = Capture(replay)
    again = _search(capture, tmp_path / "noisy.jsonl", noise=0.93)
    # The optimize prompts carry other numbers, so their bytes differ ...
    live_opt = [r.messages for r in live.requests if r.meta.get("mode") == "optimize"]
    new_opt = [r.messages for r in capture.requests if r.meta.get("mode") == "optimize"]
    assert live_opt
    assert live_opt != new_opt
    assert replay.divergent > 0
    # ... and the search is the same.
    assert _shape(again) == _shape(first)
    assert again.best.candidate.code == first.best.candidate.code


def test_a_prompt_with_no_recorded_answer_names_the_node(tmp_path: Path) -> None:
    trajectory, _, _ = _record(tmp_path)
    replay = ReplayBackend(trajectory)
    search = MCTS(MCTSConfig(candidates_per_expansion=2), seed=3)
    with pytest.warns(KernelproWarning, match=r"at search node \d+ \(replay key \w+, \w+ mode"):
        # One evaluation more than was recorded: the search asks for a node never recorded.
        result = search.run(_agent(replay), NoisyEvaluator(), "12", trajectory=tmp_path / "x")
    assert "no recorded response" in result.stop_reason
    assert result.evaluations == 6
