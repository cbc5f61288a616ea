"""The verdict's basis: which time one kernel's verdict is decided on, at which tolerance, and
why (`choose_basis`: a `Basis`, or an `Incomparable` where no gate is possible).

- **Same device, steady clock:** the times, at the kernel's threshold.
- **Same GPU, under a clock limit** (capped, clock-limited, anchored): `clock_basis.py`.
- **Same CPU with the CPU anchor on both sides:** the kernel's on-CPU time read against the
  anchor.
- **Another device:** time relative to each side's roofline: `other_device_basis.py`.

**The CPU anchor.** Every CPU sample is followed by a fixed GEMM, both charged in on-CPU time
(`measure/timing/on_cpu.py`). The compared change is the one nearer to zero of `time_change`
(the kernel's on-CPU median, now / baseline - 1) and `anchored_change` ((1 + time_change) /
(1 + anchor_move) - 1, where `anchor_move` is the anchor's own speed from the fastest quarter
of its calls): a slowdown must show both in the kernel's own on-CPU time and relative to the
anchor: on a busy machine each alone raises false alarms that the pair does not
(bench/results/2026-12-02-cpu-gate-cpu.md). The tolerance is the largest of the threshold,
`PROCESS_TOLERANCE` (an unchanged kernel's on-CPU median moves between processes with where
its inputs land in physical memory, which no anchor feels), `|anchor_move|`, the kernel's own
scatter (IQR / median, either side) and, on a busy machine, `BUSY_TOLERANCE`
(`BUSY_MEMORY_TOLERANCE` for a kernel read against the memory anchor). The fastest
decile must move by more than half that tolerance (at least the threshold, `lower_bar`).
"Suspect" only where the anchor itself shows the measurement unusable (`UNUSABLE_ANCHOR_MOVE`,
`UNUSABLE_ANCHOR_SCATTER`); a change within a widened tolerance is "ok" with why.

**The memory anchor.** Another process's memory traffic slows a memory-bound kernel and not
the GEMM (which runs from the core's own cache). For a kernel whose reference is not
compute-bound, with the memory anchor on both sides, the change relative to it (`memory_move`,
its fastest quarter) is a third candidate of the nearest-to-zero change; moved more than
`UNUSABLE_ANCHOR_MOVE`, it shows the measurement unusable. A compute-bound kernel is never read
against it: the memory does not set its time, and would excuse its regression.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_kernelpro.gate.baseline import (
    BaselineEntry,
    Basis,
    CpuAnchorSide,
    Incomparable,
    is_cpu,
    median,
    pct_text,
    positive_list,
    record_cpu_anchor,
    same_device,
)

if TYPE_CHECKING:
    from pytest_kernelpro.record import KernelRecord

CPU_ANCHOR_PREFIX = "cpu anchor:"  # measure/timing/cpu.cpu_anchor_name
# The tolerance on a busy machine: above what an unchanged kernel's compared change reaches
# between sessions there, below what a 2x slowdown reads (bench/results/2026-12-02-cpu-gate-cpu.md).
BUSY_TOLERANCE = 0.35
# The same for a kernel that is not compute-bound, read against the memory anchor as well: on
# a busy machine an unchanged one read +40% to +49% with both anchors still (the CI's main job,
# confirmed in a fresh process; the memory anchor does not feel a neighbour taking the shared
# cache), and one doing twice the work +73% to +91% (bench/results/2026-12-06-cpu-gate-memory-cpu.md).
BUSY_MEMORY_TOLERANCE = 0.6
# The least tolerance of any CPU-anchored comparison: above what an unchanged kernel's compared
# change reaches between fresh processes on a quiet machine, below what a kernel doing twice
# the work reads (bench/results/2026-12-02-cpu-gate-cpu.md).
PROCESS_TOLERANCE = 0.25
UNUSABLE_ANCHOR_MOVE = 0.5  # the anchor's speed moved more than this: the machines differ
UNUSABLE_ANCHOR_SCATTER = 1.0  # the anchor's own calls scattered more than this (IQR / median)
ANCHOR_QUANTILE = 0.25  # the anchor's speed: the fastest quarter of its calls
UNUSABLE_WORDS = "the CPU anchor shows the measurement unusable"  # how `unusable` begins


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` (numpy's linear interpolation)."""
    import numpy as np

    return float(np.quantile(np.asarray(values, dtype=float), q))


# The baseline entry's side of the CPU anchor (the record's: `baseline.record_cpu_anchor`).


def entry_cpu_anchor(entry: BaselineEntry) -> CpuAnchorSide | None:
    kernel, anchors = positive_list(entry.cpu_kernel_s), positive_list(entry.cpu_anchor_s)
    if not entry.anchor or not kernel or not anchors:
        return None
    memory = positive_list(entry.cpu_memory_s)
    return CpuAnchorSide(entry.anchor, kernel, anchors, entry.cpu_busy, memory)


# The CPU anchor's rule (module docstring).


def scatter(values: Sequence[float]) -> float:
    """Interquartile range over the median (0 for fewer than 4 values)."""
    import numpy as np

    kept = [v for v in values if v > 0]
    if len(kept) < 4:
        return 0.0
    low, med, high = np.quantile(np.asarray(kept, dtype=float), (0.25, 0.5, 0.75)).tolist()
    return (high - low) / med if med > 0 else 0.0


def anchor_speed_s(side: CpuAnchorSide) -> float:
    """The CPU anchor's speed on one side: the fastest quarter of its calls."""
    return quantile(side.anchor_s, ANCHOR_QUANTILE)


def lower_bar(threshold: float, tolerance: float) -> float:
    """The bar the fastest decile's move and a confirming re-measurement must also clear,
    beside the median's tolerance: half the tolerance, at least the threshold."""
    return max(threshold, tolerance / 2.0)


def cpu_anchor_missing(now: CpuAnchorSide | None, base: CpuAnchorSide | None) -> str | None:
    """Why a CPU comparison cannot be made relative to the CPU anchor, or None when it can."""
    if base is None:
        return (
            "the baseline has no CPU-anchored samples (saved by an older version or with "
            "--kernelpro-clock-anchor=off): re-save it to gate this kernel relative to the "
            "CPU anchor"
        )
    if now is None:
        return "this run has no CPU-anchored samples (--kernelpro-clock-anchor=off)"
    if now.name != base.name:
        return f"the CPU anchor differs ({now.name} now, {base.name} in the baseline)"
    return None


@dataclass(frozen=True)
class CpuAnchorComparison:
    """The facts of one CPU-anchored comparison (module docstring)."""

    threshold: float
    time_change: float
    anchor_move: float
    scatter_now: float
    scatter_base: float
    anchor_scatter_now: float
    anchor_scatter_base: float
    busy: str | None  # why either side counts as busy
    memory_move: float | None = None  # the memory anchor's, where the kernel is read against it

    @property
    def anchored_change(self) -> float:
        return (1.0 + self.time_change) / (1.0 + self.anchor_move) - 1.0

    @property
    def memory_anchored_change(self) -> float | None:
        if self.memory_move is None:
            return None
        return (1.0 + self.time_change) / (1.0 + self.memory_move) - 1.0

    @property
    def change(self) -> float:
        """The compared change: of the time change and the anchored changes, the one nearer
        to zero (opposite signs: no agreed direction, the smaller one still)."""
        changes = [self.time_change, self.anchored_change]
        if self.memory_anchored_change is not None:
            changes.append(self.memory_anchored_change)
        return min(changes, key=abs)

    @property
    def tolerance(self) -> float:
        return max(
            self.threshold,
            PROCESS_TOLERANCE,
            abs(self.anchor_move),
            self.scatter_now,
            self.scatter_base,
            self.busy_tolerance,
        )

    @property
    def busy_tolerance(self) -> float:
        """The busy machine's part of the tolerance (0 on a quiet one)."""
        if not self.busy:
            return 0.0
        return BUSY_MEMORY_TOLERANCE if self.memory_move is not None else BUSY_TOLERANCE

    @property
    def widened(self) -> str | None:
        """Why the tolerance is above the threshold, or None."""
        if self.tolerance <= self.threshold:
            return None
        why = f"the tolerance follows the machine: {self.facts()}"
        if self.busy and self.tolerance <= self.busy_tolerance:
            why += f"; timed on a busy machine ({self.busy})"
        elif self.tolerance <= PROCESS_TOLERANCE:
            why += (
                f"; at least {PROCESS_TOLERANCE:.0%} between two processes on a CPU (where a "
                "kernel's inputs land in memory moves its time)"
            )
        return why

    def facts(self) -> str:
        memory = ""
        if self.memory_move is not None and self.memory_anchored_change is not None:
            memory = (
                f", the memory anchor's {self.memory_move * 100:+.1f}%, relative to it "
                f"{self.memory_anchored_change * 100:+.1f}%"
            )
        return (
            f"on-CPU time {self.time_change * 100:+.1f}%, the anchor GEMM's "
            f"{self.anchor_move * 100:+.1f}%, relative to the anchor "
            f"{self.anchored_change * 100:+.1f}%{memory}; the kernel's calls scattered "
            f"{self.scatter_now:.0%} now, {self.scatter_base:.0%} in the baseline"
        )

    def unusable(self) -> str | None:
        """Why the anchor shows the measurement unusable, or None when it is usable."""
        problems = []
        if abs(self.anchor_move) > UNUSABLE_ANCHOR_MOVE:
            problems.append(
                f"the anchor GEMM's own time moved by {self.anchor_move * 100:+.0f}% since the "
                "baseline"
            )
        if self.memory_move is not None and abs(self.memory_move) > UNUSABLE_ANCHOR_MOVE:
            problems.append(
                f"the memory anchor's own time moved by {self.memory_move * 100:+.0f}% since "
                "the baseline"
            )
        worst = max(self.anchor_scatter_now, self.anchor_scatter_base)
        if worst > UNUSABLE_ANCHOR_SCATTER:
            problems.append(f"the anchor GEMM's own calls scattered by {worst:.0%}")
        if not problems:
            return None
        return (
            f"{UNUSABLE_WORDS} (" + " and ".join(problems) + "): other work "
            "changed the machine's speed too much to tell the kernel's change. Re-run on a "
            "quieter machine"
        )


def cpu_anchor_comparison(
    now: CpuAnchorSide, base: CpuAnchorSide, threshold: float, bound: str | None = None
) -> CpuAnchorComparison:
    """The facts of comparing two CPU-anchored sides (module docstring)."""
    import numpy as np

    busy = [
        f"{label}: {side.busy}" for label, side in (("now", now), ("baseline", base)) if side.busy
    ]
    memory_move = None
    if bound != "compute" and now.memory_s and base.memory_s:
        memory_move = (
            quantile(now.memory_s, ANCHOR_QUANTILE) / quantile(base.memory_s, ANCHOR_QUANTILE) - 1.0
        )
    return CpuAnchorComparison(
        threshold=threshold,
        time_change=float(np.median(now.kernel_s) / np.median(base.kernel_s)) - 1.0,
        anchor_move=anchor_speed_s(now) / anchor_speed_s(base) - 1.0,
        scatter_now=scatter(now.kernel_s),
        scatter_base=scatter(base.kernel_s),
        anchor_scatter_now=scatter(now.anchor_s),
        anchor_scatter_base=scatter(base.anchor_s),
        busy="; ".join(busy) or None,
        memory_move=memory_move,
    )


def choose_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    *,
    threshold: float,
    cross_tolerance: float,
    cross_cpu: str = "info",
) -> Basis | Incomparable:
    """What the verdict of `record` against `entry` is decided on (module docstring)."""
    current_median = record.median_s if record.median_s is not None else median(samples)
    if not same_device(record.device, entry.device):
        from pytest_kernelpro.gate.other_device_basis import cross_device_basis

        return cross_device_basis(
            record, entry, samples, current_median, cross_tolerance, cross_cpu
        )
    return same_device_basis(record, entry, samples, current_median, threshold)


def same_device_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    current_median: float,
    threshold: float,
) -> Basis:
    """The basis of a comparison on the same device (module docstring)."""
    device = record.device or "unknown"
    chosen = Basis(
        text=f"time (same device: {device})",
        tolerance=threshold,
        now=samples,
        ref=list(entry.samples_s),
        ratio=current_median / entry.median_s,
    )
    if is_cpu(device):
        cpu_now, cpu_base = record_cpu_anchor(record), entry_cpu_anchor(entry)
        missing = cpu_anchor_missing(cpu_now, cpu_base)
        if missing is None:
            assert cpu_now is not None
            assert cpu_base is not None
            bound = record.roofline.bound if record.roofline else None
            return cpu_anchored_basis(device, cpu_now, cpu_base, chosen.ratio, threshold, bound)
        chosen.text = f"time (same device: {device}; no CPU anchor: {missing})"
        return chosen
    from pytest_kernelpro.gate.clock_basis import clock_basis

    return clock_basis(chosen, record, entry, threshold)


def cpu_anchored_basis(
    device: str,
    now: CpuAnchorSide,
    base: CpuAnchorSide,
    time_ratio: float,
    threshold: float,
    bound: str | None = None,
) -> Basis:
    """The kernel's on-CPU samples of both sides, read against the CPU anchor (and the
    memory anchor, for a kernel that is not compute-bound)."""
    facts = cpu_anchor_comparison(now, base, threshold, bound)
    chosen = Basis(
        text=(
            f"on-CPU time checked against the CPU anchor (same device: {device}; "
            f"{now.name.removeprefix(CPU_ANCHOR_PREFIX).strip()} after each sample)"
        ),
        tolerance=facts.tolerance,
        now=list(now.kernel_s),
        ref=list(base.kernel_s),
        ratio=1.0 + facts.change,
        anchor=now.name,
        anchor_change=facts.anchor_move,
        raw_change=time_ratio - 1.0,
        unit=" in on-CPU time and relative to the CPU anchor",
        detail=f"; wall time {pct_text(time_ratio - 1.0)}, {facts.facts()}",
        load_cancelled=True,
        low_tolerance=lower_bar(threshold, facts.tolerance),
        widened=facts.widened,
        unusable=facts.unusable(),
    )
    # The time shown is the one whose change the verdict took (`CpuAnchorComparison.change`).
    now_s, base_s = median(list(now.kernel_s)), median(list(base.kernel_s))
    if facts.change == facts.time_change:
        chosen.gated("on-CPU", now_s, base_s)
    elif facts.change == facts.anchored_change:
        chosen.gated("on-CPU, anchor-scaled", now_s / (1.0 + facts.anchor_move), base_s)
    else:
        assert facts.memory_move is not None
        chosen.gated("on-CPU, memory-anchor-scaled", now_s / (1.0 + facts.memory_move), base_s)
    return chosen
