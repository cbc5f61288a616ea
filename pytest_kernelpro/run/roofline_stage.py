"""The roofline stage of a kernel item: the reference's FLOPs and bytes priced on the
device's ceilings (`roofline`), and outside check mode the marker's `min_roofline` floor
(`roofline_floor`; in check mode the verdict applies the same floor)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, describe_exception
from pytest_kernelpro.record import RooflinePart, part_of
from pytest_kernelpro.run.context import ItemRun

if TYPE_CHECKING:
    from pytest_kernelpro.measure.ceilings import Ceilings


def roofline(
    run: ItemRun,
    reference: Any,
    inputs: tuple[Any, ...],
    median_s: float,
    memory: Any,
    *,
    reprobe_ceilings: Callable[[str], Ceilings],
    op_cost_hook: Callable[..., Any],
) -> None:
    """The reference's FLOPs and bytes on the device's ceilings (the item's
    `device_model`): the roofline and the kernel's share of it (`reprobe_ceilings(why)`
    measures them again, once a kernel beats untrusted ones)."""
    from pytest_kernelpro.measure.ceilings import exceedance_note, exceeds_every_ceiling
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
        assert record.peak_used is not None
        record.peak_used["note"] = f"{record.peak_used['note']}; {exceedance_note(ceilings)}"
    record.efficiency = analysis.efficiency(median_s) if efficiency is None else efficiency
    impossible = impossible_failure(
        record.peak_used, ceilings=ceilings, median_s=median_s, timing=record.timing
    )
    if impossible is not None:
        raise KernelproError(f"{run.name}: {impossible}")


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
