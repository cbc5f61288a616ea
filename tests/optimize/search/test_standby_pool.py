"""optimize/sandbox/pool.py and standby.py: worker and judge processes started ahead inside the
sandbox (torch imported), each handed one task; a fresh process for every candidate."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pytest_kernelpro.optimize.sandbox import standby
from pytest_kernelpro.optimize.sandbox.evaluator import (
    KernelBenchTask,
    SandboxEvaluator,
    SandboxLimits,
)
from pytest_kernelpro.optimize.search.interfaces import Candidate

REFERENCE = (
    "import torch\nfrom torch import nn\n\n\nclass Model(nn.Module):\n"
    "    def forward(self, x):\n        return x * 2\n\n\n"
    "def get_inputs():\n    return [torch.randn(64)]\n\n\ndef get_init_inputs():\n    return []\n"
)
CORRECT = REFERENCE.replace("class Model(", "class ModelNew(").replace("x * 2", "x + x")
# Leaves a mark in the process it runs in: a second candidate in the same process would see it.
MARKING = CORRECT.replace(
    "class ModelNew(",
    "import builtins\nif getattr(builtins, 'kernelpro_mark', False):\n"
    "    raise RuntimeError('ran in a process an earlier candidate used')\n"
    "builtins.kernelpro_mark = True\n\n\nclass ModelNew(",
)


def _evaluator(size: int) -> SandboxEvaluator:
    task = KernelBenchTask(
        reference=REFERENCE, device="cpu", timing={"max_time_s": 0.05, "warmup_ms": 1}
    )
    return SandboxEvaluator(task, SandboxLimits(standby=size))


@pytest.mark.slow
def test_worker_and_judge_run_in_processes_started_ahead_one_task_each() -> None:
    ev = _evaluator(1)
    try:
        ev.standbys.fill()
        waiting = [s.proc for s in ev.standbys._idle]
        assert len(waiting) == 2
        time.sleep(1.0)  # the model writing the candidate
        first = ev.evaluate(Candidate(code=MARKING))
        assert first.status == "correct", (first.reason, first.logs[-2000:])
        # The worker ran in a standby started before its task came, and the judge too.
        assert first.metrics["standby"]["started_before_s"] >= 1.0
        assert ev.standbys.used == 2
        assert first.correctness["verified_by"].startswith("judge")
        # Both used processes are gone; two new ones wait for the next candidate.
        assert all(proc.poll() is not None for proc in waiting)
        assert len(ev.standbys._idle) == 2
        # The attack: state one candidate left in its process must not meet the next one.
        second = ev.evaluate(Candidate(code=MARKING + "\n# another candidate\n"))
        assert second.status == "correct", second.reason
        assert ev.standbys.used == 4
        idle = [s.proc for s in ev.standbys._idle]
    finally:
        ev.close()
    assert all(proc.poll() is not None for proc in idle)  # close() ends the waiting ones
    assert ev.standbys._idle == []


@pytest.mark.slow
def test_no_standby_is_started_after_the_budgets_last_evaluation() -> None:
    ev = _evaluator(1)
    try:
        ev.standbys.fill()
        ev.last_evaluation()  # what the search says before the budget's last evaluation
        out = ev.evaluate(Candidate(code=CORRECT))
        assert out.status == "correct", out.reason
        assert (ev.standbys.started, ev.standbys.used) == (2, 2)  # no process left unused
        assert ev.standbys._idle == []
    finally:
        ev.close()


@pytest.mark.slow
def test_a_hanging_candidate_in_a_standby_is_killed_on_the_run_timeout() -> None:
    task = KernelBenchTask(reference=REFERENCE, device="cpu", timing={"max_time_s": 0.05})
    ev = SandboxEvaluator(task, SandboxLimits(standby=1, run_timeout_s=3.0))
    hang = CORRECT.replace("return x + x", "import time\n        time.sleep(3600)")
    try:
        ev.standbys.fill()
        out = ev.evaluate(Candidate(code=hang))
    finally:
        ev.close()
    assert out.status == "timeout", out.reason
    assert "3s run timeout" in (out.reason or "")
    assert "standby" in out.metrics


def test_a_standby_refuses_an_order_for_any_other_module(tmp_path: Path) -> None:
    """The order names the entry point; only the worker and the judge may be run."""
    (tmp_path / "order.json").write_text(json.dumps({"module": "os", "argv": []}))
    code = standby.main(
        ["--order", str(tmp_path / "order.json"), "--ready", str(tmp_path / "ready")]
    )
    assert code == 2
    assert (tmp_path / "ready").is_file()
