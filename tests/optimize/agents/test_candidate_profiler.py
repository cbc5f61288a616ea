"""The candidate profiler's child process on the CPU: it builds the candidate next to the
reference and reports, without raising, what a CPU cannot collect."""

from __future__ import annotations

import re

import pytest

from pytest_kernelpro.analysis import RooflineFacts
from pytest_kernelpro.optimize.candidate_profile.evaluator import (
    CandidateProfiler,
    ProfileFailed,
    ProfileRecord,
    ProfilingEvaluator,
)
from pytest_kernelpro.optimize.sandbox.isolation import Isolation
from pytest_kernelpro.optimize.search import Candidate, Evaluation

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


ISOLATION = Isolation.probe()
needs_namespaces = pytest.mark.skipif(
    not ISOLATION.isolated, reason=f"no Linux namespaces here: {ISOLATION.why}"
)


def _probing_candidate(outside: str) -> str:
    """A candidate that looks around from inside the profiler and says what it found."""
    return (
        "import os, socket\n"
        "def _try(fn):\n"
        "    try:\n"
        "        fn()\n"
        "        return 'allowed'\n"
        "    except OSError as exc:\n"
        "        return exc.strerror\n"
        f"_write = _try(lambda: open({outside!r}, 'w').write('escaped'))\n"
        "_net = _try(lambda: socket.create_connection(('1.1.1.1', 53), timeout=2))\n"
        "raise RuntimeError(f'PROBE pid={os.getpid()} write={_write} net={_net} '\n"
        "                   f\"key={os.environ.get('ANTHROPIC_API_KEY')}\")\n"
    )


@needs_namespaces
def test_the_candidate_is_profiled_inside_the_namespace_sandbox(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-never-in-the-child")
    outside = tmp_path / "escaped.txt"
    profiler = CandidateProfiler(REFERENCE, FACTS, device="cpu", timeout_s=120)
    with pytest.raises(ProfileFailed, match="PROBE") as failed:
        profiler(Candidate(code=_probing_candidate(str(outside))), Evaluation(status="correct"))
    message = str(failed.value)
    assert "pid=1 " in message  # its own PID namespace: no other process to read
    # The allow-list view (optimize/sandbox/view.py) hides /tmp, where tmp_path lives, so
    # the write now fails as "No such file or directory" (the path is not there to see)
    # rather than "Read-only file system" (a visible path bound read-only). Either way the
    # write was refused and nothing escaped (checked below).
    assert re.search(r"write=(Read-only file system|No such file or directory) ", message)
    assert "net=Network is unreachable" in message
    assert "key=None" in message
    assert not outside.exists()
    assert failed.value.isolation.startswith("namespaces")


@needs_namespaces
def test_a_profile_says_which_sandbox_ran_it(tmp_path):
    good = Evaluation(status="correct", speedup=1.0, metrics={"candidate_median_s": 2e-6})
    inside = CandidateProfiler(REFERENCE, FACTS, device="cpu", timeout_s=120)
    assert inside(Candidate(code=GOOD), good)["isolation"] == ISOLATION.describe()
    weaker = CandidateProfiler(REFERENCE, FACTS, device="cpu", timeout_s=120, isolation="fallback")
    assert weaker(Candidate(code=GOOD), good)["isolation"].startswith("fallback: ")


def test_the_profiling_evaluator_records_the_isolation_of_each_profile():
    class Correct:
        def evaluate(self, candidate):
            return Evaluation(status="correct", speedup=1.0)

    def profiler(candidate, evaluation):
        if candidate.strategy == "fails":
            raise ProfileFailed("no counters", isolation="fallback: requested")
        return {"isolation": "namespaces (pid, net)", "guidance_md": "x"}

    evaluator = ProfilingEvaluator(Correct(), profiler, feedback="tools")
    ok = evaluator.evaluate(Candidate(code="", strategy="works"))
    bad = evaluator.evaluate(Candidate(code="", strategy="fails"))
    assert ok.metrics["profile"]["isolation"] == "namespaces (pid, net)"
    assert bad.metrics["profile"]["isolation"] == "fallback: requested"
    assert [r.isolation for r in evaluator.records] == [
        "namespaces (pid, net)",
        "fallback: requested",
    ]
    assert evaluator.records[1] == ProfileRecord(
        "fails", evaluator.records[1].profile_s, False, error="no counters",
        isolation="fallback: requested",
    )  # fmt: skip
