"""The measure stage of a kernel item: the correctness trials (`check`), the timing
(`time_item`, every timed call on fresh inputs with sampled outputs checked against the
reference) and the re-check after timing (`recheck`).

Each function takes the item's state (`run.context.ItemRun`) and the kernel, its reference
and inputs as values, fills its part of the record, and fails the item with a
`KernelproError` that names what went wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import CorrectnessPart, TimingPart, part_of
from pytest_kernelpro.run.context import ItemRun


def check(
    run: ItemRun,
    kernel: Any,
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    grad_mode: Any,
) -> Any:
    """The correctness trials; a wrong kernel fails the item here."""
    from pytest_kernelpro.measure.correctness_check import check_correctness

    try:
        with grad_mode():
            correctness = check_correctness(
                kernel,
                reference,
                make_inputs,
                device=run.device,
                trials=run.settings.trials.value,
                rtol=run.settings.rtol.value,
                atol=run.settings.atol.value,
                kernelbench=run.problem.kind == "kernelbench",
            )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(f"{run.name} raised {describe_exception(exc)}") from exc
    run.record.correctness = part_of(CorrectnessPart, correctness)
    if not correctness.passed:
        failure = correctness.failure or "no detail"
        if failure.startswith("The kernel raised"):
            raise KernelproError(f"{run.name}: {failure}")
        raise KernelproError(f"{run.name} is wrong: {failure}")
    return correctness


def time_item(
    run: ItemRun,
    kernel: Any,
    inputs: tuple[Any, ...],
    grad_mode: Any,
    *,
    reference: Any = None,
    make_inputs: Callable[[int], tuple[Any, ...]] | None = None,
    correctness: Any = None,
) -> tuple[float, Callable[[], Any]]:
    """Time the kernel on `inputs`; returns the median and a re-measurement (the gate's
    confirmation times the kernel again the same way). With the reference and the input
    maker, every timed call gets fresh inputs and sampled outputs are checked against the
    reference (`measure.timing.fresh_inputs`); a kernel that did less than its work while
    timed fails here, naming what was seen."""
    from pytest_kernelpro.measure.timing import DishonestTiming, TimingBudget, time_kernel

    settings, device, record = run.session_settings, run.device, run.record
    budget = TimingBudget(
        warmup_ms=settings.warmup_ms,
        max_time_s=settings.budget_for(device),
        target_rel_ci=settings.target_rel_ci,
        cuda_graph=settings.cuda_graph,
        cpu_flush=settings.cpu_flush,
        clock_anchor=settings.clock_anchor,
        working_set_bytes=_input_bytes(inputs),
        streams=run.problem.extra.get("streams") or "current",
    )
    with grad_mode():
        fresh = _fresh_inputs(run, kernel, inputs, reference, make_inputs, correctness)

    timings = [0]

    def remeasure() -> Any:
        if timings[0] and fresh is not None:
            # A re-measurement: the post-timing re-check wrote other contents into the timed
            # tensors since; the ring's turn must hold again before a call is checked.
            fresh.resume()
        timings[0] += 1
        with grad_mode():
            return time_kernel(lambda: kernel(*inputs), device=device, budget=budget, fresh=fresh)

    try:
        timing = remeasure()
    except DishonestTiming as exc:
        raise KernelproError(f"{run.name} is refused: {exc}") from exc
    except Exception as exc:
        raise KernelproError(f"timing {run.name} failed: {describe_exception(exc)}") from exc
    record.timing = part_of(TimingPart, timing)
    record.device = timing.device
    if timing.threads is not None:
        # Timings with other thread counts are not comparable: the count is part of the device.
        plural = "s" * (timing.threads != 1)
        record.device = f"{timing.device[:-1]}, {timing.threads} thread{plural})"
    return timing.stats.median_s, remeasure


def _fresh_inputs(
    run: ItemRun,
    kernel: Any,
    inputs: tuple[Any, ...],
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]] | None,
    correctness: Any,
) -> Any:
    """The timed call's `FreshInputs`: new content every call from the item's own input maker,
    the outputs of calls chosen after they returned compared with the reference's by the correctness trials' rule (`measure.output_rule`: the
    tolerance the first trial's truth calibrated, else the dtype rule)."""
    import torch

    from pytest_kernelpro.measure.output_rule import CorrectnessRule
    from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs

    check: Callable[[Any, Any], str | None] | None = None
    if reference is not None:
        # The trials' rule, with what their truth calibrated (as the re-check after timing).
        rule = getattr(correctness, "rule_state", None)
        if not isinstance(rule, CorrectnessRule):
            rule = CorrectnessRule(rtol=run.settings.rtol.value, atol=run.settings.atol.value)
            rule.reduced = "tf32" if getattr(correctness, "tf32", False) else None
        check = rule.timed_check(torch)

    return fresh_inputs(
        torch,
        kernel,
        inputs,
        device=run.device,
        make_draw=make_inputs,
        reference=reference,
        check=check,
        name=run.name,
    )


def _input_bytes(inputs: tuple[Any, ...]) -> int:
    """Bytes of the tensors among the inputs (the working set of a CPU cache flush)."""
    total = 0
    for value in inputs:
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
    return total


def recheck(
    kernel: Any,
    reference: Any,
    inputs: tuple[Any, ...],
    make_inputs: Any,
    run: ItemRun,
    correctness: Any,
) -> None:
    """A kernel must stay correct after it was timed (see `recheck_after_timing`)."""
    from pytest_kernelpro.measure.correctness_check import recheck_after_timing

    try:
        failure = recheck_after_timing(
            kernel,
            reference,
            inputs,
            lambda: make_inputs(1_000_033),
            device=run.device,
            correctness=correctness,
            rtol=run.settings.rtol.value,
            atol=run.settings.atol.value,
        )
    except KernelproError:
        raise
    except Exception as exc:
        raise KernelproError(
            f"the reference raised {describe_exception(exc)} when {run.name} was "
            "checked again after timing"
        ) from exc
    if failure is not None:
        raise KernelproError(f"{run.name} is wrong: {failure}")
