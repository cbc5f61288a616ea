"""The gate stage of a kernel item under --kernelpro-check: the verdict against the item's
baseline entry, a provisional regression confirmed by timing the kernel again (in a fresh
process by default, `run.fresh_process`) with the baseline's autotune choices pinned, and a
confirmed regression profiled (`run.profile_stage.auto_profile`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import msgspec

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.record import TimingPart, VerdictPart, part_of
from pytest_kernelpro.run.context import ItemRun, Profiling


def gate(
    run: ItemRun,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any] | None = None,
    *,
    profiling: Profiling,
) -> None:
    """The verdict against the item's baseline entry (a regression is confirmed by timing it
    again, in a fresh process by default, with the baseline's autotune choices pinned, and
    profiled); a failing verdict, or a baseline that did not load, fails the item."""
    from pytest_kernelpro.gate.run_differences import compare_choices, name_environment, note_picks
    from pytest_kernelpro.gate.verdict import decide_verdict, needs_confirmation
    from pytest_kernelpro.measure.roofline import kernel_efficiency

    if run.baseline_error is not None:
        raise run.baseline_error
    record, entry, settings = run.record, run.baseline_entry, run.session_settings
    cross_cpu = settings.cpu_cross_device
    verdict = decide_verdict(record, entry, threshold=record.threshold, cross_cpu=cross_cpu)
    picks = compare_choices(
        record.autotune.choices if record.autotune else None,
        entry.autotune if entry is not None else None,
    )
    if needs_confirmation(verdict) and entry is not None:
        from pytest_kernelpro.gate.confirmation import confirm, settle

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
    elif entry is not None:
        verdict = note_picks(verdict, picks)
    if entry is not None:
        verdict = name_environment(
            verdict,
            record.environment.versions() if record.environment else None,
            entry.environment,
            record.autotune.library if record.autotune else None,
            entry.library,
        )

    record.gate = part_of(VerdictPart, verdict)
    if verdict.failed and verdict.status == "regressed" and record.profile is None:
        from pytest_kernelpro.run.profile_stage import auto_profile

        auto_profile(run, profiling)
    if verdict.failed:
        raise KernelproError(f"{record.name}: {verdict.message}")


def _confirmation_timing(
    run: ItemRun,
    remeasure: Callable[[], Any],
    fresh_remeasure: Callable[[list[dict[str, Any]]], Any] | None,
    pins: tuple[dict[str, Any], ...],
) -> tuple[TimingPart, Any]:
    """The confirmation's timing and how it was made: in a fresh process with `pins` (the
    baseline's autotune choices) when the setting says so and the process gives a timing,
    else in this process (the fallback says why)."""
    from pytest_kernelpro.gate.confirmation import Remeasurement

    fallback = None
    if run.session_settings.confirm_process == "fresh" and fresh_remeasure is not None:
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
