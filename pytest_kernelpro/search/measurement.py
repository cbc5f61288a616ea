"""What the sandbox measures, taken from the gate's stack (`measure/`, `problem/`).

The worker (`harness.py`, `worker.retime`) and the trusted judge (`judge.py`) both go through
these functions, so they and the gate decide one output alike:

- `make_inputs`: a KernelBench task's inputs for one seed, the gate's input factory for a
  KernelBench file (`problem.kernelbench.kernelbench_inputs` under `call_input_factory`);
- `run_reference`: the reference's output and, on its first call, the reduced precision its
  fp32 matmuls/convs may have run in (`measure.tolerance.run_recording_precision`);
- `verdict`: the comparison (`measure.compare.outputs_verdict`, chunked, NaN and infinities
  explained) under the gate's tolerance rule (`measure.tolerance.tolerance_rule`: dtype
  defaults, the TF32/bf16 relaxation, the task's rtol/atol replacing the default's fields);
- `time_call`: the gate's timer (`measure.timing.time_kernel`) with the task's budget.

The reduced precision is what torch's flags allow in the process that runs the reference:
the worker's and the judge's are fresh interpreters with torch's defaults (fp32 matmuls in
fp32, cuDNN convolutions in TF32), so a session that changes the flags (a conftest setting
`allow_tf32`) is not mirrored here: the gate would relax such an fp32 matmul, the sandbox not.

What stays the sandbox's own is elsewhere: process isolation (`isolation.py`), the guards
(`checks.py`), the trusted re-check (`judge.py`) and the re-timing with clocks bound before
the candidate runs (`worker.retime`, `confirm.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pytest_kernelpro.measure.compare import OutputsVerdict, outputs_verdict
from pytest_kernelpro.measure.tolerance import run_recording_precision, tolerance_rule


def make_inputs(module: Any, seed: int, device: Any) -> list[Any]:
    """The inputs of the reference module's `get_inputs()` for `seed`, on `device`."""
    from pytest_kernelpro.problem.kernelbench import kernelbench_inputs
    from pytest_kernelpro.problem.model import call_input_factory

    factory = functools.partial(kernelbench_inputs, module)
    return list(call_input_factory(factory, str(device), seed))


def run_reference(
    torch: Any, call: Callable[[], Any], device: Any, *, first: bool
) -> tuple[Any, str | None]:
    """`call()` (the reference on a copy of its inputs, synchronized) and, when `first`, the
    reduced precision of its fp32 matmuls/convs (None otherwise, or on the CPU)."""
    return run_recording_precision(torch, call, str(device), record=first)


def verdict(
    torch: Any, got: Any, expected: Any, task: Mapping[str, Any], reduced: str | None
) -> OutputsVerdict:
    """The candidate's output `got` against the reference's `expected`, by the gate's rule."""
    rule = tolerance_rule(reduced=reduced, rtol=task.get("rtol"), atol=task.get("atol"))
    return outputs_verdict(torch, got, expected, rule)


def time_call(fn: Callable[[], Any], task: Mapping[str, Any], device: Any) -> dict[str, Any]:
    """Median time of `fn()` by the gate's timer with the task's `timing` budget; the
    summary without the raw samples (thousands of floats per node: the stats say enough)."""
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel

    budget = TimingBudget(**dict(task.get("timing") or {}))
    result = time_kernel(fn, device=str(device), budget=budget)
    data = result.to_dict()
    data.pop("samples_s", None)
    return {"median_s": result.median_s, "samples": len(result.samples_s), **data}
