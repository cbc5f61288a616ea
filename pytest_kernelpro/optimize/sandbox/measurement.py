"""What the sandbox measures, taken from the gate's stack (`measure/`, `problem/`).

The worker (`harness.py`, `worker.retime`) and the trusted judge (`judge.py`) both go through
these functions, so they and the gate decide one output alike:

- `make_inputs`: a KernelBench task's inputs for one seed, the gate's input factory for a
  KernelBench file (`problem.kernelbench.kernelbench_inputs` under `call_input_factory`);
- `run_reference`: the reference's output and, on its first call, the reduced precision its
  fp32 matmuls/convs may have run in (`measure.fp32_precision.run_recording_precision`);
- `new_rule`, `find_truth`, `verdict`: the gate's correctness rule (`measure.output_rule`):
  the reference re-run in float64 on the first checked call's inputs
  (`measure.correctness_check.run_truth`), the
  kernel within a factor of the reference's own error against it and later calls by the
  tolerance it calibrated, outputs without information failing; without a truth the gate's
  dtype rule (`measure.output_rule.tolerance_rule`: defaults, the TF32/bf16 relaxation), and
  the task's rtol/atol overriding either; the comparison is the rule's (chunked, NaN and
  infinities explained), summed up in an `OutputsVerdict`;
- `time_call`: the gate's timer (`measure.timing.time_kernel`) with the task's budget.

The reduced precision is what torch's flags allow in the process that runs the reference.
The worker's, the judge's and the re-measurement's are fresh interpreters with torch's
defaults, so the session's flags travel in the task: `session_fp32_precision` reads them once
in the parent (a conftest that sets `torch.backends.cuda.matmul.allow_tf32` or
`torch.backends.cudnn.allow_tf32`), `apply_session_precision` sets them in the child before the
reference runs. The child then runs fp32 matmuls/convs as the session does and relaxes the
fp32 tolerance exactly when the gate would.

What stays the sandbox's own is elsewhere: process isolation (`isolation.py`), the guards
(`checks.py`), the trusted re-check (`judge.py`) and the confirmation's rule (`confirm.py`);
the confirmation's re-timing (`worker.retime`) is the search's timed call on `time_call`'s
timer.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.measure.correctness_check import run_truth
from pytest_kernelpro.measure.fp32_precision import run_recording_precision
from pytest_kernelpro.measure.fp32_tensor_cores import (
    apply_fp32_precision_flags,
    fp32_precision_flags,
)
from pytest_kernelpro.measure.output_rule import (
    CorrectnessRule,
    LeafReport,
    LeafTruth,
    Tolerance,
    Truth,
    calibrate,
    failure_text,
    json_float,
    leaf_tolerance,
    leaves_of,
)

PRECISION_KEY = "fp32_precision"  # the task's (and remeasure config's) copy of the flags


def session_fp32_precision() -> dict[str, str | None] | None:
    """The session's fp32 matmul/conv precision flags (`measure.fp32_tensor_cores.fp32_precision_flags`)
    for the sandbox's tasks; None when this process has not imported torch (its flags are
    then the defaults a fresh child has too, and importing torch here only for them would
    cost the parent seconds)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    return fp32_precision_flags(torch)


def apply_session_precision(torch: Any, task: Mapping[str, Any]) -> None:
    """Set the session's fp32 precision flags the task carries in this (child) process; a
    task without them leaves torch's defaults."""
    flags = task.get(PRECISION_KEY)
    if flags is None:
        return
    if not isinstance(flags, Mapping):
        raise KernelproError(
            f"the sandbox task's {PRECISION_KEY}={flags!r} is invalid: it must map an op kind "
            '(matmul, conv) to a mode, e.g. {"matmul": "tf32", "conv": "tf32"}'
        )
    apply_fp32_precision_flags(torch, flags, where=f"the sandbox task's {PRECISION_KEY}")


def steady_host_heap(device: Any) -> None:
    """On the CPU, glibc's mmap and trim thresholds fixed for this process from its start
    (`measure.timing.cpu.steady_allocator`, which the timer applies when it starts): the
    checks before the timing, the worker's and the judge's, are chunked passes over the
    outputs (`measure.output_rule`: about ten temporaries of `CPU_COMPARE_CHUNK` elements,
    4-8 MiB each, per chunk) whose every temporary glibc's moving threshold served with
    fresh pages, faulted in on first touch and returned on free: thousands of page faults a
    chunk, about half of a pass's time (bench/results/2026-12-06-optimizer-speed10-cpu.md).
    The same values, the same passes; the heap kept is what the timing keeps anyway
    (`footprint.HEAP_SLACK_BYTES` counts it)."""
    if getattr(device, "type", device) == "cpu":
        from pytest_kernelpro.measure.timing.cpu import steady_allocator

        steady_allocator()


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


def new_rule(task: Mapping[str, Any]) -> CorrectnessRule:
    """The gate's correctness rule for one evaluation, the task's rtol/atol overriding it."""
    return CorrectnessRule(rtol=task.get("rtol"), atol=task.get("atol"))


@contextlib.contextmanager
def one_thread(torch: Any) -> Iterator[None]:
    """The correctness rule's passes on one CPU thread, the process's count restored after.

    The rule's passes over an output (`measure.output_rule`: the truth's reference error, the
    comparison with the truth, the tolerance and information passes) are chunks of at most
    `CPU_COMPARE_CHUNK` elements, about twenty elementwise ops each: thousands of short
    parallel regions for a large output. Each region waits for its slowest thread, and on a
    machine whose cores are shared (the worker and the judge beside it, the session, other
    jobs) a thread that is descheduled stalls it for a time slice: with two threads on two
    busy cores these passes ran several times slower than on one
    (bench/results/2026-12-05-optimizer-memory6-cpu.md). A CPU task runs on one thread
    unless the user sets `kernelpro_cpu_threads`: this matters where they did, and on a
    task given more threads. One thread changes no verdict (the
    same elements, the same bounds; only float64 sums of squares may round in another
    order) and does not touch the candidate's calls or the timing, which keep the task's
    count. On a CUDA problem the passes run on the device: this only sets a host count."""
    before = torch.get_num_threads()
    if before > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if before > 1 and torch.get_num_threads() != before:
            torch.set_num_threads(before)


def find_truth(
    torch: Any,
    rule: CorrectnessRule,
    reference: Callable[..., Any],
    inputs: Any,
    expected: Any,
    device: Any,
    *,
    reference_s: float | None = None,
    arrange: Callable[[Any], Any] | None = None,
    consume_inputs: bool = False,
    remake: Callable[[], Any] | None = None,
) -> None:
    """Re-run `reference` on `inputs` in higher precision (`measure.correctness_check.run_truth`) for the
    comparison of the call that gave `expected`; `rule` takes it (or the reason it could not
    run), and decides that call and calibrates the later ones by it. `consume_inputs`:
    `inputs` is a list only this call holds, emptied once widened (the judge's); `remake`:
    the reference's output is made after the re-run, `expected` only describing it
    (`run_truth`). On one CPU
    thread (`one_thread`): its reference-error pass is the rule's chunked work; the float64
    re-run inside it takes one thread too (the softmax's re-run was under a fifth of the
    truth's time on two threads, bench/results/2026-12-05-optimizer-memory6-cpu.md; a
    compute-bound reference's re-run may take up to twice as long on a quiet machine)."""
    with one_thread(torch):
        truth = run_truth(
            torch,
            reference,
            inputs,
            expected,
            device=str(device),
            reference_s=reference_s,
            arrange=arrange,
            consume_inputs=consume_inputs,
            remake=remake,
        )
    rule.set_truth(truth)


# The numbers of a leaf's truth that calibrate later calls (`LeafTruth` without its
# `difference`, the only tensor).
_LEAF_NUMBERS = (
    "numel", "reference_error_norm", "truth_norm", "reference_error_max", "truth_abs_max",
    "unit_roundoff",
)  # fmt: skip


def truth_payload(rule: CorrectnessRule) -> dict[str, Any]:
    """JSON-safe: what the judge's truth (found by `find_truth`) tells the worker, so the
    worker needs no truth of its own (`take_truth`): the reduced precision of the
    reference's fp32 matmuls/convs, and per floating leaf the reference's error numbers
    that calibrate the tolerance of later calls (`measure.output_rule.calibrate`). No
    tensor: the first call's comparison with the truth itself stays the judge's. Leaves
    under the judge's (flattened) names: `worker_named` renames them."""
    truth = rule.truth
    found: dict[str, Any] | None = None
    if truth is not None:
        found = {
            "precision": truth.precision,
            "skipped": truth.skipped,
            "seconds": truth.seconds,
            "leaves": {
                path: {name: getattr(leaf, name) for name in _LEAF_NUMBERS}
                for path, leaf in truth.leaves.items()
            },
        }
    return {"reduced": rule.reduced, "truth": found}


def worker_named(known: Mapping[str, Any]) -> dict[str, Any]:
    """The truth a search's first judge found (`judge._Reference.known_truth`: its
    `truth_payload` and the worker's names of the flattened leaves) as a process that judges
    unflattened outputs takes it (`take_truth`). Raises KeyError, TypeError, ValueError or
    AttributeError on another shape."""
    payload, paths = dict(known["payload"]), dict(known["paths"])
    truth = payload["truth"]
    if truth is not None:
        leaves = {paths.get(path, path): numbers for path, numbers in dict(truth["leaves"]).items()}
        truth = {**truth, "leaves": leaves}
    return {**payload, "truth": truth}


def take_truth(rule: CorrectnessRule, payload: Mapping[str, Any]) -> None:
    """Give `rule` (a worker's, before its first call) the judge's truth (`truth_payload`):
    its reduced precision, and the truth calibrated as `CorrectnessRule.judge` calibrates it
    on the first call, so every call, the first included, is decided by the calibrated
    tolerance and the timed calls' check by the same. Raises KeyError, TypeError or
    ValueError on another shape (the caller then finds its own truth)."""
    reduced = payload["reduced"]
    if reduced is not None and not isinstance(reduced, str):
        raise TypeError(f"reduced precision {reduced!r}")
    found = payload["truth"]
    truth: Truth | None = None
    if found is not None:
        leaves = {
            str(path): LeafTruth(
                path=str(path),
                difference=None,
                numel=int(numbers["numel"]),
                **{name: float(numbers[name]) for name in _LEAF_NUMBERS[1:]},
            )
            for path, numbers in dict(found["leaves"]).items()
        }
        truth = Truth(
            precision=None if found["precision"] is None else str(found["precision"]),
            skipped=None if found["skipped"] is None else str(found["skipped"]),
            seconds=None if found["seconds"] is None else float(found["seconds"]),
            leaves=leaves,
        )
    rule.reduced = reduced
    if truth is None:
        return
    rule.truth = truth  # not `set_truth`: no call is pending its comparison here
    if truth.available:
        precision = truth.precision or "float64"
        for path, leaf in truth.leaves.items():
            rule.calibrated[path] = calibrate(leaf, precision, rule.factor)


@dataclass(frozen=True)
class OutputsVerdict:
    """One comparison of a candidate's outputs with the reference's, summed up over leaves."""

    ok: bool
    reports: tuple[LeafReport, ...]
    failure: str | None  # `failure_text` of the failing leaves; None when ok
    max_abs: float
    max_rel: float
    tolerance: Tolerance | None  # of the first failing leaf, else of the closest to failing

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the verdict, the errors, the tolerance and the failure text."""
        data: dict[str, Any] = {
            "ok": self.ok,
            "max_abs_err": json_float(self.max_abs),
            "max_rel_err": json_float(self.max_rel),
        }
        if self.tolerance is not None:
            data.update(rtol=self.tolerance.rtol, atol=self.tolerance.atol)
            data["tolerance_source"] = self.tolerance.source
        if self.failure is not None:
            data["why"] = self.failure
        return data


def verdict(
    torch: Any,
    got: Any,
    expected: Any,
    rule: CorrectnessRule | Mapping[str, Any],
    reduced: str | None = None,
) -> OutputsVerdict:
    """The candidate's output `got` against the reference's `expected`, by the gate's rule
    (a `CorrectnessRule`, or a task: its rtol/atol and the dtype rule relaxed by `reduced`),
    on one CPU thread (`one_thread`)."""
    if not isinstance(rule, CorrectnessRule):
        task = rule
        rule = new_rule(task)
        rule.reduced = reduced
    by_truth = rule.truth is not None and rule.truth.available and not rule.calibrated
    with one_thread(torch):
        reports = identical_reports(torch, got, expected, rule)
        if reports is None:
            reports = tuple(rule.judge(torch, got, expected))
    if by_truth:
        # The truth's comparison (`CorrectnessRule.judge`, the first call's) drops reference -
        # truth (one output's size) from the rule, but a reference cycle of that comparison
        # keeps it until the cyclic collector runs, which large tensors do not trigger: the
        # judge held it, idle, through the worker's timing (bench/results/2026-12-05-
        # optimizer-memory7-cpu.md). Collected here, once per evaluation.
        gc.collect()
    failed = [r for r in reports if not r.ok]
    worst = failed[0] if failed else max(reports, key=lambda r: r.worst_ratio, default=None)
    return OutputsVerdict(
        ok=not failed,
        reports=reports,
        failure=failure_reason(failed) if failed else None,
        max_abs=max((r.max_abs for r in reports), default=0.0),
        max_rel=max((r.max_rel for r in reports), default=0.0),
        tolerance=None if worst is None else worst.tolerance,
    )


def failure_reason(failed: Sequence[LeafReport]) -> str:
    """A refused output's reason: its failing leaves' messages (`failure_text`), without the
    kernel's values (`without_values`), as every reason that may reach a prompt."""
    return without_values(failure_text(list(failed)))


def identical_reports(
    torch: Any, got: Any, expected: Any, rule: CorrectnessRule
) -> tuple[LeafReport, ...] | None:
    """The passing reports of an output whose every leaf is a plain tensor bit-identical to
    the reference's (one `torch.equal` pass, which stops at the first difference), else
    None: the rule's own comparison decides. The rule passes such an output in every mode
    (no difference to bound, and the reference's own values are no zero, constant or scaled
    copy of themselves), so this changes no verdict, only skips its passes over a large output
    (`measure.timing.fresh_inputs` checks timed outputs the same way). Not for the call the
    truth decides (its comparison calibrates the later ones: `CorrectnessRule.judge`), nor
    for NaN (`torch.equal` counts NaN unequal: the rule explains it), nor for a tensor
    subclass (its `torch.equal` could be anything)."""
    if rule.truth is not None and rule.truth.available and not rule.calibrated:
        return None
    got_leaves, exp_leaves = list(leaves_of(torch, got)), list(leaves_of(torch, expected))
    if not exp_leaves or len(got_leaves) != len(exp_leaves):
        return None
    reports = []
    for (path, g), (exp_path, e) in zip(got_leaves, exp_leaves, strict=True):
        if (
            path != exp_path
            or type(g) is not torch.Tensor
            or type(e) is not torch.Tensor
            or g.shape != e.shape
            or g.dtype != e.dtype
            or g.device != e.device
            or not bool(torch.equal(g, e))
        ):
            return None
        reports.append(LeafReport(path, leaf_tolerance(rule, path, e.dtype), True))
    return tuple(reports)


_NUMBER = r"([-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|inf|nan)|True|False)"
_EXPECTED_GOT = re.compile(rf"expected {_NUMBER}, got {_NUMBER}")
_TRUTH_KERNEL = re.compile(rf"truth {_NUMBER}, reference {_NUMBER}, kernel {_NUMBER}")
_ERRORS = re.compile(r"(Max abs error|max rel error) ([-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|inf|nan)")


def _number(text: str) -> float:
    return float(text == "True") if text in ("True", "False") else float(text)


def _size(a: str, b: str) -> str:
    """|a - b| to two significant digits, or why it is not a number."""
    error = abs(_number(b) - _number(a))
    return f"{error:.2g}" if math.isfinite(error) else "not finite"


def without_values(text: str) -> str:
    """A wrong output's reason as it may reach a prompt: the positions and the size of the
    error, not the kernel's values (a value the kernel chose would be a channel out of the
    sandbox, one number per evaluation); error sizes to two significant digits."""
    text = _EXPECTED_GOT.sub(lambda m: f"error {_size(m[1], m[2])}", text)
    text = _TRUTH_KERNEL.sub(
        lambda m: f"|kernel - truth| {_size(m[1], m[3])}, |reference - truth| {_size(m[1], m[2])}",
        text,
    )
    return _ERRORS.sub(lambda m: f"{m[1]} {_size('0', m[2])}", text)


def time_call(
    fn: Callable[[], Any] | None, task: Mapping[str, Any], device: Any, fresh: Any = None
) -> dict[str, Any]:
    """Median time of `fn()` by the gate's timer with the task's `timing` budget; the
    summary without the raw samples (thousands of floats per node: the stats say enough).
    With `fresh` (`fresh_calls`), the gate's fresh inputs and checked timed outputs."""
    from pytest_kernelpro.measure.timing import TimingBudget, time_kernel

    budget = TimingBudget(**dict(task.get("timing") or {}))
    result = time_kernel(fn, device=str(device), budget=budget, fresh=fresh)
    data = result.to_dict()
    data.pop("samples_s", None)
    return {"median_s": result.median_s, "samples": len(result.samples_s), **data}


def fresh_calls(
    torch: Any,
    model: Callable[..., Any],
    args: Sequence[Any],
    device: Any,
    *,
    make_draw: Callable[[int], Sequence[Any]],
    reference: Callable[..., Any] | None = None,
    check: Callable[[Any, Any], str | None] | None = None,
) -> Any:
    """The gate's `FreshInputs` (`measure.timing.fresh_inputs`) of `model` on `args`: new
    content before every timed call (mixed between two draws of `make_draw(seed)`, or a new
    draw), the outputs of calls chosen after they returned compared with `reference`'s by
    `check`."""
    from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs

    return fresh_inputs(
        torch, model, args, device=str(device), make_draw=make_draw, reference=reference,
        check=check,
    )  # fmt: skip
