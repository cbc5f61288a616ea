"""Golden Programmer prompts for the three modes: the reference as written, the current kernel
and its implementation module, the inputs, the weights rule, the ReferenceAnalysis, and for
optimize the parent's profile (real tools on a recorded H200 profile) and its analysis.

A change to a prompt shows up as a diff of `tests/data/agents/golden/*.md`; regenerate with
KERNELPRO_UPDATE_GOLDEN=1 and review it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import msgspec
import pytest
import torch
from scripted_backend import ScriptedBackend

from pytest_kernelpro.analysis import RooflineFacts, analyze_report, report_from_dict
from pytest_kernelpro.optimize.agents import ProfilingAgent, ProgrammerAgent
from pytest_kernelpro.optimize.agents.problem_context import build_context
from pytest_kernelpro.optimize.agents.prompt_reference import reference_summary
from pytest_kernelpro.optimize.search import Candidate, Evaluation
from pytest_kernelpro.record import RooflinePart

DATA = Path(__file__).parents[2] / "data" / "agents"
GOLDEN = DATA / "golden"
RECORDS = (
    Path(__file__).parents[2] / "data" / "tools" / "h200-example-repo" / "profile_records.json"
)
ANALYSIS = json.dumps(
    {"bottleneck": "occupancy", "severity": "high", "summary": "32-thread blocks.",
     "recommendations": [{"priority": 1, "action": "use 256-thread blocks", "expected_gain": "1.3x"}]}
)  # fmt: skip
ROOFLINE = {
    "device": "NVIDIA H200", "bound": "memory", "intensity": 0.375, "ridge": 13.6,
    "peak_name": "FP32 (CUDA cores)", "peak_flops": 6.7e13, "bandwidth_Bps": 4.9e12,
    "flops": 5.03e7, "min_bytes": 1.34e8, "roofline_time_s": 2.74e-5,
}  # fmt: skip
VALIDATION = {"cls": "memory", "confidence": "high", "theoretical": "memory",
              "measured": "memory", "sm_pct": 17.2, "memory_pct": 65.5}  # fmt: skip


@pytest.fixture(scope="module")
def agent() -> ProgrammerAgent:
    sys.path.insert(0, str(DATA))
    try:
        import golden_problem
    finally:
        sys.path.remove(str(DATA))
    torch.manual_seed(0)
    context = build_context(
        "RMSNorm",
        golden_problem.RMSNormReference,
        kernel=golden_problem.RMSNorm,
        inputs=(torch.randn(16384, 1024),),
        reference_module=golden_problem.RMSNormReference(),
        device="cuda",
        root=DATA,
    )
    backend = ScriptedBackend(lambda request: ANALYSIS)
    return ProgrammerAgent(
        backend,
        problem_source="(unused: problem_md is given)",
        problem_md=context.render(),
        language="pytorch",
        device_name="NVIDIA H200",
        n_candidates=2,
        cutlass="off",
        profiling_agent=ProfilingAgent(backend),
        reference_analysis=reference_summary(
            msgspec.convert(ROOFLINE, RooflinePart),
            reference_s=1.1e-4,
            current_s=9.0e-5,
            validation=VALIDATION,
        ),
    )


def _parent() -> Candidate:
    return Candidate(code=(DATA / "golden_problem.py").read_text(), strategy="the current kernel")


def _optimize_evaluation() -> Evaluation:
    record = {r["name"]: r for r in json.loads(RECORDS.read_text())["records"]}["cuda_row_rms"]
    analysis = analyze_report(
        report_from_dict(record["profile"]),
        RooflineFacts.from_roofline(record["roofline"], median_s=9.0e-5),
    )
    return Evaluation(
        status="correct",
        speedup=1.22,
        metrics={
            "guidance_md": analysis.guidance_md,
            "raw_guidance_md": analysis.raw_md,
            "ref_median_s": 1.1e-4,
            "candidate_median_s": 9.0e-5,
        },
    )


CASES = {
    "initial": lambda: ("initial", None, None),
    "debug": lambda: (
        "debug",
        _parent(),
        Evaluation(
            status="wrong",
            reason="wrong result (trial 1/3): output 0 differs at (3, 17): got 0.812, "
            "expected 0.794 (1024/16777216 elements beyond atol=1e-05, rtol=1e-05)",
            correctness={"trials": 1, "passed": 0, "weights": "copied by position and shape"},
        ),
    ),
    "optimize": lambda: ("optimize", _parent(), _optimize_evaluation()),
}


@pytest.mark.parametrize("mode", list(CASES))
def test_golden_prompt(agent: ProgrammerAgent, mode: str) -> None:
    m, parent, evaluation = CASES[mode]()
    prompt = agent.build_prompt(m, parent, evaluation, 2)
    text = f"<!-- system -->\n{prompt.system}\n<!-- user -->\n{prompt.user}"
    golden = GOLDEN / f"{mode}.md"
    if os.environ.get("KERNELPRO_UPDATE_GOLDEN") == "1":
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8"), f"{golden} differs; see the module doc"
    # What every prompt must carry, whatever the golden text says.
    for needle in (
        "class RMSNormReference(nn.Module):",  # the reference as written
        "golden_problem.RMSNorm, golden_problem.py:",  # the current kernel, where it lives
        "Implementation module `golden_impl`",  # the module it calls
        "`x`: tensor float32 (16384, 1024) on cpu, contiguous",  # the inputs actually used
        "`weight`: float32 (1024,)",  # the weights rule
        "## Reference analysis (Benchmarking Agent, NVIDIA H200)",
        "headroom at most 3.28x",
        "ncu validation of the class on the reference: measured memory",
        "wgmma",  # the device's instruction shapes
    ):
        assert needle in text, needle
    if mode == "debug":
        assert "got 0.812, expected 0.794" in text
    if mode == "optimize":
        assert "### Findings (by severity)" in text
        assert text.index("## Automated Bottleneck Analysis") < text.index("## Profiling analysis")
