"""The Programmer Agent in a real search: MCTS, the sandboxed evaluator on the CPU, a
trajectory, and a replay of that trajectory without the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from scripted_backend import ScriptedBackend

from pytest_kernelpro.optimize.agents import ProgrammerAgent
from pytest_kernelpro.optimize.agents.llm import make_backend
from pytest_kernelpro.optimize.sandbox.evaluator import KernelBenchTask, SandboxEvaluator
from pytest_kernelpro.optimize.search import MCTS, MCTSConfig

pytest.importorskip("torch")
DATA = Path(__file__).parents[2] / "data" / "agents"
REFERENCE = (DATA / "reference.py").read_text()
REPLY = (DATA / "reply_two_candidates.md").read_text()
# A short timing budget: the claims are about the search, its statuses and the replay, not the
# speedups' precision (the default budget times each kernel for 2 s, each sample behind a
# flush of the whole last-level cache).
FAST = {
    "timing": {
        "warmup_ms": 1.0,
        "max_time_s": 0.02,
        "min_samples": 5,
        "max_samples": 10,
        "flush_l2": False,
    },
    "cpu_threads": 1,
}


def _agent(backend) -> ProgrammerAgent:
    return ProgrammerAgent(
        backend, problem_source=REFERENCE, language="pytorch", device_name="cpu", n_candidates=2
    )


@pytest.mark.slow
def test_search_with_sandbox_evaluator_and_replay(tmp_path: Path) -> None:
    evaluator = SandboxEvaluator(
        KernelBenchTask(reference=REFERENCE, name="relu_linear", device="cpu", **FAST)
    )
    backend = ScriptedBackend(lambda request: REPLY)
    live = MCTS(MCTSConfig(candidates_per_expansion=2), seed=0).run(
        _agent(backend), evaluator, "2", trajectory=tmp_path / "live.jsonl"
    )
    assert live.evaluations == 2
    assert [n.evaluation.status for n in live.nodes] == ["correct", "correct"]
    assert all(n.evaluation.speedup > 0 for n in live.nodes)
    assert [n.candidate.strategy for n in live.nodes] == [
        "fused addmm + relu in one expression",
        "in-place clamp after the linear layer",
    ]
    assert "CPU (no CUDA GPU)" in backend.requests[0].system
    replayed = MCTS(MCTSConfig(candidates_per_expansion=2), seed=0).run(
        _agent(make_backend(f"replay:{tmp_path / 'live.jsonl'}")),
        evaluator,
        "2",
        trajectory=tmp_path / "replay.jsonl",
    )
    assert [n.candidate.code for n in replayed.nodes] == [n.candidate.code for n in live.nodes]
    assert [n.evaluation.status for n in replayed.nodes] == ["correct", "correct"]
