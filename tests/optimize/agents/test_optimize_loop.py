"""The closed loop on recorded H200 profiles: every correct candidate profiled, the real tools'
guidance in the next optimize prompt, the three feedback modes, reactive tool use and the
CUTLASS tools through the real SDK against a loopback Messages API."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_messages_api import Reply, running_fake_api
from scripted_backend import ScriptedBackend, search_rules, strategy_reply

from pytest_kernelpro.analysis import RooflineFacts, analyze_report, report_from_dict
from pytest_kernelpro.optimize.agents import ProfilingAgent, ProgrammerAgent
from pytest_kernelpro.optimize.candidate_profile.evaluator import ProfileFailed, ProfilingEvaluator
from pytest_kernelpro.optimize.search import MCTS, Candidate, Evaluation, MCTSConfig

# Three records of the example repository's --kernelpro-profile run on an H200 (see the
# folder's SOURCE.md): real ncu metrics, SASS, ptxas and kineto timeline.
RECORDS = (
    Path(__file__).parents[2] / "data" / "tools" / "h200-example-repo" / "profile_records.json"
)
REFERENCE = (Path(__file__).parents[2] / "data" / "agents" / "reference.py").read_text()
ANALYSIS = json.dumps(
    {"bottleneck": "occupancy", "severity": "high", "summary": "Tiny blocks.",
     "recommendations": [{"priority": 1, "action": "use 256-thread blocks"}]}
)  # fmt: skip


def _record(name: str) -> dict:
    return {r["name"]: r for r in json.loads(RECORDS.read_text())["records"]}[name]


def recorded_profiler(name: str):
    """A profiler that answers every candidate with the real tools run on a recorded H200
    profile (what CandidateProfiler returns on the GPU)."""
    record = _record(name)
    calls: list[str] = []

    def profile(candidate: Candidate, evaluation: Evaluation) -> dict:
        calls.append(candidate.code)
        facts = RooflineFacts.from_roofline(record["roofline"]).for_median(
            evaluation.metrics.get("candidate_median_s")
        )
        return analyze_report(report_from_dict(record["profile"]), facts).to_dict()

    profile.calls = calls  # type: ignore[attr-defined]
    return profile


class MarkerEvaluator:
    """The sandbox's stand-in: the marker decides status and speedup."""

    def evaluate(self, candidate: Candidate) -> Evaluation:
        marker = candidate.code.split("# ", 1)[1].split("\n", 1)[0]
        if "wrong" in marker:
            return Evaluation(
                status="wrong", reason="output 0 differs at (3, 7): got 0.5, expected 0.25"
            )
        speedup = float(marker.rsplit("speedup=", 1)[1])
        return Evaluation(
            status="correct",
            speedup=speedup,
            metrics={"ref_median_s": 1e-3, "candidate_median_s": 1e-3 / speedup},
        )


def _search(feedback: str, orchestration: str = "proactive"):
    backend = ScriptedBackend(search_rules(ANALYSIS, faster=["faster speedup=2.0"]))
    profiler = recorded_profiler("cuda_row_rms")
    agent = ProgrammerAgent(
        backend, problem_source=REFERENCE, language="cuda", device_name="NVIDIA H200",
        n_candidates=2, max_tokens=4000, cutlass="off", feedback=feedback,
        profiling_agent=ProfilingAgent(backend) if feedback == "tools" else None,
        orchestration=orchestration,
    )  # fmt: skip
    evaluator = ProfilingEvaluator(MarkerEvaluator(), profiler, feedback=feedback)
    MCTS(MCTSConfig(candidates_per_expansion=2), seed=3).run(agent, evaluator, "4")
    optimize = [r for r in backend.requests if r.meta.get("mode") == "optimize"]
    return optimize, profiler, evaluator, backend


def test_every_correct_candidate_is_profiled_and_the_tools_guidance_reaches_the_next_prompt():
    optimize, profiler, evaluator, backend = _search("tools")
    assert optimize, "the search reached optimize mode"
    assert len(profiler.calls) == sum(1 for r in evaluator.records if r.ok) >= 1
    assert all(r.profile_s >= 0 and r.findings > 0 for r in evaluator.records)
    prompt = optimize[0].messages[0].content
    # The seed's order: SASS, timeline, findings by severity, ncu metrics by category, then
    # the Profiling Agent's analysis.
    order = [
        "### SASS summary",
        "### Timeline summary",
        "### Findings (by severity)",
        "### ncu metrics by category",
        "## Profiling analysis",
    ]
    positions = [prompt.index(h) for h in order]
    assert positions == sorted(positions)
    # Findings of the real tools on the recorded H200 metrics of cuda_row_rms.
    assert "tool `occupancy`" in prompt
    assert "Launch configuration: blocks of 32 threads" in prompt
    assert "row_rms_kernel(const float *, float *, int, float)` (sm_90): 352 instructions" in prompt
    assert "Use the profile and its analysis that follow" in prompt
    profiling_calls = [r for r in backend.requests if r.meta.get("purpose") == "profiling"]
    assert "### Findings (by severity)" in profiling_calls[0].messages[0].content


def test_the_three_feedback_modes_give_different_prompts():
    tools, _, _, _ = _search("tools")
    raw, _, _, _ = _search("raw")
    none, profiler_none, _, _ = _search("none")
    t, r, n = (x[0].messages[0].content for x in (tools, raw, none))
    assert len({t, r, n}) == 3
    assert "## Profiler Metrics (raw)" in r
    assert "sm__throughput.avg.pct_of_peak_sustained_elapsed = 17.25%" in r
    # raw is the counters only: no interpretation, no SASS or timeline, no analysis.
    for absent in ("### Findings", "### SASS summary", "Root cause", "## Profiling analysis"):
        assert absent not in r
    assert "## Automated Bottleneck Analysis" not in n
    assert "## Profiler Metrics (raw)" not in n
    assert "No profile of it is given" in n
    assert profiler_none.calls == []  # "none" spends no GPU time on profiles


def test_a_failed_profile_keeps_the_candidate_and_says_why():
    def broken(candidate, evaluation):
        raise ProfileFailed("ncu ran past its 5 s limit")

    evaluator = ProfilingEvaluator(MarkerEvaluator(), broken)
    ev = evaluator.evaluate(Candidate(code="import torch\n# seed speedup=1.5\n"))
    assert ev.ok
    assert ev.metrics["profile"]["error"] == "ncu ran past its 5 s limit"
    assert not evaluator.records[0].ok


def test_reactive_orchestration_offers_the_tools_and_answers_a_call(monkeypatch):
    """Reactive: the prompt holds no guidance; the model calls run_profiling_tool through the
    Messages API's tool use and gets the real tool's finding back."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    from pytest_kernelpro.optimize.agents.llm.anthropic_backend import AnthropicBackend

    record = _record("cuda_row_rms")
    analysis = analyze_report(
        report_from_dict(record["profile"]), RooflineFacts.from_roofline(record["roofline"])
    )
    parent_eval = Evaluation(
        status="correct", speedup=1.1, metrics={"guidance_md": analysis.guidance_md}
    )
    parent = Candidate(code="import torch\n# parent\nclass ModelNew(torch.nn.Module):\n    pass\n")
    replies = [
        Reply("Let me check occupancy.", tool_uses=[("run_profiling_tool", {"name": "occupancy"})]),
        Reply(strategy_reply("bigger blocks")),
    ]
    with running_fake_api(replies) as api:
        backend = AnthropicBackend(base_url=api.url, max_retries=0)
        agent = ProgrammerAgent(
            backend, problem_source=REFERENCE, language="cuda", device_name="NVIDIA H200",
            n_candidates=1, max_tokens=2000, cutlass="off", orchestration="reactive",
        )  # fmt: skip
        out = agent.generate("optimize", parent, parent_eval)
    first, second = (r["body"] for r in api.requests)
    assert [t["name"] for t in first["tools"]] == ["run_profiling_tool", "get_profile_section"]
    text = "".join(b["text"] for b in first["messages"][0]["content"])
    assert "## Profiling tools (on request)" in text
    assert "### Findings (by severity)" not in text  # the model must ask
    result = second["messages"][-1]["content"][0]
    assert result["type"] == "tool_result"
    assert "Occupancy: achieved 44.8% of theoretical 50.0%" in result["content"]
    assert out[0].strategy == "bigger blocks"
    calls = out[0].meta["llm_calls"][0]["response"]["tool_calls"]
    assert calls[0]["name"] == "run_profiling_tool"


def test_a_cutlass_tool_call_is_answered_from_the_real_headers(monkeypatch):
    pytest.importorskip("cutlass_library")
    from pytest_kernelpro.optimize.agents.toolbox import CutlassToolbox
    from pytest_kernelpro.optimize.cutlass.locate import locate_cutlass

    if locate_cutlass().install is None:
        pytest.skip("no CUTLASS headers found")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-0123456789")
    from pytest_kernelpro.optimize.agents.llm.anthropic_backend import AnthropicBackend

    replies = [
        Reply("", tool_uses=[("read_cutlass_file", {"path": "include/cutlass/version.h", "end": 60})]),
        Reply("", tool_uses=[("search_cutlass", {"pattern": "struct MMA_64x64x16_F32BF16BF16_SS", "path": "include/cute/arch"})]),
        Reply(strategy_reply("wgmma tile")),
    ]  # fmt: skip
    with running_fake_api(replies) as api:
        backend = AnthropicBackend(base_url=api.url, max_retries=0)
        agent = ProgrammerAgent(
            backend, problem_source=REFERENCE, language="cuda", device_name="NVIDIA H200",
            n_candidates=1, max_tokens=2000, cutlass_tools=CutlassToolbox.find("sm_90a"),
        )  # fmt: skip
        out = agent.generate("initial", None, None)
    names = [t["name"] for t in api.requests[0]["body"]["tools"]]
    assert names == [
        "search_cutlass", "read_cutlass_file", "list_cutlass_directory", "check_smem_layout"
    ]  # fmt: skip
    version = api.requests[1]["body"]["messages"][-1]["content"][0]["content"]
    assert "#define CUTLASS_MAJOR" in version
    found = api.requests[2]["body"]["messages"][-1]["content"][0]["content"]
    assert "include/cute/arch/mma_sm90_gmma.hpp" in found
    assert out[0].strategy == "wgmma tile"
