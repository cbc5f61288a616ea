"""The session's TF32 flags travel to the sandbox's fresh processes.

The gate relaxes an fp32 tolerance when the session's torch flags let the reference's fp32
matmuls/convs run in TF32 (a conftest setting `torch.backends.cuda.matmul.allow_tf32`). The
sandbox's worker, judge and re-measurement are fresh interpreters with torch's defaults, so
the evaluator reads the flags once in the parent and sends them with every task, and the child
sets them before its reference runs (`search.measurement.apply_session_precision`).

This CPU has no TF32 hardware: what is shown here is that the flag travels in the task and
decides which tolerance the child selects. The end-to-end case counts the CPU as a tensor-core
device (as `test_gate_sandbox_agreement.py` does) so that the reference's matmul is recorded;
the precision it then reads is the flag the task set, not a patched one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.errors import KernelproError  # noqa: E402
from pytest_kernelpro.measure import fp32_precision  # noqa: E402
from pytest_kernelpro.optimize.sandbox import measurement  # noqa: E402
from pytest_kernelpro.optimize.sandbox.evaluator import SandboxEvaluator  # noqa: E402
from pytest_kernelpro.optimize.sandbox.harness import run_task  # noqa: E402
from pytest_kernelpro.optimize.sandbox.task import KernelBenchTask, SandboxLimits  # noqa: E402

MATMUL_REFERENCE = """
import torch
class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.eye(8), torch.full((8, 8), 64.0)]
def get_init_inputs():
    return []
"""
# 64.5 where the reference gives 64: 7.8e-3 relative, inside TF32's 1e-2, outside fp32's 1e-4.
CANDIDATE = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, a, b):
        return torch.full(b.shape, 64.5, dtype=b.dtype, device=b.device)
"""
TIMING = {"warmup_ms": 0.0, "max_time_s": 0.01, "min_samples": 1, "max_samples": 5}


@pytest.fixture
def session_flags() -> Iterator[None]:
    """This process's TF32 flags, restored after the test (the tests below change them).

    Set and restored by hand, not with monkeypatch: torch serves these flags through
    `__getattr__`/`__setattr__` of module objects (`cuBLASModule`), not data descriptors, and
    pytest 9.2's monkeypatch undoes a setattr of such an attribute by deleting it from the
    object, which raises AttributeError there."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    saved = (matmul.allow_tf32, cudnn.allow_tf32)
    matmul.allow_tf32, cudnn.allow_tf32 = False, True
    try:
        yield
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = saved


def _payload() -> dict[str, Any]:
    evaluator = SandboxEvaluator(KernelBenchTask(reference=MATMUL_REFERENCE), SandboxLimits())
    return json.loads(json.dumps(evaluator._task_payload()))  # as the child reads it


def test_the_evaluator_sends_the_flags_the_session_set(session_flags: None) -> None:
    assert _payload()[measurement.PRECISION_KEY] == {"matmul": None, "conv": "tf32"}
    torch.backends.cuda.matmul.allow_tf32 = True  # what a conftest does
    torch.backends.cudnn.allow_tf32 = False
    assert _payload()[measurement.PRECISION_KEY] == {"matmul": "tf32", "conv": None}


CHILD = r"""
import json, sys
import torch
from pytest_kernelpro.measure.fp32_tensor_cores import reduced_precision_mode
from pytest_kernelpro.measure.output_rule import tolerance_rule
from pytest_kernelpro.optimize.sandbox.measurement import apply_session_precision

apply_session_precision(torch, json.loads(sys.argv[1]))
reduced = reduced_precision_mode(torch, ["mm"])  # a recorded fp32 matmul
print(json.dumps({
    "allow_tf32": torch.backends.cuda.matmul.allow_tf32,
    "reduced": reduced,
    "rtol": tolerance_rule(reduced=reduced)(torch.float32).rtol,
}))
"""


def _fresh_child(task: dict[str, Any]) -> dict[str, Any]:
    root = Path(__file__).resolve().parents[3]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(task)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_fresh_process_takes_the_flags_from_the_task() -> None:
    sent = _fresh_child({measurement.PRECISION_KEY: {"matmul": "tf32", "conv": "tf32"}})
    assert sent == {"allow_tf32": True, "reduced": "tf32", "rtol": 1e-2}
    # Without them the child keeps torch's defaults: fp32 matmuls in fp32, fp32's tolerance.
    assert _fresh_child({}) == {"allow_tf32": False, "reduced": None, "rtol": 1e-4}


def _worker_status(task_flags: dict[str, Any] | None) -> str:
    task = {
        "reference": MATMUL_REFERENCE,
        "candidate": CANDIDATE,
        "device": "cpu",
        "seed": 42,
        "correct_trials": 1,
        "timing": TIMING,
        "cpu_threads": 1,
        "shape_check": "off",
        **({measurement.PRECISION_KEY: task_flags} if task_flags is not None else {}),
    }
    try:
        return str(run_task(task, lambda phase: None)["status"])
    finally:
        for name in ("kernelpro_reference", "kernelpro_candidate"):
            sys.modules.pop(name, None)


def test_the_worker_relaxes_fp32_exactly_when_the_task_says_tf32(
    session_flags: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fp32_precision, "TENSOR_CORE_DEVICES", ("cuda", "cpu"))  # see the docstring
    assert _worker_status(None) == "wrong"  # this process's flags: fp32 matmuls in fp32
    assert _worker_status({"matmul": "tf32", "conv": "tf32"}) == "correct"
    assert _worker_status({"matmul": None, "conv": "tf32"}) == "wrong"


def test_a_bad_flag_in_the_task_is_a_clear_error(session_flags: None) -> None:
    with pytest.raises(KernelproError, match=r"'matmul'='fp8' is invalid.*tf32, bf16 or null"):
        measurement.apply_session_precision(torch, {measurement.PRECISION_KEY: {"matmul": "fp8"}})
    with pytest.raises(KernelproError, match="fp32_precision='tf32' is invalid"):
        measurement.apply_session_precision(torch, {measurement.PRECISION_KEY: "tf32"})
