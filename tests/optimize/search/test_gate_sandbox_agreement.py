"""The gate and the optimizer's sandbox decide one output alike.

The same (output, reference, dtype) goes to the gate's check (`check_correctness`), to the
sandbox worker's whole pipeline (`harness.run_task`, in process: trials, in-place refill,
second shape, timing, the check after timing) and to the trusted judge (`judge.judge` on the
saved outputs). Before the sandbox took its tolerances from `measure/`, bf16 had rtol 1.6e-2
in the gate and 1e-2 in the sandbox, and only the gate relaxed fp32 for TF32 matmuls: the
bf16 case below (relative error 1.5625e-2) passed the gate and failed the search.

The reference adds a constant to an all-zeros input, so its output is exactly the constant in
the dtype, and the candidate returns another constant: the error is known to the bit. The
TF32 case has a real fp32 matmul as the reference (identity @ b); on this CPU its "TF32
tensor cores" are simulated by letting the CPU count as a tensor-core device and the flags
read as TF32 (the GPU test at the end does it for real).

Since issue 27 the first call re-runs the reference in float64 (float32 for half types) and
the kernel must be within 8x the reference's own error of that truth, plus two roundings of
the output's dtype (`measure/output_rule.py`). These references are exact, so a candidate may be
off by at most two roundings: the first table. The dtype tolerances still decide where no
truth can run; the `no_truth` tests force that (the truth's time budget set below zero) and
keep the old table, the TF32 relaxation included.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelpro.measure import (  # noqa: E402
    correctness_check,
    fp32_precision,
    fp32_tensor_cores,
    output_rule,
)
from pytest_kernelpro.measure.correctness_check import check_correctness  # noqa: E402
from pytest_kernelpro.optimize.sandbox import judge  # noqa: E402
from pytest_kernelpro.optimize.sandbox.harness import run_task  # noqa: E402

TIMING = {"warmup_ms": 0.0, "max_time_s": 0.01, "min_samples": 1, "max_samples": 5}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

ADD_REFERENCE = """
import torch
class Model(torch.nn.Module):
    def forward(self, x):
        return x + torch.tensor({ref!r}, dtype=x.dtype)
def get_inputs():
    return [torch.zeros(64, dtype=torch.{dtype})]
def get_init_inputs():
    return []
"""
MATMUL_REFERENCE = """
import torch
class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b
def get_inputs():
    return [torch.eye(8), torch.full((8, 8), {ref!r})]
def get_init_inputs():
    return []
"""
CANDIDATE = """
import torch
class ModelNew(torch.nn.Module):
    def forward(self, x, *rest):
        # A constant of the reference output's shape and dtype (a new tensor each call).
        like = rest[-1] if rest else x
        return torch.full(like.shape, {out!r}, dtype=like.dtype, device=like.device)
"""


def gate_passes(reference_src: str, out: float, device: str = "cpu") -> bool:
    """The gate's verdict: `check_correctness` on the reference module's own functions."""
    module: dict[str, Any] = {}
    exec(compile(reference_src, "<agreement-reference>", "exec"), module)
    model = module["Model"]()

    def kernel(x: Any, *rest: Any) -> Any:
        like = rest[-1] if rest else x
        return torch.full(like.shape, out, dtype=like.dtype, device=like.device)

    def inputs(seed: int) -> tuple[Any, ...]:
        return tuple(t.to(device) for t in module["get_inputs"]())

    return check_correctness(kernel, model, inputs, device=device, trials=1).passed


def task_for(reference_src: str, device: str = "cpu") -> dict[str, Any]:
    return {
        "reference": reference_src,
        "device": device,
        "seed": 42,
        "correct_trials": 1,
        "timing": TIMING,
        "cpu_threads": 1,
    }


def sandbox_verdicts(
    reference_src: str, out: float, tmp_path: Path, device: str = "cpu"
) -> tuple[str, bool]:
    """(the worker's status, the judge's ok) for a candidate returning `out`."""
    task = task_for(reference_src, device)
    try:
        worker = run_task({**task, "candidate": CANDIDATE.format(out=out)}, lambda phase: None)
    finally:
        for name in ("kernelpro_reference", "kernelpro_candidate"):
            sys.modules.pop(name, None)
    module: dict[str, Any] = {}
    exec(compile(reference_src, "<agreement-reference>", "exec"), module)
    like = module["get_inputs"]()[-1]
    outputs = {
        name: [torch.full(like.shape, out, dtype=like.dtype)]
        for name, _seed in judge.required_outputs(task)
    }
    try:
        verdict = judge.judge(task, outputs)
    finally:
        sys.modules.pop("kernelpro_reference", None)
    return str(worker["status"]), bool(verdict["ok"])


def _assert_agree(reference_src: str, out: float, expected: bool, tmp_path: Path) -> None:
    gate = gate_passes(reference_src, out)
    status, judged = sandbox_verdicts(reference_src, out, tmp_path)
    assert gate is expected, f"gate says {gate}"
    assert status == ("correct" if expected else "wrong"), f"worker says {status}"
    assert judged is expected, f"judge says {judged}"


@pytest.fixture
def no_truth(monkeypatch: pytest.MonkeyPatch) -> None:
    """No higher-precision re-run fits the time budget: the dtype tolerances decide."""
    monkeypatch.setattr(correctness_check, "TIME_BUDGET_S", -1.0)


@pytest.mark.parametrize(
    ("dtype", "ref", "out", "expected"),
    [
        # The reference is exact: two roundings at 64 are 2 * 2^-24 * 64 = 2^-17, one ulp.
        ("float32", 64.0, 64.0 + 2**-17, True),
        ("float32", 64.0, 64.0 + 2**-16, False),
        ("float32", 64.0, 64.005, False),  # the dtype default (rtol 1e-4) passed this
        ("bfloat16", 64.0, 64.5, True),  # one bf16 ulp at 64
        ("bfloat16", 64.0, 65.0, False),  # the dtype default passed this
        ("float16", 64.0, 64.0625, True),  # one fp16 ulp at 64
        ("float16", 64.0, 64.5, False),  # the dtype default passed this
    ],
)
def test_gate_worker_and_judge_agree_against_the_truth(
    dtype: str, ref: float, out: float, expected: bool, tmp_path: Path
) -> None:
    src = ADD_REFERENCE.format(ref=ref, dtype=dtype)
    _assert_agree(src, out, expected, tmp_path)


@pytest.mark.parametrize(
    ("dtype", "ref", "out", "expected"),
    [
        ("float32", 64.0, 64.005, True),  # |err| 5e-3 <= 1e-4 + 1e-4 * 64
        ("float32", 64.0, 64.01, False),
        # bf16: 65 is 64 * (1 + 1.5625e-2), exact in bf16. Gate (rtol 1.6e-2): pass. The
        # sandbox's old own table (rtol 1e-2) failed it: the case that used to differ.
        ("bfloat16", 64.0, 65.0, True),
        ("bfloat16", 64.0, 66.0, False),  # 3.1%: beyond both
        ("float16", 64.0, 64.5, True),  # 7.8e-3 within fp16's 1e-2
        ("float16", 64.0, 65.0, False),
    ],
)
def test_gate_worker_and_judge_agree_by_dtype_without_a_truth(
    no_truth: None, dtype: str, ref: float, out: float, expected: bool, tmp_path: Path
) -> None:
    src = ADD_REFERENCE.format(ref=ref, dtype=dtype)
    _assert_agree(src, out, expected, tmp_path)


def test_the_bf16_case_is_one_the_old_sandbox_table_rejected() -> None:
    """The bf16 pass above is not vacuous: under the (atol, rtol) = (1e-2, 1e-2) the sandbox
    had for bf16, |65 - 64| = 1 exceeds 1e-2 + 1e-2 * 64; under the gate's it does not."""
    err = float(torch.tensor(65.0, dtype=torch.bfloat16) - torch.tensor(64.0, dtype=torch.bfloat16))
    assert err == 1.0
    assert err > 1e-2 + 1e-2 * 64
    gate = output_rule.default_tolerance(torch.bfloat16)
    assert err <= gate.atol + gate.rtol * 64


@pytest.fixture
def simulated_tf32(monkeypatch: pytest.MonkeyPatch) -> None:
    """This CPU counts as a tensor-core device whose fp32 matmuls run in TF32."""
    monkeypatch.setattr(fp32_precision, "TENSOR_CORE_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(
        fp32_tensor_cores,
        "fp32_reduced_mode",
        lambda torch, op: "tf32" if op == "matmul" else None,
    )


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        (64.5, True),  # 7.8e-3 relative: inside TF32's 1e-2, far outside fp32's 1e-4
        (66.0, False),  # 3.1%: beyond TF32's tolerance too
    ],
)
def test_gate_worker_and_judge_agree_on_tf32_matmul(
    no_truth: None, simulated_tf32: None, out: float, expected: bool, tmp_path: Path
) -> None:
    _assert_agree(MATMUL_REFERENCE.format(ref=64.0), out, expected, tmp_path)


def test_without_tf32_the_matmul_case_fails_everywhere(no_truth: None, tmp_path: Path) -> None:
    """The TF32 pass above comes from the detection: with fp32 matmuls in fp32 (this CPU as
    it is), the same output fails the gate, the worker and the judge."""
    _assert_agree(MATMUL_REFERENCE.format(ref=64.0), 64.5, False, tmp_path)


def test_with_a_truth_tf32_allowed_keeps_the_tf32_tolerance(
    simulated_tf32: None, tmp_path: Path
) -> None:
    """identity @ full(64) is exact even in TF32, but a reference whose fp32 matmuls may run
    in TF32 may be that inexact on another call (on the H200 the check's deterministic mode
    alone made cuDNN pick another algorithm for the same convolution): with TF32 detected, the
    TF32 tolerance accepts next to the truth's rule, alike everywhere."""
    _assert_agree(MATMUL_REFERENCE.format(ref=64.0), 64.5, True, tmp_path)
    _assert_agree(MATMUL_REFERENCE.format(ref=64.0), 66.0, False, tmp_path)


@pytest.mark.gpu
def test_gate_and_sandbox_agree_on_a_real_tf32_matmul(no_truth: None, tmp_path: Path) -> None:
    matmul = torch.backends.cuda.matmul
    if getattr(matmul, "fp32_precision", "none") not in ("none", "ieee"):
        pytest.skip("this process set the new fp32_precision API")
    previous = matmul.allow_tf32
    matmul.allow_tf32 = True
    try:
        src = MATMUL_REFERENCE.format(ref=64.0)
        gate = gate_passes(src, 64.5, device="cuda")
        status, judged = sandbox_verdicts(src, 64.5, tmp_path, device="cuda")
    finally:
        matmul.allow_tf32 = previous
    assert (gate, status, judged) == (True, "correct", True)
