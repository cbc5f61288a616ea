"""The stages of one kernel item's run: check, time, recheck, roofline, profile, gate.

Each stage is a function of the item's `ItemRun` and the values it needs, which the item's run
looks up once and passes (`item_runner.py`): the session-wide settings, the device's ceilings
and spec, the baseline entry, the profiling setup. No stage sees the session. Each fills its
part of the record: `check`, `time_item`, `recheck`, `roofline`, `profile`, `gate` (or
`roofline_floor` outside check mode).

Every failure becomes a `KernelproError` that names what went wrong and the fix, so one
bad kernel fails alone and the session goes on.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import (
    CorrectnessPart,
    KernelRecord,
    RooflinePart,
    TimingPart,
    VerdictPart,
)

if TYPE_CHECKING:
    from pytest_kernelpro.config import KernelproConfig
    from pytest_kernelpro.gate.baseline_entry import BaselineEntry
    from pytest_kernelpro.measure.ceilings import Ceilings
    from pytest_kernelpro.measure.devices import DeviceSpec
    from pytest_kernelpro.run.context import ItemRun, Profiling


def check(
    run: ItemRun,
    kernel: Any,
    reference: Any,
    make_inputs: Callable[[int], tuple[Any, ...]],
    grad_mode: Any,
) -> Any:
    """The correctness trials; a wrong kernel fails the item here."""
    from pytest_kernelpro.measure.correctness import check_correctness

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
    run.record.correctness = CorrectnessPart.from_dict(correctness.to_dict())
    if not correctness.passed:
        failure = correctness.failure or "no detail"
        if failure.startswith("The kernel raised"):
            raise KernelproError(f"{run.name}: {failure}")
        raise KernelproError(f"{run.name} is wrong: {failure}")
    return correctness


def time_item(
    run: ItemRun,
    config: KernelproConfig,
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

    settings, device, record = config, run.device, run.record
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

    def remeasure() -> Any:
        with grad_mode():
            return time_kernel(lambda: kernel(*inputs), device=device, budget=budget, fresh=fresh)

    try:
        timing = remeasure()
    except DishonestTiming as exc:
        raise KernelproError(f"{run.name} is refused: {exc}") from exc
    except Exception as exc:
        raise KernelproError(f"timing {run.name} failed: {describe_exception(exc)}") from exc
    record.timing = TimingPart.from_dict(timing.to_dict())
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
    """The timed call's `FreshInputs`: a second input set from the item's own maker and the
    reference's outputs, compared by the correctness trials' rule (`measure.accuracy`: the
    tolerance the first trial's truth calibrated, else the dtype rule)."""
    import torch

    from pytest_kernelpro.measure.accuracy import CorrectnessRule
    from pytest_kernelpro.measure.timing.fresh_inputs import CONTENT_SEED_OFFSET, fresh_inputs

    check = None
    if reference is not None:
        # The trials' rule, with what their truth calibrated (as the re-check after timing).
        rule = getattr(correctness, "rule_state", None)
        if not isinstance(rule, CorrectnessRule):
            rule = CorrectnessRule(rtol=run.settings.rtol.value, atol=run.settings.atol.value)
            rule.reduced = "tf32" if getattr(correctness, "tf32", False) else None

        def check(got: Any, expected: Any) -> str | None:
            failed = [r for r in rule.judge(torch, got, expected) if not r.ok]
            return " ".join(r.message or "" for r in failed[:2]) if failed else None

    second = None
    if make_inputs is not None:
        second = lambda: make_inputs(1_000_003 + CONTENT_SEED_OFFSET)  # noqa: E731
    return fresh_inputs(
        torch,
        kernel,
        inputs,
        device=run.device,
        make_second=second,
        reference=reference,
        check=check,
    )


def roofline_floor(run: ItemRun, median_s: float) -> None:
    """`min_roofline` outside check mode: the gate's one rule (`gate.verdict.roofline_floor`),
    failing the item with the numbers behind it."""
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


def recheck(
    kernel: Any,
    reference: Any,
    inputs: tuple[Any, ...],
    make_inputs: Any,
    run: ItemRun,
    correctness: Any,
) -> None:
    """A kernel must stay correct after it was timed (see `recheck_after_timing`)."""
    from pytest_kernelpro.measure.correctness import recheck_after_timing

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
    memory: Any,
    *,
    ceilings: Ceilings,
    reprobe_ceilings: Callable[[str], Ceilings],
    spec: DeviceSpec | None,
    op_cost_hook: Callable[..., Any],
) -> None:
    """The reference's FLOPs and bytes on the device's `ceilings`: the roofline and the
    kernel's share of it (`reprobe_ceilings(why)` measures them again, once a kernel beats
    untrusted ones)."""
    from pytest_kernelpro.measure.ceilings import exceedance_note, exceeds_every_ceiling
    from pytest_kernelpro.measure.roofline import (
        analyze_reference,
        impossible_failure,
        record_pricing,
    )

    problem, record = run.problem, run.record

    def analyze(ceilings: Any) -> Any:
        try:
            with memory.reference_run():  # the reference's own peak: part of the footprint
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
    record.roofline = RooflinePart.from_dict(analysis.to_dict())
    # A kernel faster than the op-level peak allows is priced at the peak its rate implies
    # (measure/roofline.py); the roofline part keeps the op-level rule's numbers.
    efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    if exceeds_every_ceiling(record.peak_used) and not ceilings.trusted:
        # Beyond every ceiling: before anything is blamed, re-probe ceilings that load may
        # have lowered (measure/ceilings.py), then price the kernel again on them.
        ceilings = reprobe_ceilings(f"{run.name} exceeded them")
        if ceilings.trusted:
            analysis = analyze(ceilings)
            record.roofline = RooflinePart.from_dict(analysis.to_dict())
            efficiency, record.peak_used = record_pricing(record.roofline, median_s)
    record.extra["ceilings_trusted"] = ceilings.trusted
    if exceeds_every_ceiling(record.peak_used) and ceilings.device_type == "cpu":
        assert record.peak_used is not None
        record.peak_used["note"] = f"{record.peak_used['note']}; {exceedance_note(ceilings)}"
    record.efficiency = analysis.efficiency(median_s) if efficiency is None else efficiency
    impossible = impossible_failure(
        record.peak_used, ceilings=ceilings, median_s=median_s, timing=record.timing
    )
    if impossible is not None:
        raise KernelproError(f"{run.name}: {impossible}")


def profile(run: ItemRun, profiling: Profiling, device: str | None = None) -> None:
    """ncu, SASS and timeline of the kernel, then the tools' findings and guidance; a
    profiler failure never fails the kernel."""
    device = run.device if device is None else device
    record = run.record
    if not device.startswith("cuda"):
        record.extra["profile_text"] = (
            "profile: not collected: ncu, SASS and timeline need a CUDA GPU"
        )
        record.extra["profile_skipped"] = "no CUDA GPU"
        return
    from pytest_kernelpro.measure.gpu_memory import memory_state, release_cached

    # The profiler runs the kernel in child processes (ncu, kineto): give them the memory
    # this process has cached but does not use; the record says what they had.
    release_cached(device, 0)
    record.extra["profile_gpu_memory"] = memory_state(device)
    try:
        _profile_item(run, profiling, device)
    except Exception as exc:  # a profiler failure never fails the kernel
        record.extra["profile_text"] = f"profile: failed: {describe_exception(exc)}"


def _profile_item(run: ItemRun, profiling: Profiling, device: str) -> None:
    """Fill the record's profile, the tools' findings, guidance and the report text."""
    from pytest_kernelpro.analysis import RooflineFacts, profile_and_analyze
    from pytest_kernelpro.record import ProfilePart

    record = run.record
    capture = profiling.capture
    facts = RooflineFacts.from_roofline(
        record.roofline.to_dict() if record.roofline else None,
        median_s=record.median_s,
        efficiency=record.efficiency,
    )
    analysis = profile_and_analyze(
        run.locator,
        facts,
        so_paths=capture.so_paths if capture else (),
        ptxas=capture.ptxas if capture else (),
        device=device,
        timeout_s=profiling.timeout_s,
        ncu_path=os.environ.get("KERNELPRO_NCU"),
    )
    record.profile = ProfilePart.from_dict(analysis.report.to_dict())
    record.extra["tools"] = analysis.tool_run.to_dict()
    record.extra["profile_wall_s"] = analysis.profile_s
    record.guidance = analysis.guidance_md or None
    record.extra["profile_text"] = analysis.text


def gate(
    run: ItemRun,
    config: KernelproConfig,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any] | None = None,
    *,
    entry: BaselineEntry | None,
    profiling: Profiling,
) -> None:
    """The verdict against the baseline `entry` (a regression is confirmed by timing it again,
    in a fresh process by default, with the baseline's autotune choices pinned, and
    profiled); a failing verdict fails the item."""
    from pytest_kernelpro.gate.autotune_gate import compare_choices, note_picks, settle
    from pytest_kernelpro.gate.confirmation import confirm, needs_confirmation
    from pytest_kernelpro.gate.environment import name_environment
    from pytest_kernelpro.gate.verdict import compare
    from pytest_kernelpro.measure.roofline import kernel_efficiency

    record = run.record
    cross_cpu = config.cpu_cross_device
    verdict = compare(record, entry, threshold=record.threshold, cross_cpu=cross_cpu)
    picks = compare_choices(
        record.autotune.choices if record.autotune else None,
        entry.autotune if entry is not None else None,
    )
    if needs_confirmation(verdict) and entry is not None:
        first_change = verdict.change
        timing, remeasured = _confirmation_timing(
            run, config, remeasure, fresh_remeasure, picks.baseline_choices
        )
        confirmed = KernelRecord.from_dict(record.to_dict())
        confirmed.timing = timing
        if record.roofline_time_s is not None and timing.median_s is not None:
            confirmed.efficiency = kernel_efficiency(record.roofline, timing.median_s)
        verdict = confirm(verdict, confirmed, entry, cross_cpu=cross_cpu, where=remeasured.words())
        record.extra["confirmation_timing"] = timing.to_dict()
        verdict = settle(verdict, picks, remeasured, config.autotune_mismatch, first_change)
    elif entry is not None:
        verdict = note_picks(verdict, picks)
    if entry is not None:
        verdict = name_environment(
            verdict,
            record.environment.to_dict() if record.environment else None,
            entry.environment,
            record.autotune.library if record.autotune else None,
            entry.library,
        )

    record.gate = VerdictPart.from_dict(verdict.to_dict())
    if verdict.failed and verdict.status == "regressed" and record.profile is None:
        _auto_profile(run, profiling)
    if verdict.failed:
        raise KernelproError(f"{record.name}: {verdict.message}")


def _confirmation_timing(
    run: ItemRun,
    config: KernelproConfig,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any] | None,
    pins: tuple[dict[str, Any], ...],
) -> tuple[TimingPart, Any]:
    """The confirmation's timing and how it was made: in a fresh process with `pins` (the
    baseline's autotune choices) when the setting says so and the process gives a timing,
    else in this process (the fallback says why)."""
    from pytest_kernelpro.gate.autotune_gate import Remeasurement

    fallback = None
    if config.confirm_process == "fresh" and fresh_remeasure is not None:
        fresh = fresh_remeasure(list(pins))
        if fresh.timing is not None:
            autotune = fresh.autotune or {}
            return TimingPart.from_dict(fresh.timing), Remeasurement(
                fresh=True,
                wall_s=round(fresh.wall_s, 3),
                choices=tuple(autotune.get("choices") or ()),
                pin_problems=tuple(autotune.get("pin_problems") or ()),
                pinned_requested=bool(pins),
            )
        fallback = f"the fresh process gave no timing ({fresh.error}); re-measured in this one"
        run.record.extra["confirmation_fresh_process_error"] = fresh.error
    started = time.perf_counter()
    timing = TimingPart.from_dict(remeasure().to_dict())
    wall = round(time.perf_counter() - started, 3)
    return timing, Remeasurement(fresh=False, wall_s=wall, fallback=fallback)


def _auto_profile(run: ItemRun, profiling: Profiling) -> None:
    """A regression comes with its profile (what changed, in the counters' words), within the
    session's budget of automatic profiles; past it, the record says how to profile it."""
    record = run.record
    if not profiling.auto_profile_allowed():
        record.extra["profile_text"] = (
            f"profile: not collected automatically: {profiling.auto_done} regressed "
            f"kernel(s) were already profiled in {profiling.auto_spent_s:.0f} s (budget: "
            f"--kernelpro-auto-profiles={profiling.auto_limit}, "
            f"--kernelpro-auto-profile-time={profiling.auto_time_s:g}). Profile this one "
            f"with: pytest {shlex.quote(run.nodeid)} --kernelpro-profile"
        )
        return
    started = time.perf_counter()
    try:
        profile(run, profiling, record.device_kind)
    finally:
        profiling.auto_done += 1
        profiling.auto_spent_s += time.perf_counter() - started


def _input_bytes(inputs: tuple[Any, ...]) -> int:
    """Bytes of the tensors among the inputs (the working set of a CPU cache flush)."""
    total = 0
    for value in inputs:
        nbytes = getattr(value, "nbytes", None)
        if isinstance(nbytes, int):
            total += nbytes
    return total
