"""The candidate profiler's child process on the CPU: it builds the candidate next to the
reference and reports, without raising, what a CPU cannot collect."""

from __future__ import annotations

import pytest

from pytest_kernelpro.analysis import RooflineFacts
from pytest_kernelpro.analysis.evaluator import CandidateProfiler, ProfileFailed
from pytest_kernelpro.search import Candidate, Evaluation

pytestmark = pytest.mark.slow

REFERENCE = """import torch
from torch import nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(1024)]


def get_init_inputs():
    return []
"""
GOOD = "class ModelNew(nn.Module):\n    def forward(self, x):\n        return x + x\n"
FACTS = RooflineFacts(bound="memory", min_bytes=8192.0, flops=1024.0, roofline_time_s=1e-6)


def test_child_profiles_and_says_what_the_cpu_lacks(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-never-in-the-child")
    profiler = CandidateProfiler(REFERENCE, FACTS, device="cpu", timeout_s=120)
    assert "ANTHROPIC_API_KEY" not in profiler.env
    evaluation = Evaluation(status="correct", speedup=1.0, metrics={"candidate_median_s": 2e-6})
    result = profiler(Candidate(code=GOOD), evaluation)
    missing = {n["what"]: n["why"] for n in result["profile"]["not_collected"]}
    assert "not a CUDA device" in missing["ncu"]
    assert result["stage1"]["theoretical"] == "memory"
    assert result["build_s"] >= 0
    assert result["raw_md"] == ""  # no counter collected, nothing for "raw"


def test_a_candidate_that_fails_to_build_is_a_profile_failure():
    profiler = CandidateProfiler(REFERENCE, FACTS, device="cpu", timeout_s=120)
    with pytest.raises(ProfileFailed, match="exited with 3: .*RuntimeError: no build"):
        profiler(Candidate(code="raise RuntimeError('no build')\n"), Evaluation(status="correct"))
