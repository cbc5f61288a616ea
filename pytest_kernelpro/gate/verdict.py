"""The gate's verdict on one kernel: compare a record with its baseline entry.

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

What is compared is `basis.py`'s choice. Same device: times (and the efficiency change is
reported). When either side ran with its SM clock held below 95% of the maximum by a power or
thermal limit, the clock such a limit allows moves between runs and the time with it (by
1.9-5.4% on the H200's capped GEMMs, where the 2% gate on times raised 6% false alarms):
then the tolerance is 3x the threshold and a change between the two is "suspect"
(`clock_scale.py`). With the kernel timed in pairs with the clock anchor on both sides
(`--kernelpro-clock-anchor=on`), a comparison where either side's samples ran mostly under a
clock limit compares the per-pair kernel / anchor ratios at the threshold instead
(`clock_anchor.py`). The basis names the rule, the anchor and the clocks.
Another device: samples are divided by each side's roofline time, so the comparison is of
time relative to the roofline (1 / efficiency), with the wider `cross_device_tolerance`.

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
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.gate.basis import (
    Basis,
    Incomparable,
    cross_device_basis,
    is_cpu,
    same_device,
    same_device_basis,
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
STATUSES = (NEW, OK, IMPROVED, REGRESSED, SUSPECT, BELOW_ROOFLINE, INCOMPARABLE, UNMEASURED)

DEFAULT_ALPHA = 0.01
# Default thresholds per device kind. A fixed lower number, not one derived from each
# kernel's measured spread within a measurement: the gate's rules 2-4 already adapt to that
# (a noisy kernel's change is "suspect", not a failure). The one noise the rules miss, the
# run-to-run clock of a power-capped kernel, is cancelled by comparing it relative to the clock
# anchor timed after each sample, at 0.75x the threshold (`clock_anchor.py`), or, without the
# anchor on both sides, read from its clocks to widen its tolerance (`clock_scale.py`), with
# the clocks named in the basis. On the H200, for kernels >= 50 us: at a steady clock 179/182
# +2.5-3.5% slowdowns caught with 0/388 false alarms (2026-12-01, run 3); power-capped GEMMs
# relative to the anchor 221/232 with 0/232 (session 5, run 7).
# 2% on a GPU: on the H200 a threshold of 2% caught 97/100 slowdowns of +2.7% and 100/100 of
# +4.4% and +8.9% with 0/200 A/A false alarms on a 61.5 us kernel
# (bench/results/2026-11-30-gate-accuracy-h200.md); over 10 kernels >= 50 us at a steady
# clock, 179/182 slowdowns of +2.5-3.5% with 0/388 false alarms (2026-12-01, run 3).
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
    # The autotune choices against the baseline's and the gate's action (autotune_gate.py),
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
    (`run.stages.roofline_floor`) outside it.
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
    plain times on the H200; for comparison only). `basis.py` chooses what is compared.
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
