"""The verdict's basis: which time one kernel's verdict is decided on, at which tolerance, and
why. `choose_basis` takes the current measurement and its baseline entry and returns a `Basis`
(the samples of both sides, their median ratio, the tolerance, the label of the time compared
and the factors applied to it) or an `Incomparable` (why no gate is possible); the verdict
(`verdict.py`) then decides the status on whatever the basis hands over.

- **Same device, steady clock:** the times, at the kernel's threshold.
- **Same device, capped, anchored on both sides** (either side's samples mostly in rounds
  with a clock-lowering NVML reason, and both timed in pairs with the same anchor,
  `--kernelpro-clock-anchor=on`): the per-pair kernel / anchor ratios at
  `ANCHOR_THRESHOLD_FACTOR` times the threshold (the anchor ran at the same clock, so the
  ratio cancels it).
- **Same device, clock-limited without the anchor on both sides** (either side's SM clock
  held below `CLOCK_LIMITED_FRACTION` of its maximum by a power or thermal limit): the times
  at `CLOCK_LIMITED_FACTOR` times the threshold; where one side has anchored samples, the
  basis says why they were not used.
- **Same device, `clock_normalize`:** times scaled by the NVML mean SM clock (cycles; for
  comparing rules only).
- **Same CPU with the CPU anchor on both sides:** the kernel's on-CPU time read against the
  anchor.
- **Another device:** samples divided by each side's roofline time, so the comparison is of
  time relative to the roofline (1 / efficiency), at the wider cross-device tolerance.
  Another CPU is information only unless `cross_cpu="gate"`
  (`--kernelpro-cpu-cross-device=gate`): a CPU's efficiency does not carry across CPU models,
  and the thread count is part of a CPU device's name.

**Clock-limited kernels.** A compute-bound kernel (fp16/bf16/TF32 GEMMs, attention) runs at
the GPU's power cap: the SM clock the cap allows moves from one measurement to the next, and
the kernel's time with it, so two measurements of the same code differ by more than the
default threshold. When either side ran with the SM clock held below `CLOCK_LIMITED_FRACTION`
of its maximum by a clock-lowering reason on at least `CAPPED_SHARE` of its samples, a
regression must exceed `CLOCK_LIMITED_FACTOR` times the threshold; smaller changes are
"suspect" with the reason. Comparing cycles (`clock_normalize`) is not the default: the mean
NVML SM clock of a measurement does not follow its kernel's time, and the scaling widened the
capped GEMMs' spread (bench/results/2026-12-01-gate-accuracy-h200.md).

**The clock anchor.** A kernel whose warm-up ran capped is timed in pairs
(`measure/timing/anchor.py`): every sample is followed in its round by a fixed bf16 GEMM, so
both ran at about the clock the cap allowed. The cap moves kernel and anchor alike, so their
ratio spreads far less than either time between two measurements of the same code; kernel and
anchor do not slow down exactly alike when the clock drops, so the ratio keeps a tolerance of
its own. Kernels at a steady clock are never anchored. Where the anchor cannot be used (a
baseline saved without pairs, another torch or CUDA build, a side whose warm-up was not
capped) the rule without the anchor holds and the basis says why
(bench/results/2026-12-01-gate-accuracy-h200.md).

**The CPU anchor.** Every CPU sample is followed by a fixed GEMM, both charged in on-CPU time
(`measure/timing/on_cpu.py`). The compared change is the one nearer to zero of `time_change`
(the kernel's on-CPU median, now / baseline - 1) and `anchored_change` ((1 + time_change) /
(1 + anchor_move) - 1, where `anchor_move` is the anchor's own speed from the fastest quarter
of its calls): a slowdown must show both in the kernel's own on-CPU time and relative to the
anchor: on a busy machine each alone raises false alarms that the pair does not
(bench/results/2026-12-02-cpu-gate-cpu.md). The tolerance is the largest of the threshold,
`PROCESS_TOLERANCE` (an unchanged kernel's on-CPU median moves between processes with where
its inputs land in physical memory, which no anchor feels), `|anchor_move|`, the kernel's own
scatter (IQR / median, either side) and, on a busy machine, `BUSY_TOLERANCE`. The fastest
decile must move by more than half that tolerance (at least the threshold, `lower_bar`).
"Suspect" only where the anchor itself shows the measurement unusable (`UNUSABLE_ANCHOR_MOVE`,
`UNUSABLE_ANCHOR_SCATTER`); a change within a widened tolerance is "ok" with why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.gate.baseline import (
    AnchorSide,
    BaselineEntry,
    ClockFacts,
    CpuAnchorSide,
    finite_array,
    positive,
    positive_list,
    record_anchor,
    record_clock_facts,
    record_cpu_anchor,
)

if TYPE_CHECKING:
    import numpy as np

    from pytest_kernelpro.record import KernelRecord

CAPPED_SHARE = 0.5  # at least this share of a measurement's samples under a clock limit
CLOCK_LIMITED_FRACTION = 0.95  # mean SM clock below this share of the maximum: held down
CLOCK_LIMITED_FACTOR = 3.0  # the tolerance of a clock-limited comparison, times the threshold
# The anchored ratio's tolerance, times the kernel's threshold: the ratio spreads less than
# the times, so a smaller factor still raises no false alarm and catches small slowdowns the
# full threshold misses (bench/results/2026-12-01-gate-accuracy-h200.md).
ANCHOR_THRESHOLD_FACTOR = 0.75

CPU_ANCHOR_PREFIX = "cpu anchor:"  # measure/timing/cpu.cpu_anchor_name
# The tolerance on a busy machine: above what an unchanged kernel's compared change reaches
# between sessions there, below what a 2x slowdown reads (bench/results/2026-12-02-cpu-gate-cpu.md).
BUSY_TOLERANCE = 0.35
# The least tolerance of any CPU-anchored comparison: above what an unchanged kernel's compared
# change reaches between fresh processes on a quiet machine, below what a kernel doing twice
# the work reads (bench/results/2026-12-02-cpu-gate-cpu.md).
PROCESS_TOLERANCE = 0.25
UNUSABLE_ANCHOR_MOVE = 0.5  # the anchor's speed moved more than this: the machines differ
UNUSABLE_ANCHOR_SCATTER = 1.0  # the anchor's own calls scattered more than this (IQR / median)
ANCHOR_QUANTILE = 0.25  # the anchor's speed: the fastest quarter of its calls
UNUSABLE_WORDS = "the CPU anchor shows the measurement unusable"  # how `unusable` begins


def median(values: Sequence[float] | np.ndarray) -> float:
    """Median of the finite values (NaN when there are none)."""
    import numpy as np

    arr = finite_array(values)
    return float(np.median(arr)) if len(arr) else float("nan")


def quantile(values: Sequence[float], q: float) -> float:
    """The `q` quantile of `values` (numpy's linear interpolation)."""
    import numpy as np

    return float(np.quantile(np.asarray(values, dtype=float), q))


def pct_text(x: float) -> str:
    return f"{x * 100:+.1f}%"


def same_device(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def is_cpu(device: str) -> bool:
    return device.strip().casefold().startswith("cpu")


# The baseline entry's side of each fact (the record's side: `baseline.record_clock_facts`,
# `record_anchor`, `record_cpu_anchor`).


def entry_clock_facts(entry: BaselineEntry) -> ClockFacts:
    return ClockFacts(
        sm_mhz=positive(entry.sm_mhz),
        capped_share=entry.clock_capped_share,
        bound=entry.bound,
        max_sm_mhz=positive(entry.max_sm_mhz),
    )


def entry_anchor(entry: BaselineEntry) -> AnchorSide | None:
    ratios = tuple(entry.anchor_ratios or ())
    if not entry.anchor or not ratios or not entry.anchor_median_s:
        return None
    return AnchorSide(entry.anchor, float(entry.anchor_median_s), ratios)


def entry_cpu_anchor(entry: BaselineEntry) -> CpuAnchorSide | None:
    kernel, anchors = positive_list(entry.cpu_kernel_s), positive_list(entry.cpu_anchor_s)
    if not entry.anchor or not kernel or not anchors:
        return None
    return CpuAnchorSide(entry.anchor, kernel, anchors, entry.cpu_busy)


# The clock rules (module docstring).


def _capped(facts: ClockFacts) -> bool:
    return facts.capped_share is not None and facts.capped_share >= CAPPED_SHARE


def clock_limited(facts: ClockFacts) -> bool:
    """The samples ran with the SM clock held below 95% of its maximum by a limit."""
    return (
        _capped(facts)
        and facts.sm_mhz is not None
        and facts.max_sm_mhz is not None
        and facts.sm_mhz < CLOCK_LIMITED_FRACTION * facts.max_sm_mhz
    )


def clock_limit_text(current: ClockFacts, baseline: ClockFacts) -> str | None:
    """Why the comparison is clock-limited ("the SM clock was held at 1568 of 1980 MHz by a
    power or thermal limit in this run"), or None when neither side was."""
    sides = []
    for label, facts in (("this run", current), ("the baseline", baseline)):
        if clock_limited(facts):
            sides.append(f"{facts.sm_mhz:.0f} of {facts.max_sm_mhz:.0f} MHz in {label}")
    if not sides:
        return None
    return "SM clock held at " + " and ".join(sides) + " by a power or thermal limit"


def capped_text(current: ClockFacts, baseline: ClockFacts) -> str | None:
    """Why the comparison counts as capped ("samples under a clock limit: 100% in this run,
    95% in the baseline"), or None when neither side ran mostly under a limit."""
    if not (_capped(current) or _capped(baseline)):
        return None
    parts = []
    for label, facts in (("this run", current), ("the baseline", baseline)):
        share = "unknown" if facts.capped_share is None else f"{facts.capped_share:.0%}"
        clock = ""
        if facts.sm_mhz is not None and facts.max_sm_mhz is not None:
            clock = f" at {facts.sm_mhz:.0f} of {facts.max_sm_mhz:.0f} MHz"
        parts.append(f"{share} in {label}{clock}")
    return "samples under a power or thermal limit: " + ", ".join(parts)


@dataclass(frozen=True)
class ClockScale:
    """The factor that brings the current samples to the baseline's clock, and why."""

    factor: float  # current SM MHz / baseline SM MHz
    sm_mhz: float
    baseline_sm_mhz: float

    def describe(self) -> str:
        return (
            f"cycles: times scaled to the baseline's SM clock ({self.sm_mhz:.0f} MHz now, "
            f"{self.baseline_sm_mhz:.0f} MHz in the baseline, under the power or thermal cap)"
        )


def clock_scale(current: ClockFacts, baseline: ClockFacts) -> ClockScale | None:
    """The scale of `clock_normalize` (module docstring), or None to compare plain times."""
    if current.sm_mhz is None or baseline.sm_mhz is None:
        return None
    if not (_capped(current) or _capped(baseline)):
        return None
    bound = current.bound or baseline.bound
    if bound != "compute" or (baseline.bound not in (None, "compute")):
        return None
    return ClockScale(current.sm_mhz / baseline.sm_mhz, current.sm_mhz, baseline.sm_mhz)


def anchor_missing(now: AnchorSide | None, base: AnchorSide | None) -> str | None:
    """Why two sides cannot be compared relative to the clock anchor, or None when they can."""
    if base is None and now is None:
        return "neither side was timed in pairs with the anchor (--kernelpro-clock-anchor=on)"
    if base is None:
        return (
            "the baseline has no anchored samples (saved by a version before them, with "
            "--kernelpro-clock-anchor=off, or with a warm-up at a steady clock): re-save it "
            "to gate this kernel relative to the anchor"
        )
    if now is None:
        return (
            "this run has no anchored samples (--kernelpro-clock-anchor is off, or its "
            "warm-up ran without a clock limit)"
        )
    if now.name != base.name:
        return f"the anchor differs ({now.name} now, {base.name} in the baseline)"
    return None


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
    """The bar a change in the same direction must also clear, beside the median's tolerance:
    the fastest decile's move (module docstring) and a re-measurement that confirms a
    regression (`gate/confirmation.py`). Half the tolerance, at least the threshold."""
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

    @property
    def anchored_change(self) -> float:
        return (1.0 + self.time_change) / (1.0 + self.anchor_move) - 1.0

    @property
    def change(self) -> float:
        """The compared change: of the time change and the anchored change, the one nearer
        to zero (opposite signs: no agreed direction, the smaller one still)."""
        return min((self.time_change, self.anchored_change), key=abs)

    @property
    def tolerance(self) -> float:
        return max(
            self.threshold,
            PROCESS_TOLERANCE,
            abs(self.anchor_move),
            self.scatter_now,
            self.scatter_base,
            BUSY_TOLERANCE if self.busy else 0.0,
        )

    @property
    def widened(self) -> str | None:
        """Why the tolerance is above the threshold, or None."""
        if self.tolerance <= self.threshold:
            return None
        why = f"the tolerance follows the machine: {self.facts()}"
        if self.busy and self.tolerance <= BUSY_TOLERANCE:
            why += f"; timed on a busy machine ({self.busy})"
        elif self.tolerance <= PROCESS_TOLERANCE:
            why += (
                f"; at least {PROCESS_TOLERANCE:.0%} between two processes on a CPU (where a "
                "kernel's inputs land in memory moves its time)"
            )
        return why

    def facts(self) -> str:
        return (
            f"on-CPU time {self.time_change * 100:+.1f}%, the anchor GEMM's "
            f"{self.anchor_move * 100:+.1f}%, relative to the anchor "
            f"{self.anchored_change * 100:+.1f}%; the kernel's calls scattered "
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
    now: CpuAnchorSide, base: CpuAnchorSide, threshold: float
) -> CpuAnchorComparison:
    """The facts of comparing two CPU-anchored sides at `threshold` (module docstring)."""
    import numpy as np

    busy = [
        f"{label}: {side.busy}" for label, side in (("now", now), ("baseline", base)) if side.busy
    ]
    return CpuAnchorComparison(
        threshold=threshold,
        time_change=float(np.median(now.kernel_s) / np.median(base.kernel_s)) - 1.0,
        anchor_move=anchor_speed_s(now) / anchor_speed_s(base) - 1.0,
        scatter_now=scatter(now.kernel_s),
        scatter_base=scatter(base.kernel_s),
        anchor_scatter_now=scatter(now.anchor_s),
        anchor_scatter_base=scatter(base.anchor_s),
        busy="; ".join(busy) or None,
    )


# The basis: what `choose_basis` hands the verdict.


@dataclass
class Basis:
    """The samples to compare, their tolerance, and how to word and show the change."""

    text: str  # the verdict's basis
    tolerance: float
    now: list[float]
    ref: list[float]
    ratio: float  # now / baseline of the compared quantity's median
    unit: str = ""  # after "slower by 3.1%": " in cycles", " relative to the clock anchor"
    detail: str = ""  # after the tolerance inside the parentheses
    # CPU anchor: the load is cancelled by the anchor, so an oversubscribed timing is no
    # reason for "suspect"; `widened` says why the tolerance is above the threshold,
    # `unusable` why the anchor shows the measurement cannot gate.
    load_cancelled: bool = False
    # The fastest decile's tolerance when not the basis's (the CPU anchor: a tolerance widened
    # for between-session noise would ask the noisy decile for more than the median).
    low_tolerance: float | None = None
    widened: str | None = None
    unusable: str | None = None
    # The time the verdict is decided on when it is not the wall median (the number shown is
    # the number gated): its label ("on-CPU", "on-CPU, anchor-scaled", "clock-scaled",
    # "anchor-scaled", "roofline-scaled"), now and in the baseline; now / baseline is `ratio`.
    gated_label: str | None = None
    gated_now_s: float | None = None
    gated_baseline_s: float | None = None
    # The factors applied and why (the Verdict fields of the same names):
    clock_scale: float | None = None  # current SM MHz / baseline SM MHz, applied to `now`
    sm_mhz: float | None = None
    baseline_sm_mhz: float | None = None
    raw_change: float | None = None  # the change of the unscaled median time
    clock_limited: str | None = None  # why the tolerance was widened (clock held by a limit)
    anchor: str | None = None  # the anchor's identity
    anchor_change: float | None = None  # the anchor's own median, now / baseline - 1

    def gated(self, label: str, now_s: float, baseline_s: float) -> None:
        """Name the time this basis compares when it is not the wall median."""
        self.gated_label, self.gated_now_s, self.gated_baseline_s = label, now_s, baseline_s

    def verdict_fields(self) -> dict[str, Any]:
        """The Verdict fields this basis sets (those it left unset stay the Verdict's None)."""
        names = (
            "gated_label", "gated_now_s", "gated_baseline_s", "clock_scale", "sm_mhz",
            "baseline_sm_mhz", "raw_change", "clock_limited", "anchor", "anchor_change",
        )  # fmt: skip
        return {name: getattr(self, name) for name in names}


@dataclass
class Incomparable:
    """No gate on this pair: the basis, the reason and the change where one exists."""

    text: str
    reason: str
    tolerance: float
    change: float | None = None


def choose_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    *,
    threshold: float,
    cross_tolerance: float,
    cross_cpu: str = "info",
    clock_normalize: bool = False,
    widen_when_clock_limited: bool = True,
    clock_anchor: bool = True,
    anchor_threshold: float | None = None,
) -> Basis | Incomparable:
    """What the verdict of `record` (its positive timing `samples`) against `entry` is decided
    on (module docstring).

    `clock_anchor=False` ignores the anchored samples, `anchor_threshold` replaces the
    tolerance of an anchored comparison (default: 0.75x the threshold), and
    `widen_when_clock_limited=False` keeps the plain threshold for clock-limited comparisons
    (both for comparing rules on the same measurements); `clock_normalize=True` compares
    cycles where `clock_scale` applies (measured worse than plain times on the H200; for
    comparison only).
    """
    current_median = record.median_s if record.median_s is not None else median(samples)
    if not same_device(record.device, entry.device):
        return cross_device_basis(
            record, entry, samples, current_median, cross_tolerance, cross_cpu
        )
    return same_device_basis(
        record,
        entry,
        samples,
        current_median,
        threshold,
        widen_when_clock_limited=widen_when_clock_limited,
        clock_normalize=clock_normalize,
        clock_anchor=clock_anchor,
        anchor_threshold=anchor_threshold,
    )


def same_device_basis(
    record: KernelRecord,
    entry: BaselineEntry,
    samples: list[float],
    current_median: float,
    threshold: float,
    *,
    widen_when_clock_limited: bool,
    clock_normalize: bool,
    clock_anchor: bool,
    anchor_threshold: float | None = None,
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
    if is_cpu(device) and clock_anchor:
        cpu_now, cpu_base = record_cpu_anchor(record), entry_cpu_anchor(entry)
        missing = cpu_anchor_missing(cpu_now, cpu_base)
        if missing is None:
            assert cpu_now is not None
            assert cpu_base is not None
            return cpu_anchored_basis(device, cpu_now, cpu_base, chosen.ratio, threshold)
        chosen.text = f"time (same device: {device}; no CPU anchor: {missing})"
        return chosen
    now, base = record_anchor(record), entry_anchor(entry)
    facts_now, facts_base = record_clock_facts(record), entry_clock_facts(entry)
    limited = clock_limit_text(facts_now, facts_base)
    capped = capped_text(facts_now, facts_base)
    if capped is not None and clock_anchor:
        missing = anchor_missing(now, base)
        if missing is None:
            assert now is not None
            assert base is not None
            return anchored_basis(
                device, now, base, limited or capped, chosen.ratio,
                threshold * ANCHOR_THRESHOLD_FACTOR if anchor_threshold is None
                else anchor_threshold,
                facts_now.sm_mhz, facts_base.sm_mhz,
            )  # fmt: skip
        if now is not None or base is not None:
            note = f"no clock anchor: {missing}"
            if limited is not None:
                limited = f"{limited}; {note}"
            else:
                chosen.text = f"time (same device: {device}; {capped}; {note})"
    if limited is not None and widen_when_clock_limited:
        chosen.tolerance = round(threshold * CLOCK_LIMITED_FACTOR, 12)
        chosen.text = (
            f"time (same device: {device}; {limited}: tolerance "
            f"{CLOCK_LIMITED_FACTOR:g}x the threshold)"
        )
        chosen.clock_limited = limited
        chosen.sm_mhz, chosen.baseline_sm_mhz = facts_now.sm_mhz, facts_base.sm_mhz
    scale = clock_scale(facts_now, facts_base) if clock_normalize else None
    if scale is not None:
        _scale_to_baseline_clock(chosen, scale, device, samples, current_median, entry.median_s)
    return chosen


def _scale_to_baseline_clock(
    chosen: Basis,
    scale: ClockScale,
    device: str,
    samples: list[float],
    current_median: float,
    baseline_median: float,
) -> None:
    """Make `chosen` compare cycles: this run's samples at the baseline's SM clock."""
    chosen.text = f"{scale.describe()} (same device: {device})"
    chosen.now = [v * scale.factor for v in samples]
    chosen.clock_scale = scale.factor
    chosen.sm_mhz, chosen.baseline_sm_mhz = scale.sm_mhz, scale.baseline_sm_mhz
    chosen.raw_change = chosen.ratio - 1.0
    chosen.unit = " in cycles"
    chosen.detail = (
        f"; plain time {pct_text(chosen.ratio - 1.0)}, SM clock {scale.sm_mhz:.0f} MHz vs "
        f"{scale.baseline_sm_mhz:.0f} MHz in the baseline, a power or thermal cap setting "
        "the clock"
    )
    chosen.ratio *= scale.factor
    chosen.gated("clock-scaled", current_median * scale.factor, baseline_median)


def anchored_basis(
    device: str,
    now: AnchorSide,
    base: AnchorSide,
    why: str,
    time_ratio: float,
    tolerance: float,
    sm_mhz: float | None,
    baseline_sm_mhz: float | None,
) -> Basis:
    """The per-pair kernel / anchor ratios of both sides (the clock anchor)."""
    anchor_change = now.anchor_median_s / base.anchor_median_s - 1.0
    chosen = Basis(
        text=(
            f"time relative to the clock anchor (same device: {device}; {why}: kernel / "
            f"{now.name}, each sample followed by the anchor in its round, so both ran at the "
            "clock the limit allowed)"
        ),
        tolerance=tolerance,
        now=list(now.ratios),
        ref=list(base.ratios),
        ratio=median(list(now.ratios)) / median(list(base.ratios)),
        anchor=now.name,
        anchor_change=anchor_change,
        raw_change=time_ratio - 1.0,
        sm_mhz=sm_mhz,
        baseline_sm_mhz=baseline_sm_mhz,
        unit=" relative to the clock anchor",
        detail=f"; plain time {pct_text(time_ratio - 1.0)}, anchor GEMM {pct_text(anchor_change)}, {why}",
    )
    # The kernel's time at the baseline's anchor speed: its per-pair ratio times that speed.
    chosen.gated(
        "anchor-scaled",
        median(list(now.ratios)) * base.anchor_median_s,
        median(list(base.ratios)) * base.anchor_median_s,
    )
    return chosen


def cpu_anchored_basis(
    device: str, now: CpuAnchorSide, base: CpuAnchorSide, time_ratio: float, threshold: float
) -> Basis:
    """The kernel's on-CPU samples of both sides, read against the CPU anchor."""
    facts = cpu_anchor_comparison(now, base, threshold)
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
    # The compared change is the on-CPU time's or the anchored one's (`CpuAnchorComparison.
    # change`): the time shown is the one of the two the verdict took.
    now_s, base_s = median(list(now.kernel_s)), median(list(base.kernel_s))
    if facts.change == facts.time_change:
        chosen.gated("on-CPU", now_s, base_s)
    else:
        chosen.gated("on-CPU, anchor-scaled", now_s / (1.0 + facts.anchor_move), base_s)
    return chosen


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
