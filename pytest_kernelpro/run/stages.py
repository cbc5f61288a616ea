"""The stages of a kernel item, in the order `item_runner` runs them (and the way its module
docstring says): the measure stage (`check`, `time_item`, `recheck`), the roofline stage
(`roofline`, `roofline_floor`) and the gate stage (`gate`). Each fills its part of the record.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import (
    CorrectnessPart,
    RooflinePart,
    TimingPart,
    part_of,
)
from pytest_kernelpro.run.context import ItemRun, Profiling

if TYPE_CHECKING:
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.gpu_memory import ItemMemory


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
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    correctness: Any,
) -> tuple[float, Callable[[], Any]]:
    """Time the kernel on `inputs`; returns the median and a re-measurement made the same way.
    Every timed call gets fresh inputs from `make_inputs` and sampled outputs are checked
    against the reference (`measure.timing.fresh_inputs`); a kernel that did less than its
    work while timed fails here, naming what was seen."""
    from pytest_kernelpro.measure.timing import DishonestTiming, TimingBudget, time_kernel

    settings, device, record = run.session_settings, run.device, run.record
    budget = TimingBudget(
        warmup_ms=settings.warmup_ms,
        max_time_s=run.time_budget_s,
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
        if timings[0]:
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
    make_inputs: Callable[[int], tuple[Any, ...]],
    correctness: Any,
) -> Any:
    """The timed call's `FreshInputs`: new content every call from the item's own input maker,
    and the outputs of calls chosen after they returned checked against the reference's by
    the correctness trials' rule, with what their truth calibrated (`measure.output_rule`)."""
    import torch

    from pytest_kernelpro.measure.correctness_check import kept_rule
    from pytest_kernelpro.measure.timing.fresh_inputs import fresh_inputs

    rule = kept_rule(correctness, rtol=run.settings.rtol.value, atol=run.settings.atol.value)
    return fresh_inputs(
        torch,
        kernel,
        inputs,
        device=run.device,
        make_draw=make_inputs,
        reference=reference,
        check=rule.timed_check(torch),
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


def roofline(
    run: ItemRun,
    reference: Any,
    inputs: tuple[Any, ...],
    median_s: float,
    memory: ItemMemory | None,
    *,
    reprobe_ceilings: Callable[[str], Ceilings],
    op_cost_hook: Callable[..., Any],
) -> None:
    """The reference's FLOPs and bytes on the device's ceilings (the item's
    `device_model`): the roofline and the kernel's share of it (`reprobe_ceilings(why)`
    measures them again, once a kernel beats untrusted ones; `memory`: a CUDA item's GPU
    memory account, None elsewhere)."""
    from pytest_kernelpro.measure.ceilings import exceeds_every_ceiling
    from pytest_kernelpro.measure.roofline import (
        analyze_reference,
        could_be_impossible,
        impossible_failure,
        record_pricing,
    )

    ceilings, spec = run.device_model.require()
    problem, record = run.problem, run.record

    def analyze(ceilings: Any) -> Any:
        try:
            # The reference's own GPU peak: part of a CUDA item's footprint.
            with memory.reference_run() if memory is not None else contextlib.nullcontext():
                return analyze_reference(
                    reference,
                    inputs,
                    ceilings=ceilings,
                    flops=problem.flops,
                    bytes=problem.bytes,
                    op_cost_hook=op_cost_hook,
                    spec=spec,
                )
        except KernelproError:
            raise
        except Exception as exc:
            raise KernelproError(
                f"roofline analysis of the reference of {run.name} failed: "
                f"{describe_exception(exc)}; pass flops= and bytes= in the marker to skip counting"
            ) from exc

    analysis = analyze(ceilings)
    record.roofline = part_of(RooflinePart, analysis)
    # A kernel faster than the op-level peak allows is priced at the peak its rate implies
    # (measure/roofline.py); the roofline part keeps the op-level rule's numbers.
    efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    device_type = ceilings.device_type
    if could_be_impossible(record.peak_used, record.timing, device_type) and not ceilings.trusted:
        # Compulsory bytes beyond the bandwidth ceiling: before anything is blamed, re-probe
        # ceilings that load may have lowered (measure/ceilings.py), then price it again.
        ceilings = reprobe_ceilings(f"{run.name} exceeded them")
        if ceilings.trusted:
            analysis = analyze(ceilings)
            record.roofline = part_of(RooflinePart, analysis)
            efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    record.extra["ceilings_trusted"] = ceilings.trusted
    if exceeds_every_ceiling(record.peak_used) and ceilings.device_type == "cpu":
        from pytest_kernelpro.measure.ceiling_probe import exceedance_note

        assert record.peak_used is not None
        record.peak_used["note"] = f"{record.peak_used['note']}; {exceedance_note(ceilings)}"
    record.efficiency = analysis.efficiency(median_s) if efficiency is None else efficiency
    impossible = impossible_failure(
        record.peak_used, ceilings=ceilings, median_s=median_s, timing=record.timing
    )
    if impossible is not None:
        raise KernelproError(f"{run.name}: {impossible}")


def roofline_floor(run: ItemRun, median_s: float) -> None:
    """`min_roofline` outside check mode (`gate.verdict.roofline_floor`), failing the item."""
    from pytest_kernelpro.gate.verdict import roofline_floor as floor

    record = run.record
    fails, reason = floor(record.min_roofline, record.efficiency, True)
    if fails and record.efficiency is None:
        raise KernelproError(f"{run.name}: {reason}")
    if fails:
        raise KernelproError(
            f"{run.name} {reason} set in its marker (median {median_s * 1e6:.1f} us vs "
            f"roofline {(record.roofline_time_s or 0) * 1e6:.1f} us)"
        )


def gate(
    run: ItemRun,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any],
    *,
    profiling: Profiling,
) -> None:
    """The verdict against the item's baseline entry (a regression confirmed and profiled);
    a failing verdict, or a baseline that did not load, fails the item."""
    from pytest_kernelpro.gate.verdict import decide_verdict, needs_confirmation
    from pytest_kernelpro.measure.roofline import kernel_efficiency

    if run.baseline_error is not None:
        raise run.baseline_error
    record, entry, settings = run.record, run.baseline_entry, run.session_settings
    cross_cpu = settings.cpu_cross_device
    verdict = decide_verdict(record, entry, threshold=record.threshold, cross_cpu=cross_cpu)
    head_choices = record.autotune.choices if record.autotune else None
    # Picks, versions and library settings equal to the entry's leave nothing to name.
    differs = entry is not None and entry.differs_beside_code(record)
    if needs_confirmation(verdict) and entry is not None:
        from pytest_kernelpro.gate.confirmation import confirm, settle
        from pytest_kernelpro.gate.run_differences import compare_choices

        picks = compare_choices(head_choices, entry.autotune)
        first_change = verdict.change
        timing, remeasured = _confirmation_timing(
            run, remeasure, fresh_remeasure, picks.baseline_choices
        )
        confirmed = msgspec.structs.replace(record, timing=timing)
        if record.roofline_time_s is not None and timing.median_s is not None:
            confirmed.efficiency = kernel_efficiency(record.roofline, timing.median_s)
        verdict = confirm(verdict, confirmed, entry, cross_cpu=cross_cpu, where=remeasured.words())
        record.extra["confirmation_timing"] = msgspec.to_builtins(timing)
        verdict = settle(verdict, picks, remeasured, settings.autotune_mismatch, first_change)
    elif differs and entry is not None:
        from pytest_kernelpro.gate.run_differences import compare_choices, note_picks

        verdict = note_picks(verdict, compare_choices(head_choices, entry.autotune))
    if differs and entry is not None:
        from pytest_kernelpro.gate.run_differences import name_environment

        verdict = name_environment(
            verdict,
            record.environment.versions() if record.environment else None,
            entry.environment,
            record.autotune.library if record.autotune else None,
            entry.library,
        )

    record.gate = verdict
    if verdict.failed and verdict.status == "regressed" and record.profile is None:
        from pytest_kernelpro.run.profile_stage import auto_profile

        auto_profile(run, profiling)
    if verdict.failed:
        raise KernelproError(f"{record.name}: {verdict.message}")


def _confirmation_timing(
    run: ItemRun,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any],
    pins: tuple[dict[str, Any], ...],
) -> tuple[TimingPart, Any]:
    """The confirmation's timing and how it was made: in a fresh process with `pins` (the
    baseline's autotune choices) when the setting says so and the process gives a timing,
    else in this process (the fallback says why)."""
    from pytest_kernelpro.gate.confirmation import Remeasurement

    fallback = None
    if run.session_settings.confirm_process == "fresh":
        fresh = fresh_remeasure(list(pins))
        if fresh.timing is not None:
            autotune = fresh.autotune
            return fresh.timing, Remeasurement(
                fresh=True,
                wall_s=round(fresh.wall_s, 3),
                choices=autotune.choices if autotune else (),
                pin_problems=(autotune.pin_problems or ()) if autotune else (),
                pinned_requested=bool(pins),
            )
        fallback = f"the fresh process gave no timing ({fresh.error}); re-measured in this one"
        run.record.extra["confirmation_fresh_process_error"] = fresh.error
    started = time.perf_counter()
    timing = part_of(TimingPart, remeasure())
    wall = round(time.perf_counter() - started, 3)
    return timing, Remeasurement(fresh=False, wall_s=wall, fallback=fallback)
