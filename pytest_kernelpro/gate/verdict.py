"""The gate's verdict on one kernel: compare a record with its baseline entry, on a basis (what
is compared, at which tolerance) chosen first.

How a regression is decided, and why:

1. **Effect size.** The relative change of the median (current / baseline - 1) must be
   beyond the kernel's threshold (default 2% on a CUDA GPU, 5% on the CPU; see
   `default_threshold`). The median, not the mean: one preempted
   sample must not move the center (pytest-benchmark users gate on `median:` for that reason).
2. **Statistical clarity.** A one-sided Mann-Whitney U test of the current samples against
   the baseline's samples must give p < alpha (default 0.01). This is asv's test
   (`asv/_stats.py is_different`: Mann-Whitney when raw samples exist), computed here with
   numpy (`stats.mann_whitney_u`; exact for small untied samples, normal approximation with
   tie correction otherwise). It needs no normality, is robust to the long right tail of
   timings, and uses the samples a baseline keeps. A bootstrap CI of the ratio of medians
   would need thousands of resamples per kernel for a similar answer, and requiring its lower
   bound above 1 + threshold would miss most true regressions of exactly the threshold size.
3. **The whole distribution moved.** The lower decile (the fastest 10% of calls) must be
   beyond the threshold too. Interference (another process, a clock dip, a throttled
   interval) only ever adds time, so it raises the median and the tail but leaves the fastest
   calls alone, while a slower kernel shifts every call (the argument of Chen & Revels,
   "Robust benchmarking in noisy environments", behind BenchmarkTools.jl's use of the
   minimum). On a loaded, shared 2-core VM it took the A/A false alarms at a 5% threshold
   from 14% to 2% (bench/results/2026-11-30-gate-accuracy-cpu.md); where the noise is small
   the decile moves with the median and the condition costs little.
4. **Confirmation.** A change that passes 1-3 is re-measured once (the plugin re-times the
   kernel and calls `confirmation.confirm`); it fails the kernel only if the re-measurement passes 1-3 as
   well. Samples within one measurement are not independent (a clock or thermal state,
   another process on the GPU) so a p-value alone overstates certainty; the second,
   independent measurement is what nvbench-compare's "noise-aware" rules and PyTorch's
   "two points in a row" policy approximate.

Anything beyond the threshold that fails 2, 3 or 4 is "suspect": reported with what to do,
never a failure (nvbench users did not know what to do with AMBG: the reason says).

What is compared (the basis, `same_device_basis` / `cross_device_basis`) is decided before
the status, and the status is decided on whatever the basis hands over:

- **Same device, steady clock:** the times, at the kernel's threshold (and the efficiency
  change is reported).
- **Same device, capped, anchored on both sides** (either side's samples mostly in rounds
  with a clock-lowering NVML reason, and both timed in pairs with the same anchor,
  `--kernelpro-clock-anchor=on`): the per-pair kernel / anchor ratios at
  `ANCHOR_THRESHOLD_FACTOR` times the threshold (`clock_anchor.py`: the anchor ran at the same clock, so the ratio cancels it).
- **Same device, clock-limited without the anchor on both sides** (either side's SM clock
  held below 95% of its maximum by a power or thermal limit, `clock_scale.py`): the clock
  such a limit allows moves between runs and the time with it, so the times are compared at
  3x the threshold and a change between the two is "suspect"; where one side has anchored
  samples, the basis says why they were not used.
- **Same device, `clock_normalize`:** times scaled by the NVML mean SM clock (cycles; for
  comparing rules only).
- **Same CPU with the CPU anchor on both sides:** the kernel's on-CPU time read against the
  anchor (`cpu_anchor.py`).
- **Another device:** samples divided by each side's roofline time, so the comparison is of
  time relative to the roofline (1 / efficiency), at the wider `cross_device_tolerance`.

The basis names the rule, the anchor and the clocks.

Another CPU: reported as information ("incomparable" with the change), never a failure,
unless `cross_cpu="gate"` (`--kernelpro-cpu-cross-device=gate`). A CPU's efficiency does not
carry across CPU models (one committed baseline from another CPU "regressed" 3-5 of 5
kernels by +68% to +12329% on fresh machines), and the thread count is part of a CPU
device's name, so this also covers timings taken with other thread counts.

An oversubscribed CPU timing (other processes held the cores its threads needed, see
`measure/timing/cpu.py`) that would regress is "suspect": its slowdown is not the kernel's.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.gate.clock_anchor import (
    ANCHOR_THRESHOLD_FACTOR,
    AnchorSide,
    anchor_missing,
    capped_text,
    entry_anchor,
    record_anchor,
)
from pytest_kernelpro.gate.clock_scale import (
    CLOCK_LIMITED_FACTOR,
    clock_limit_text,
    clock_scale,
    entry_clock_facts,
    record_clock_facts,
)
from pytest_kernelpro.gate.cpu_anchor import (
    CPU_ANCHOR_PREFIX,
    CpuAnchorSide,
    compare_cpu_anchored,
    cpu_anchor_missing,
    entry_cpu_anchor,
    lower_bar,
    record_cpu_anchor,
)
from pytest_kernelpro.gate.stats import mann_whitney_u, median, quantile_subsample

if TYPE_CHECKING:
    from pytest_kernelpro.gate.baseline import BaselineEntry
    from pytest_kernelpro.record import KernelRecord

NEW = "new"
OK = "ok"
IMPROVED = "improved"
REGRESSED = "regressed"
SUSPECT = "suspect"
BELOW_ROOFLINE = "below-roofline"
INCOMPARABLE = "incomparable"  # other device and no roofline time on one side
UNMEASURED = "unmeasured"  # the item produced no timing (failed, skipped)
UNRESOLVED = "unresolved"  # within a tolerance too wide to catch a 1.5x change: checks nothing
STATUSES = (
    NEW,
    OK,
    IMPROVED,
    REGRESSED,
    SUSPECT,
    BELOW_ROOFLINE,
    INCOMPARABLE,
    UNMEASURED,
    UNRESOLVED,
)
# The widest tolerance an "ok" may have: a kernel doing 1.5x its work must be beyond it. A
# wider one (a bimodal baseline, a loaded machine) reads "unresolved", not "ok".
RESOLVABLE_TOLERANCE = 0.5

DEFAULT_ALPHA = 0.01
# Default thresholds per device kind. A fixed lower number, not one derived from each
# kernel's measured spread within a measurement: the gate's rules 2-4 already adapt to that
# (a noisy kernel's change is "suspect", not a failure). The one noise the rules miss, the
# run-to-run clock of a power-capped kernel, is cancelled by comparing it relative to the clock
# anchor timed after each sample, at 0.75x the threshold (`clock_anchor.py`), or, without the
# anchor on both sides, read from its clocks to widen its tolerance (`clock_scale.py`), with
# the clocks named in the basis.
# 2% on a GPU: on an H200, for kernels >= 50 us, 2% catches nearly every +2.5-3.5% slowdown
# without A/A false alarms, at a steady clock and, relative to the anchor, under the power
# cap (bench/results/2026-12-01-gate-accuracy-h200.md).
# 5% on the CPU: timings on shared CPU machines are 10-300x noisier, and 5% with the
# lower-decile rule kept A/A false alarms at 2% on a loaded 2-core VM
# (bench/results/2026-11-30-gate-accuracy-cpu.md).
DEFAULT_GPU_THRESHOLD = 0.02
DEFAULT_CPU_THRESHOLD = 0.05
CROSS_DEVICE_FACTOR = 3.0  # efficiency across devices is noisier than time on one device
TEST_SAMPLES = 200  # both sides are reduced to this many quantiles before the U test
LOW_QUANTILE = 0.10  # a regression must move the fastest calls too, not only the median


def default_threshold(device_kind: str) -> float:
    """The regression threshold a kernel timed on `device_kind` ("cuda"/"cpu") gets by default."""
    return DEFAULT_GPU_THRESHOLD if device_kind == "cuda" else DEFAULT_CPU_THRESHOLD


def _low(values: list[float]) -> float:
    import numpy as np

    return float(np.quantile(np.asarray(values, dtype=float), LOW_QUANTILE))


@dataclass(frozen=True)
class Verdict:
    """The outcome of `compare` (and `confirmation.confirm`) for one kernel."""

    status: str  # one of STATUSES; regressed and below-roofline fail the kernel
    change_status: str  # the baseline comparison alone (status without the roofline floor)
    basis: str  # "time (same device: X)" or "efficiency (other device: A vs B)" or "none"
    reason: str  # one sentence a user can act on
    tolerance: float  # relative change allowed on this basis
    threshold: float  # the kernel's same-device threshold
    cross_device_tolerance: float
    alpha: float
    change: float | None = None  # compared quantity, now / baseline - 1; + means slower
    change_low: float | None = None  # the same for the lower decile (the fastest calls)
    p_value: float | None = None  # one-sided, in the direction of the change
    current_median_s: float | None = None
    baseline_median_s: float | None = None
    efficiency: float | None = None
    baseline_efficiency: float | None = None
    device: str = ""
    baseline_device: str = ""
    n_current: int = 0
    n_baseline: int = 0
    below_roofline: bool = False
    min_roofline: float | None = None
    confirmed: bool = False  # the re-measurement reproduced the regression
    confirmation: dict[str, Any] | None = None  # set once `confirm` ran
    # Set when the times were compared at the baseline's SM clock (clock_scale.py):
    clock_scale: float | None = None  # current SM MHz / baseline SM MHz, applied to the samples
    sm_mhz: float | None = None
    baseline_sm_mhz: float | None = None
    raw_change: float | None = None  # the change of the unscaled median time
    clock_limited: str | None = None  # why the tolerance was widened (clock held by a limit)
    # Set when a clock-limited comparison was made relative to the clock anchor:
    anchor: str | None = None  # the anchor's identity (measure/timing/anchor.py)
    anchor_change: float | None = None  # the anchor's own median, now / baseline - 1
    # The time the verdict was decided on when it is not the wall median (the number shown is
    # the number gated): its label ("on-CPU", "on-CPU, anchor-scaled", "clock-scaled",
    # "anchor-scaled", "roofline-scaled"), now and in the baseline; gated_now_s /
    # gated_baseline_s - 1 is the verdict's `change`. None: the wall medians decided.
    gated_label: str | None = None
    gated_now_s: float | None = None
    gated_baseline_s: float | None = None
    # The autotune choices against the baseline's and the gate's action (confirmation.py),
    # and the code-changing versions that differ (environment.py), each with its words:
    autotune: dict[str, Any] | None = None
    autotune_note: str | None = None
    environment_change: dict[str, Any] | None = None
    environment_note: str | None = None

    @property
    def failed(self) -> bool:
        """True when this verdict fails the kernel item."""
        return self.change_status == REGRESSED or self.below_roofline

    @property
    def message(self) -> str:
        """The reason, for failure messages and report sections."""
        return self.reason

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["failed"] = self.failed
        data["message"] = self.reason
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _samples(record: KernelRecord) -> list[float]:
    out = []
    for value in (record.timing.samples_s if record.timing else None) or ():
        try:
            v = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(v) and v > 0:
            out.append(v)
    return out


def oversubscribed_reason(record: KernelRecord) -> str | None:
    """The reasons a CPU timing was oversubscribed (measure/timing/cpu.py), or None."""
    load = (record.timing.cpu_load if record.timing else None) or {}
    if not load.get("oversubscribed"):
        return None
    return "; ".join(load.get("reasons") or []) or "the CPU was oversubscribed"


def pct_text(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _low_move(change: float) -> str:
    """How the fastest calls moved, in words that cannot read as a contradiction of a slower
    median: "only 0.8% slower", "52.2% faster"."""
    if change < 0:
        return f"{-change * 100:.1f}% faster"
    return f"only {change * 100:.1f}% slower"


def _frac(x: float) -> str:
    """A tolerance as a percentage: "2%", "6%", "1.5%"."""
    return f"{x * 100:.3g}%"


def p_text(p: float) -> str:
    return f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}"


def _check_settings(threshold: float, cross: float, alpha: float) -> None:
    for name, value in (("threshold", threshold), ("cross_device_tolerance", cross)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise KernelproConfigError(
                f"kernelpro gate: {name}={value!r} is not a non-negative fraction; "
                "use e.g. threshold=0.05 for 5%"
            )
    if not (0 < alpha < 1):
        raise KernelproConfigError(
            f"kernelpro gate: alpha={alpha!r} must be between 0 and 1 (default 0.01)"
        )


def roofline_floor(
    min_roofline: float | None, efficiency: float | None, measured: bool
) -> tuple[bool, str | None]:
    """(fails, reason) of the absolute min_roofline floor; independent of any baseline.

    The one rule for `min_roofline`: the verdict applies it in check mode, the item's run
    (`run.item_runner.roofline_floor`) outside it.
    """
    if min_roofline is None or not measured:
        return False, None  # not measured: the item already fails or skips for that
    if efficiency is None:
        return True, (
            f"min_roofline={min_roofline:.0%} is set but this kernel has no roofline "
            "(efficiency unknown); give the marker flops=/bytes= or remove min_roofline"
        )
    if efficiency < min_roofline:
        return True, (
            f"reaches {efficiency:.1%} of its roofline, below min_roofline={min_roofline:.0%}"
        )
    return False, None


# What is compared: the basis of one comparison (module docstring).


@dataclass
class Basis:
    """The samples to compare and how to word the change."""

    text: str  # the verdict's basis
    tolerance: float
    now: list[float]
    ref: list[float]
    ratio: float  # now / baseline of the compared quantity's median
    extra: dict[str, Any] = field(default_factory=dict)  # Verdict fields this basis sets
    unit: str = ""  # after "slower by 3.1%": " in cycles", " relative to the clock anchor"
    detail: str = ""  # after the tolerance inside the parentheses
    # CPU anchor (gate/cpu_anchor.py): the load is cancelled by the anchor, so an
    # oversubscribed timing is no reason for "suspect"; `widened` says why the tolerance is
    # above the threshold, `unusable` why the anchor shows the measurement cannot gate.
    load_cancelled: bool = False
    # The fastest decile's tolerance when not the basis's (the CPU anchor: a tolerance widened
    # for between-session noise would ask the noisy decile for more than the median).
    low_tolerance: float | None = None
    widened: str | None = None
    unusable: str | None = None

    def gated(self, label: str, now_s: float, baseline_s: float) -> None:
        """Name the time this basis compares when it is not the wall median (`Verdict`'s
        gated_* fields): `now_s / baseline_s` is its `ratio`."""
        self.extra.update(gated_label=label, gated_now_s=now_s, gated_baseline_s=baseline_s)


@dataclass
class Incomparable:
    """No gate on this pair: the basis, the reason and the change where one exists."""

    text: str
    reason: str
    tolerance: float
    change: float | None = None


def _roofline_time(record: KernelRecord) -> float | None:
    value = record.roofline_time_s
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def same_device(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


def is_cpu(device: str) -> bool:
    return device.strip().casefold().startswith("cpu")


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
    """The basis of a comparison on the same device (see the module docstring)."""
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
        chosen.extra.update(
            clock_limited=limited,
            sm_mhz=facts_now.sm_mhz,
            baseline_sm_mhz=facts_base.sm_mhz,
        )
    scale = clock_scale(facts_now, facts_base) if clock_normalize else None
    if scale is not None:
        chosen.text = f"{scale.describe()} (same device: {device})"
        chosen.now = [v * scale.factor for v in samples]
        chosen.extra.update(
            clock_scale=scale.factor,
            sm_mhz=scale.sm_mhz,
            baseline_sm_mhz=scale.baseline_sm_mhz,
            raw_change=chosen.ratio - 1.0,
        )
        chosen.unit = " in cycles"
        chosen.detail = (
            f"; plain time {pct_text(chosen.ratio - 1.0)}, SM clock {scale.sm_mhz:.0f} MHz vs "
            f"{scale.baseline_sm_mhz:.0f} MHz in the baseline, a power or thermal cap setting "
            "the clock"
        )
        chosen.ratio *= scale.factor
        chosen.gated("clock-scaled", current_median * scale.factor, entry.median_s)
    return chosen


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
    """The per-pair kernel / anchor ratios of both sides (clock_anchor.py)."""
    anchor_change = now.anchor_median_s / base.anchor_median_s - 1.0
    # The kernel's time at the baseline's anchor speed: its per-pair ratio times that speed.
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
        extra={
            "anchor": now.name,
            "anchor_change": anchor_change,
            "raw_change": time_ratio - 1.0,
            "sm_mhz": sm_mhz,
            "baseline_sm_mhz": baseline_sm_mhz,
        },
        unit=" relative to the clock anchor",
        detail=f"; plain time {pct_text(time_ratio - 1.0)}, anchor GEMM {pct_text(anchor_change)}, {why}",
    )
    chosen.gated(
        "anchor-scaled",
        median(list(now.ratios)) * base.anchor_median_s,
        median(list(base.ratios)) * base.anchor_median_s,
    )
    return chosen


def cpu_anchored_basis(
    device: str, now: CpuAnchorSide, base: CpuAnchorSide, time_ratio: float, threshold: float
) -> Basis:
    """The kernel's on-CPU samples of both sides, read against the CPU anchor (cpu_anchor.py)."""
    facts = compare_cpu_anchored(now, base, threshold)
    chosen = Basis(
        text=(
            f"on-CPU time checked against the CPU anchor (same device: {device}; "
            f"{now.name.removeprefix(CPU_ANCHOR_PREFIX).strip()} after each sample)"
        ),
        tolerance=facts.tolerance,
        now=list(now.kernel_s),
        ref=list(base.kernel_s),
        ratio=1.0 + facts.change,
        extra={
            "anchor": now.name,
            "anchor_change": facts.anchor_move,
            "raw_change": time_ratio - 1.0,
        },
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
    rt_now, rt_base = _roofline_time(record), entry.roofline_time_s
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


def compare(
    record: KernelRecord,
    entry: BaselineEntry | None,
    *,
    threshold: float | None = None,
    cross_device_tolerance: float | None = None,
    alpha: float = DEFAULT_ALPHA,
    cross_cpu: str = "info",
    clock_normalize: bool = False,
    widen_when_clock_limited: bool = True,
    clock_anchor: bool = True,
    anchor_threshold: float | None = None,
) -> Verdict:
    """Compare one measured kernel with its baseline entry (None: the kernel is new).

    `threshold` defaults to `record.threshold` (marker > CLI > ini, resolved by the plugin);
    `cross_device_tolerance` to 3 x threshold. A "regressed" result is provisional until
    `confirm` has seen a re-measurement (`needs_confirmation`). `cross_cpu`: "info" reports
    a comparison with another CPU without failing, "gate" gates it like a GPU's.
    `clock_anchor=False` ignores the anchored samples (`clock_anchor.py`), `anchor_threshold`
    replaces the tolerance of an anchored comparison (default: the threshold), and
    `widen_when_clock_limited=False` keeps the plain threshold for clock-limited comparisons
    (see the module docstring; both for comparing rules on the same measurements);
    `clock_normalize=True` compares cycles where `clock_scale` applies (measured worse than
    plain times on the H200; for comparison only). The basis functions above choose what is compared.
    """
    thr = float(record.threshold if threshold is None else threshold)
    cross = float(
        round(CROSS_DEVICE_FACTOR * thr, 12)
        if cross_device_tolerance is None
        else cross_device_tolerance
    )
    _check_settings(thr, cross, alpha)
    samples = _samples(record)
    below, floor_reason = roofline_floor(record.min_roofline, record.efficiency, bool(samples))
    base = {
        "threshold": thr,
        "cross_device_tolerance": cross,
        "alpha": alpha,
        "device": record.device,
        "efficiency": record.efficiency,
        "current_median_s": record.median_s,
        "below_roofline": below,
        "min_roofline": record.min_roofline,
    }
    if not samples:
        return finish_verdict(
            change_status=UNMEASURED,
            basis="none",
            reason=f"not timed (outcome: {record.outcome}); nothing to compare",
            tolerance=thr,
            floor_reason=floor_reason,
            **base,
        )
    base["n_current"] = len(samples)
    if entry is None:
        return finish_verdict(
            change_status=NEW,
            basis="none",
            reason="no baseline entry for this kernel; --kernelpro-save-baseline adds it",
            tolerance=thr,
            floor_reason=floor_reason,
            **base,
        )
    base.update(
        baseline_device=entry.device,
        baseline_median_s=entry.median_s,
        baseline_efficiency=entry.efficiency,
        n_baseline=entry.n,
    )
    cur_med = record.median_s if record.median_s is not None else median(samples)
    if same_device(record.device, entry.device):
        chosen: Basis | Incomparable = same_device_basis(
            record,
            entry,
            samples,
            cur_med,
            thr,
            widen_when_clock_limited=widen_when_clock_limited,
            clock_normalize=clock_normalize,
            clock_anchor=clock_anchor,
            anchor_threshold=anchor_threshold,
        )
    else:
        chosen = cross_device_basis(record, entry, samples, cur_med, cross, cross_cpu)
    if isinstance(chosen, Incomparable):
        return finish_verdict(
            change_status=INCOMPARABLE,
            basis=chosen.text,
            reason=chosen.reason,
            tolerance=chosen.tolerance,
            floor_reason=floor_reason,
            change=chosen.change,
            **base,
        )
    base.update(chosen.extra)
    basis, tol, now, ref, ratio = (
        chosen.text,
        chosen.tolerance,
        chosen.now,
        chosen.ref,
        chosen.ratio,
    )
    change = ratio - 1.0
    low_tol = tol if chosen.low_tolerance is None else chosen.low_tolerance
    now_q = quantile_subsample(now, TEST_SAMPLES)
    ref_q = quantile_subsample(ref, TEST_SAMPLES)
    low_ratio = _low(now) / _low(ref)
    change_low = low_ratio - 1.0
    what = "slower" if change > 0 else "faster"
    if basis.startswith("efficiency"):
        what = "further from its roofline" if change > 0 else "closer to its roofline"
    moved = f"{what} by {abs(change):.1%}{chosen.unit} (tolerance {_frac(tol)}{chosen.detail})"
    if (
        chosen.unusable is not None
        and abs(change) > thr
        and (ratio > 1.0 + thr or ratio < 1.0 / (1.0 + thr))
    ):
        p = mann_whitney_u(now_q, ref_q, "greater" if change > 0 else "less").p_value
        status = SUSPECT if change > 0 else OK
        reason = f"{what} by {abs(change):.1%}{chosen.unit}, but {chosen.unusable}"
        if change < 0:
            reason += "; not reported as an improvement"
    elif ratio > 1.0 + tol:
        p = mann_whitney_u(now_q, ref_q, "greater").p_value
        if p >= alpha:
            status = SUSPECT
            reason = (
                f"{moved} but not statistically clear (p = {p_text(p)} >= {alpha:g}): the samples "
                "are too few or too noisy. Re-run, or give the kernel a longer timing budget"
            )
        elif low_ratio <= 1.0 + low_tol:
            status = SUSPECT
            reason = (
                f"{moved} at the median, but its fastest {LOW_QUANTILE:.0%} of calls were "
                f"{_low_move(change_low)}: time was added to some calls, not to all (other work on "
                "the machine, clocks or throttling, or a slowdown that hits only some calls). "
                "Re-run on an idle machine"
            )
        elif not chosen.load_cancelled and (busy := oversubscribed_reason(record)) is not None:
            status = SUSPECT
            reason = (
                f"{moved}, but the CPU was oversubscribed while it was timed ({busy}): the "
                "slowdown may be the other work's, not the kernel's. Re-run on a quiet machine"
            )
        else:
            status = REGRESSED
            reason = (
                f"{moved}, fastest {LOW_QUANTILE:.0%} of calls {pct_text(change_low)}, "
                f"Mann-Whitney p = {p_text(p)} < {alpha:g}; needs a confirmation re-measurement"
            )
    elif ratio < 1.0 / (1.0 + tol):
        p = mann_whitney_u(now_q, ref_q, "less").p_value
        busy = None if chosen.load_cancelled else oversubscribed_reason(record)
        if p < alpha and low_ratio < 1.0 / (1.0 + low_tol) and busy is not None:
            status = OK
            reason = (
                f"{moved}, but the CPU was oversubscribed while it was timed ({busy}): a "
                "baseline timed under more load reads faster now; not reported as an improvement"
            )
        elif p < alpha and low_ratio < 1.0 / (1.0 + low_tol):
            status = IMPROVED
            reason = f"{moved}, p = {p_text(p)}"
            if improvement_needs_confirmation(record.device):
                reason += "; needs a confirmation re-measurement"
        else:
            status = OK
            reason = (
                f"{moved} at the median, but not clearly (p = {p_text(p)}, fastest "
                f"{LOW_QUANTILE:.0%} of calls {pct_text(change_low)}); not reported as an improvement"
            )
    elif base.get("clock_limited") and ratio > 1.0 + thr:
        p = mann_whitney_u(now_q, ref_q, "greater").p_value
        status = SUSPECT
        reason = (
            f"slower by {change:.1%}: beyond the {thr:.0%} threshold, within the {tol:.0%} "
            f"allowed because the {base['clock_limited']}, where two measurements of the same "
            "code differ by several percent. Re-run on an idle GPU, or compare its cycles "
            "(--kernelpro-profile)"
        )
    else:
        p = mann_whitney_u(now_q, ref_q, "greater" if change > 0 else "less").p_value
        status = OK
        reason = f"within ±{_frac(tol)} ({pct_text(change)})"
        if chosen.widened is not None:
            # Not "suspect": only an unusable anchor makes a CPU measurement suspect.
            reason += f"; {chosen.widened} (a quieter machine resolves smaller changes)"
    if status == OK and tol > RESOLVABLE_TOLERANCE:
        status, reason = UNRESOLVED, unresolved_reason(tol, reason)
    return finish_verdict(
        change_status=status,
        basis=basis,
        reason=reason,
        tolerance=tol,
        floor_reason=floor_reason,
        change=change,
        change_low=change_low,
        p_value=p,
        **base,
    )


def unresolved_reason(tolerance: float, within: str) -> str:
    """Why an "ok" is "unresolved": the tolerance, its cause (`within` names it) and the fix."""
    return (
        f"unresolved: tolerance ±{_frac(tolerance)} is above {_frac(RESOLVABLE_TOLERANCE)}, so "
        f"a kernel doing 1.5x its work would also pass; {within}. Fix: re-save the baseline on "
        "a quiet machine (--kernelpro-save-baseline), or give the kernel a longer "
        "--kernelpro-time-budget"
    )


def improvement_needs_confirmation(device: str) -> bool:
    """An improvement on the CPU is re-measured like a regression (a baseline timed under
    more load than this run reads faster): "the same caution for improved as for regressed".
    On a GPU an improvement stands without one (kept as measured there)."""
    return is_cpu(device)


def finish_verdict(
    *, change_status: str, reason: str, floor_reason: str | None, **kw: Any
) -> Verdict:
    """The verdict of a change status, with the absolute min_roofline floor folded in (the
    one place `compare` and `confirmation.confirm` build a Verdict)."""
    below = kw["below_roofline"]
    if below and change_status != REGRESSED:
        status = BELOW_ROOFLINE
        reason = f"{floor_reason} (baseline: {reason})"
    else:
        status = change_status
        if below:
            reason = f"{reason}; also {floor_reason}"
    return Verdict(status=status, change_status=change_status, reason=reason, **kw)
