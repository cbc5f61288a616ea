"""The Programmer Agent end to end: modes, feedback ablation, accounting, recovery, replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scripted_backend import ScriptedBackend

from pytest_kernelpro.errors import KernelproWarning
from pytest_kernelpro.optimize.agents import ProfilingAgent, ProgrammerAgent
from pytest_kernelpro.optimize.agents.llm import LLMRequest, RecordingBackend, make_backend
from pytest_kernelpro.optimize.search import (
    MCTS,
    Candidate,
    CandidateGenerator,
    Evaluation,
    MCTSConfig,
)

DATA = Path(__file__).parents[2] / "data" / "agents"
REFERENCE = (DATA / "reference.py").read_text()
REPLY = (DATA / "reply_two_candidates.md").read_text()
GUIDANCE = (
    "## Automated Bottleneck Analysis\n\n### Findings (by severity)\n\n"
    "#### 1. [CRITICAL] GEMM runs on CUDA cores\n**Root cause:** 0 HMMA in SASS\n"
)
ANALYSIS = json.dumps({
    "bottleneck": "tensor-core-underuse", "severity": "critical", "summary": "No MMA.",
    "recommendations": [{"priority": 1, "action": "use mma.sync m16n8k16", "expected_gain": "4x"}],
})  # fmt: skip


def module(marker: str) -> str:
    return f"import torch\n# {marker}\nclass ModelNew(torch.nn.Module):\n    pass\n"


def reply(*markers: str) -> str:
    return "\n".join(f"### Strategy: {m}\n```python\n{module(m)}```\n" for m in markers)


def agent(backend, **options) -> ProgrammerAgent:
    options = {"language": "pytorch", "device_name": "NVIDIA H200", "n_candidates": 2,
               "max_tokens": 4000, "cutlass": "off", **options}  # fmt: skip
    return ProgrammerAgent(backend, problem_source=REFERENCE, **options)


PARENT = Candidate(code=module("parent"), strategy="parent")
CORRECT = Evaluation(
    status="correct",
    speedup=1.5,
    metrics={"guidance_md": GUIDANCE, "ncu": {"sm__throughput.avg.pct": 42.5, "label": "x"},
             "ref_median_s": 3e-3, "candidate_median_s": 2e-3},
)  # fmt: skip


def test_is_a_candidate_generator() -> None:
    assert isinstance(agent(ScriptedBackend([])), CandidateGenerator)


def test_initial_mode_candidates_and_accounting() -> None:
    backend = ScriptedBackend([REPLY])
    out = agent(backend, n_candidates=3).generate("initial", None, None, max_candidates=2)
    request = backend.requests[0]
    assert "Return exactly 2 candidate solution(s)" in request.messages[0].content
    assert "wgmma.mma_async m64nNk16" in request.system
    assert request.max_tokens == 4000
    assert [c.strategy for c in out] == [
        "fused addmm + relu in one expression",
        "in-place clamp after the linear layer",
    ]
    assert out[0].prompt_id == request.meta["prompt_id"]
    assert out[0].prompt_id.startswith("initial.pytorch@")
    response_tokens = len(REPLY) // 4 + len(request.system + request.messages[0].content) // 4
    assert sum(c.tokens for c in out) == response_tokens
    assert abs(out[0].tokens - out[1].tokens) <= 1
    assert out[0].cost_usd == out[1].cost_usd > 0
    assert out[0].meta["mode"] == "initial"
    assert out[0].meta["phase"] == "initial"
    assert len(out[0].meta["llm_calls"]) == 1
    assert "llm_calls" not in out[1].meta


def test_debug_mode_shows_the_failure() -> None:
    backend = ScriptedBackend([reply("fixed")])
    failed = Evaluation(status="build_error", reason="nvcc failed",
                        build_log="kernel.cu(12): error: identifier \"tid\" is undefined")  # fmt: skip
    out = agent(backend).generate("debug", PARENT, failed, max_candidates=1)
    prompt = backend.requests[0].messages[0].content
    assert "## Task: fix this solution" in prompt
    assert "It did not build: nvcc failed." in prompt
    assert 'identifier "tid" is undefined' in prompt
    assert "# parent" in prompt
    assert [c.strategy for c in out] == ["fixed"]
    assert out[0].meta["mode"] == "debug"


def test_optimize_with_tools_feedback_and_profiling_agent() -> None:
    backend = ScriptedBackend([ANALYSIS, reply("mma"), reply("mma2")])
    programmer = agent(backend, profiling_agent=ProfilingAgent(backend))
    out = programmer.generate("optimize", PARENT, CORRECT, max_candidates=1)
    profiling, programming = backend.requests[0], backend.requests[1]
    assert profiling.meta["purpose"] == "profiling"
    assert GUIDANCE.strip() in profiling.messages[0].content
    prompt = programming.messages[0].content
    assert "Its speedup over the reference is 1.5x (reference 3 ms, this 2 ms)." in prompt
    assert "## Profiling analysis\nBottleneck: **tensor-core-underuse**" in prompt
    # The seed's order: the profile first, the Profiling Agent's synthesis of it after.
    assert prompt.index("## Automated Bottleneck Analysis") < prompt.index("## Profiling analysis")
    assert "sm__throughput" not in prompt  # raw counters are not given in tools mode
    assert [c["purpose"] for c in out[0].meta["llm_calls"]] == ["profiling", "programmer"]
    # The same guidance again: the analysis is cached, no second profiling call.
    programmer.generate("optimize", PARENT, CORRECT, max_candidates=1)
    assert [r.meta["purpose"] for r in backend.requests] == [
        "profiling",
        "programmer",
        "programmer",
    ]


@pytest.mark.parametrize("feedback", ["raw", "none"])
def test_optimize_feedback_ablation(feedback: str) -> None:
    backend = ScriptedBackend([reply("x")])
    programmer = agent(backend, feedback=feedback, profiling_agent=ProfilingAgent(backend))
    programmer.generate("optimize", PARENT, CORRECT, max_candidates=1)
    assert len(backend.requests) == 1  # no Profiling Agent call outside tools mode
    prompt = backend.requests[0].messages[0].content
    assert "Its speedup over the reference is 1.5x" in prompt
    assert "Automated Bottleneck Analysis" not in prompt
    assert "Profiling analysis" not in prompt
    if feedback == "raw":
        assert "## Profiler Metrics (raw)\nsm__throughput.avg.pct = 42.5" in prompt
        assert "label = x" not in prompt
    else:
        assert "Profiler Metrics" not in prompt
        assert "sm__throughput" not in prompt


def test_tools_feedback_falls_back_to_findings() -> None:
    backend = ScriptedBackend([reply("x")])
    evaluation = Evaluation(status="correct", speedup=0.8, findings=[
        {"severity": "low", "title": "minor", "message": "small thing"},
        {"tool": "spill", "severity": "critical", "title": "Register spills",
         "root_cause": "168 registers/thread", "recommendations": [
             {"action": "reduce live variables", "expected": "1.2-1.5x"}]},
    ])  # fmt: skip
    agent(backend).generate("optimize", PARENT, evaluation, max_candidates=1)
    prompt = backend.requests[0].messages[0].content
    assert "#### 1. [CRITICAL] Register spills" in prompt
    assert "1. reduce live variables - expected 1.2-1.5x" in prompt
    assert prompt.index("Register spills") < prompt.index("minor")


def test_truncated_three_times_fails_and_carries_the_cost() -> None:
    cut = ("### Strategy: long\n```python\nimport torch\n", "max_tokens")
    backend = ScriptedBackend([cut, cut, cut, reply("short")])
    programmer = agent(backend, n_candidates=1)
    with pytest.warns(KernelproWarning, match="produced no candidates: reply truncated"):
        assert programmer.generate("initial", None, None, max_candidates=1) == []
    assert [r.max_tokens for r in backend.requests] == [4000, 8000, 8000]
    failure = programmer.failures[0]
    assert failure.mode == "initial"
    assert failure.calls == 3
    assert "three times" in failure.reason
    out = programmer.generate("initial", None, None, max_candidates=1)
    # The failed calls are paid for by the next candidate.
    assert len(out[0].meta["llm_calls"]) == 4
    assert out[0].tokens > failure.tokens
    assert out[0].cost_usd > failure.cost_usd


def test_unparseable_reply_is_retried_once_with_the_error() -> None:
    backend = ScriptedBackend(["Sorry, here is my plan but no code.", reply("second try")])
    out = agent(backend, n_candidates=1).generate("initial", None, None, max_candidates=1)
    retry = backend.requests[1]
    assert [m.role for m in retry.messages] == ["user", "assistant", "user"]
    assert "Your reply could not be used: no candidate code" in retry.messages[2].content
    assert retry.meta["phase"] == "format-retry"
    assert out[0].strategy == "second try"
    garbage = ScriptedBackend(["no code", "still no code"])
    programmer = agent(garbage, n_candidates=1)
    with pytest.warns(KernelproWarning, match="unparseable reply"):
        assert programmer.generate("initial", None, None) == []


def test_constraint_violations_are_recorded() -> None:
    code = (
        "import torch\nsrc = r'''\nasm volatile(\"wgmma.mma_async.sync.aligned.m64n128k16"
        ".f32.bf16.bf16 ...\");\n'''\nclass ModelNew(torch.nn.Module):\n    pass\n"
    )
    backend = ScriptedBackend([f"### Strategy: raw wgmma\n```python\n{code}```\n"])
    out = agent(backend, n_candidates=1).generate("initial", None, None)
    violations = out[0].meta["constraint_violations"]
    assert any("[wgmma-fence]" in v and "warpgroup_arrive" in v for v in violations)


def _rules(request: LLMRequest) -> str:
    """Replies by mode: seeds are one wrong and one correct; repairs and refinements correct."""
    prompt = request.messages[-1].content
    if request.meta.get("purpose") == "profiling":
        return ANALYSIS
    if "## Task: fix this solution" in prompt:
        return reply("fixed speedup=1.2")
    if "## Task: make this correct solution faster" in prompt:
        return reply("faster speedup=2.0", "faster speedup=2.5")
    return reply("seed wrong", "seed speedup=1.1")


class MarkerEvaluator:
    """Deterministic evaluator: the code's marker comment decides status and speedup."""

    def evaluate(self, candidate: Candidate) -> Evaluation:
        marker = candidate.code.split("# ", 1)[1].split("\n", 1)[0]
        if "wrong" in marker:
            return Evaluation(status="wrong", reason="max abs error 0.5")
        speedup = float(marker.rsplit("speedup=", 1)[1])
        return Evaluation(status="correct", speedup=speedup,
                          metrics={"guidance_md": GUIDANCE})  # fmt: skip


def _search(generator, path: Path):
    search = MCTS(MCTSConfig(candidates_per_expansion=2), seed=3)
    return search.run(generator, MarkerEvaluator(), "6", trajectory=path)


def test_mcts_search_records_and_replays_from_the_trajectory(tmp_path: Path) -> None:
    recording = tmp_path / "calls.jsonl"
    backend = RecordingBackend(ScriptedBackend(_rules), recording)
    live = agent(backend, profiling_agent=ProfilingAgent(backend))
    first = _search(live, tmp_path / "live.jsonl")
    assert first.evaluations == 6
    assert first.best_speedup == 2.5
    assert first.usd > 0
    assert {n.mode for n in first.nodes} == {"initial", "optimize"}
    purposes = [json.loads(line)["purpose"] for line in recording.read_text().splitlines()]
    assert purposes.count("profiling") >= 1
    codes = [n.candidate.code for n in first.nodes]
    # Replay from the trajectory itself (llm_calls in node meta) and from the recording.
    for source in (tmp_path / "live.jsonl", recording):
        replay = make_backend(f"replay:{source}")
        replayed = agent(replay, profiling_agent=ProfilingAgent(replay))
        again = _search(replayed, tmp_path / f"replay-{source.stem}.jsonl")
        assert [n.candidate.code for n in again.nodes] == codes
        assert [n.candidate.prompt_id for n in again.nodes] == [
            n.candidate.prompt_id for n in first.nodes
        ]
        assert again.best_speedup == first.best_speedup
        assert again.usd == pytest.approx(first.usd)


def test_replay_of_a_different_run_stops_with_a_clear_error(tmp_path: Path) -> None:
    backend = RecordingBackend(ScriptedBackend(_rules), tmp_path / "calls.jsonl")
    _search(agent(backend, feedback="none"), tmp_path / "live.jsonl")
    # Another device means another prompt: nothing was recorded for it.
    other = agent(make_backend(f"replay:{tmp_path / 'live.jsonl'}"), device_name="NVIDIA L4")
    with pytest.warns(KernelproWarning, match="no recorded response for programmer request"):
        result = _search(other, tmp_path / "other.jsonl")
    assert result.evaluations == 0
    assert "generator raised LLMError" in result.stop_reason
