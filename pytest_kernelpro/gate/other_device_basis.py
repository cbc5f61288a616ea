"""The verdict's basis against a baseline from another device: samples divided by each side's
roofline time, so the comparison is of time relative to the roofline (1 / efficiency), at the
wider cross-device tolerance. Another CPU is information only unless `cross_cpu="gate"`
(`--kernelpro-cpu-cross-device=gate`): a CPU's efficiency does not carry across CPU models,
and the thread count is part of a CPU device's name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pytest_kernelpro.gate.baseline import Basis, Incomparable, is_cpu, pct_text, positive

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord


def cross_device_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    current_median: float,
    cross_tolerance: float,
    cross_cpu: str,
) -> Basis | Incomparable:
    """Time relative to each side's roofline time, or why that cannot gate."""
    rt_now, rt_base = positive(record.roofline_time_s), entry.roofline_time_s
    if rt_now is None or not rt_base:
        missing = "this run" if rt_now is None else "the baseline"
        return Incomparable(
            text=f"none (other device: {entry.device} vs {record.device})",
            reason=(
                f"the baseline was measured on {entry.device or 'an unknown device'} and "
                f"this run on {record.device or 'an unknown device'}; {missing} has no "
                "roofline time, so neither time nor efficiency can be compared. Save a "
                f"baseline on {record.device or 'this device'}"
            ),
            tolerance=cross_tolerance,
        )
    text = f"efficiency (other device: {entry.device} vs {record.device})"
    ratio = (current_median / rt_now) / (entry.median_s / rt_base)
    if cross_cpu != "gate" and (is_cpu(record.device) or is_cpu(entry.device)):
        change = ratio - 1.0
        return Incomparable(
            text=text,
            reason=(
                f"the baseline is from another CPU or thread count ({entry.device} vs "
                f"{record.device}): time relative to the roofline changed by "
                f"{pct_text(change)}, reported as information only, because CPU efficiency "
                "does not carry across CPUs. Save a baseline on this machine "
                "(--kernelpro-save-baseline), or gate it with --kernelpro-cpu-cross-device=gate"
            ),
            tolerance=cross_tolerance,
            change=change,
        )
    chosen = Basis(
        text=text,
        tolerance=cross_tolerance,
        now=[v / rt_now for v in samples],
        ref=[v / rt_base for v in entry.samples_s],
        ratio=ratio,
    )
    # This run's time on the baseline's roofline: time relative to each side's roofline.
    chosen.gated("roofline-scaled", current_median * rt_base / rt_now, entry.median_s)
    return chosen
