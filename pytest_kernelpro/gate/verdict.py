"""The gate's verdict on one kernel: `decide_verdict` judges a record against its baseline
entry, on a basis (which time is compared, at which tolerance) chosen first
(`verdict_basis.choose_basis`), then decided here (`decide_change`); what differs from the
baseline's run beside the code is named in its reason by `run_differences.py`.

How a regression is decided, and why:

1. **Effect size.** The relative change of the median (current / baseline - 1) must be
   beyond the kernel's threshold (default 2% on a CUDA GPU, 5% on the CPU). The median, not
   the mean: one preempted sample must not move the center (pytest-benchmark users gate on
   `median:` for that reason).
2. **Statistical clarity.** A one-sided Mann-Whitney U test of the current samples against
   the baseline's samples must give p < alpha (default 0.01). This is asv's test
   (`asv/_stats.py is_different`: Mann-Whitney when raw samples exist). It needs no
   normality, is robust to the long right tail of timings, and uses the samples a baseline
   keeps. A bootstrap CI of the ratio of medians would need thousands of resamples per kernel
   for a similar answer, and requiring its lower bound above 1 + threshold would miss most
   true regressions of exactly the threshold size.
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
never a failure (nvbench users did not know what to do with AMBG: the reason says). An
oversubscribed CPU timing (other processes held the cores its threads needed) that would
regress is "suspect" too: its slowdown is not the kernel's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from pytest_kernelpro.errors import KernelproConfigError
from pytest_kernelpro.gate.baseline import (
    Basis,
    Incomparable,
    finite_array,
    is_cpu,
    pct_text,
    quantile_subsample,
)
from pytest_kernelpro.gate.verdict_basis import choose_basis, quantile
from pytest_kernelpro.record import VerdictPart

if TYPE_CHECKING:
    import numpy as np

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
# The widest tolerance an "ok" may have: a kernel doing 1.5x its work must be beyond it. A
# wider one (a bimodal baseline, a loaded machine) reads "unresolved", not "ok".
RESOLVABLE_TOLERANCE = 0.5

DEFAULT_ALPHA = 0.01
# Default thresholds per device kind: fixed, not derived from each kernel's spread, since
# rules 2-4 already adapt to that (a noisy kernel's change is "suspect", not a failure) and
# the basis handles the power-capped clock. The GPU's catches small slowdowns without false
# alarms (bench/results/2026-12-01-gate-accuracy-h200.md); the CPU's is wider because shared
# CPU machines time far more noisily (bench/results/2026-11-30-gate-accuracy-cpu.md).
DEFAULT_GPU_THRESHOLD = 0.02
DEFAULT_CPU_THRESHOLD = 0.05
CROSS_DEVICE_FACTOR = 3.0  # efficiency across devices is noisier than time on one device
TEST_SAMPLES = 200  # both sides are reduced to this many quantiles before the U test
LOW_QUANTILE = 0.10  # a regression must move the fastest calls too, not only the median


# -- the U test the verdict runs on both sides' quantiles --

Alternative = Literal["greater", "less", "two-sided"]

# Exact null distribution when there are no ties and both samples are at most this large
# (scipy's exact method stays in milliseconds at 60x60; beyond, the normal approximation is
# within 1e-3 of it).
EXACT_MAX_N = 60


@dataclass(frozen=True)
class MannWhitneyResult:
    """U statistic of the first sample, its p-value, and how the p-value was computed."""

    u: float
    p_value: float
    method: str  # "exact" | "normal"


def mann_whitney_u(
    x: Sequence[float] | np.ndarray,
    y: Sequence[float] | np.ndarray,
    alternative: Alternative = "greater",
) -> MannWhitneyResult:
    """Mann-Whitney U test of x against y; `alternative="greater"`: H1 is that x tends to be
    larger (for timings: slower). Returns p = 1.0 when either sample is empty or every value
    is the same (no evidence either way)."""
    import numpy as np
    from scipy import stats

    xs, ys = finite_array(x), finite_array(y)
    n_x, n_y = len(xs), len(ys)
    if n_x == 0 or n_y == 0:
        return MannWhitneyResult(u=float("nan"), p_value=1.0, method="none")
    both = np.concatenate([xs, ys])
    has_ties = len(np.unique(both)) < len(both)
    exact = not has_ties and n_x <= EXACT_MAX_N and n_y <= EXACT_MAX_N
    if not exact and both.min() == both.max():
        return MannWhitneyResult(u=n_x * n_y / 2.0, p_value=1.0, method="normal")
    result = stats.mannwhitneyu(
        xs, ys, alternative=alternative, method="exact" if exact else "asymptotic"
    )
    p = float(result.pvalue)
    return MannWhitneyResult(
        u=float(result.statistic),
        p_value=min(1.0, max(0.0, p)) if math.isfinite(p) else 1.0,
        method="exact" if exact else "normal",
    )


def default_threshold(device_kind: str) -> float:
    """The regression threshold a kernel timed on `device_kind` ("cuda"/"cpu") gets by default."""
    return DEFAULT_GPU_THRESHOLD if device_kind == "cuda" else DEFAULT_CPU_THRESHOLD


def _samples(record: KernelRecord) -> list[float]:
    """The record's finite positive timing samples (its part holds floats only)."""
    samples = record.timing.samples_s if record.timing else ()
    return [float(v) for v in samples if math.isfinite(v) and v > 0]


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
    """(fails, reason) of the absolute min_roofline floor, independent of any baseline: the
    one rule, applied by the verdict in check mode and by the item's run outside it."""
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


def decide_verdict(
    record: KernelRecord,
    entry: BaselineEntry | None,
    *,
    threshold: float | None = None,
    cross_device_tolerance: float | None = None,
    alpha: float = DEFAULT_ALPHA,
    cross_cpu: str = "info",
) -> VerdictPart:
    """The verdict of one measured kernel against its baseline entry (None: the kernel is
    new). `threshold` defaults to `record.threshold` (marker > CLI > ini),
    `cross_device_tolerance` to 3 x threshold. A "regressed" result is provisional until
    `confirm` has seen a re-measurement (`needs_confirmation`). `cross_cpu`: "info" reports a
    comparison with another CPU without failing, "gate" gates it like a GPU's."""
    thr = float(record.threshold if threshold is None else threshold)
    cross = float(
        round(CROSS_DEVICE_FACTOR * thr, 12)
        if cross_device_tolerance is None
        else cross_device_tolerance
    )
    _check_settings(thr, cross, alpha)
    samples = _samples(record)
    below, floor_reason = roofline_floor(record.min_roofline, record.efficiency, bool(samples))
    base: dict[str, Any] = {
        "threshold": thr,
        "cross_device_tolerance": cross,
        "alpha": alpha,
        "device": record.device,
        "efficiency": record.efficiency,
        "current_median_s": record.median_s,
        "below_roofline": below,
        "min_roofline": record.min_roofline,
        "n_current": len(samples),
        # Until an entry and a confirmation say otherwise (the record's JSON keeps them so):
        "baseline_device": "",
        "n_baseline": 0,
        "confirmed": False,
    }
    if not samples or entry is None:
        return finish_verdict(
            change_status=NEW if samples else UNMEASURED,
            basis="none",
            reason=(
                "no baseline entry for this kernel; --kernelpro-save-baseline adds it"
                if samples
                else f"not timed (outcome: {record.outcome}); nothing to compare"
            ),
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
    chosen = choose_basis(
        record,
        entry,
        samples,
        threshold=thr,
        cross_tolerance=cross,
        cross_cpu=cross_cpu,
    )
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
    busy = "; ".join(record.timing.oversubscribed_reasons if record.timing else ()) or None
    decided = decide_change(chosen, thr, alpha, busy, record.device)
    return finish_verdict(
        change_status=decided.status,
        basis=chosen.text,
        reason=decided.reason,
        tolerance=chosen.tolerance,
        floor_reason=floor_reason,
        change=decided.change,
        change_low=decided.change_low,
        p_value=decided.p_value,
        **base,
        **chosen.verdict_fields(),
    )


@dataclass(frozen=True)
class Decision:
    """The status of one change on its basis, with why and the statistics behind it."""

    status: str
    reason: str
    change: float  # the compared quantity's median, now / baseline - 1
    change_low: float  # the same for the lower decile (the fastest calls)
    p_value: float  # one-sided Mann-Whitney, in the direction the status was decided


@dataclass(frozen=True)
class _Moved:
    """What one change measured, shared by the branches of `decide_change`."""

    basis: Basis
    alpha: float
    change: float
    low_ratio: float
    now_q: list[float]
    ref_q: list[float]
    text: str  # "slower by 4.0% (tolerance 5%...)"

    @property
    def change_low(self) -> float:
        return self.low_ratio - 1.0

    @property
    def low_tolerance(self) -> float:
        low = self.basis.low_tolerance
        return self.basis.tolerance if low is None else low

    def p(self, direction: str) -> float:
        return mann_whitney_u(self.now_q, self.ref_q, direction).p_value

    def decided(self, status: str, reason: str, p: float) -> Decision:
        return Decision(status, reason, self.change, self.change_low, p)


def decide_change(
    chosen: Basis, threshold: float, alpha: float, busy: str | None, device: str
) -> Decision:
    """Regressed, improved, suspect, ok or unresolved: the rules of the module docstring on
    the samples `chosen` hands over. `busy`: why the CPU was oversubscribed while this run
    was timed (None: it was not), a reason for "suspect" unless the basis cancels the load."""
    change = chosen.ratio - 1.0
    tol = chosen.tolerance
    what = "slower" if change > 0 else "faster"
    if chosen.text.startswith("efficiency"):
        what = "further from its roofline" if change > 0 else "closer to its roofline"
    moved = _Moved(
        basis=chosen,
        alpha=alpha,
        change=change,
        low_ratio=quantile(chosen.now, LOW_QUANTILE) / quantile(chosen.ref, LOW_QUANTILE),
        now_q=quantile_subsample(chosen.now, TEST_SAMPLES),
        ref_q=quantile_subsample(chosen.ref, TEST_SAMPLES),
        text=f"{what} by {abs(change):.1%}{chosen.unit} (tolerance {_frac(tol)}{chosen.detail})",
    )
    busy = None if chosen.load_cancelled else busy
    ratio = chosen.ratio
    if (
        chosen.unusable is not None
        and abs(change) > threshold
        and (ratio > 1.0 + threshold or ratio < 1.0 / (1.0 + threshold))
    ):
        reason = f"{what} by {abs(change):.1%}{chosen.unit}, but {chosen.unusable}"
        if change < 0:
            reason += "; not reported as an improvement"
        p = moved.p("greater" if change > 0 else "less")
        decision = moved.decided(SUSPECT if change > 0 else OK, reason, p)
    elif ratio > 1.0 + tol:
        decision = _decide_slower(moved, busy)
    elif ratio < 1.0 / (1.0 + tol):
        decision = _decide_faster(moved, busy, device)
    elif chosen.clock_limited and ratio > 1.0 + threshold:
        reason = (
            f"slower by {change:.1%}: beyond the {threshold:.0%} threshold, within the "
            f"{tol:.0%} allowed because the {chosen.clock_limited}, where two measurements of "
            "the same code differ by several percent. Re-run on an idle GPU, or compare its "
            "cycles (--kernelpro-profile)"
        )
        decision = moved.decided(SUSPECT, reason, moved.p("greater"))
    else:
        reason = f"within ±{_frac(tol)} ({pct_text(change)})"
        if chosen.widened is not None:
            # Not "suspect": only an unusable anchor makes a CPU measurement suspect.
            reason += f"; {chosen.widened} (a quieter machine resolves smaller changes)"
        decision = moved.decided(OK, reason, moved.p("greater" if change > 0 else "less"))
    if decision.status == OK and tol > RESOLVABLE_TOLERANCE:
        return replace(decision, status=UNRESOLVED, reason=unresolved_reason(tol, decision.reason))
    return decision


def _decide_slower(moved: _Moved, busy: str | None) -> Decision:
    """A change beyond the tolerance in the slower direction: regressed only when clear."""
    p, alpha = moved.p("greater"), moved.alpha
    if p >= alpha:
        reason = (
            f"{moved.text} but not statistically clear (p = {p_text(p)} >= {alpha:g}): the "
            "samples are too few or too noisy. Re-run, or give the kernel a longer timing budget"
        )
        return moved.decided(SUSPECT, reason, p)
    if moved.low_ratio <= 1.0 + moved.low_tolerance:
        reason = (
            f"{moved.text} at the median, but its fastest {LOW_QUANTILE:.0%} of calls were "
            f"{_low_move(moved.change_low)}: time was added to some calls, not to all (other "
            "work on the machine, clocks or throttling, or a slowdown that hits only some "
            "calls). Re-run on an idle machine"
        )
        return moved.decided(SUSPECT, reason, p)
    if busy is not None:
        reason = (
            f"{moved.text}, but the CPU was oversubscribed while it was timed ({busy}): the "
            "slowdown may be the other work's, not the kernel's. Re-run on a quiet machine"
        )
        return moved.decided(SUSPECT, reason, p)
    reason = (
        f"{moved.text}, fastest {LOW_QUANTILE:.0%} of calls {pct_text(moved.change_low)}, "
        f"Mann-Whitney p = {p_text(p)} < {alpha:g}; needs a confirmation re-measurement"
    )
    return moved.decided(REGRESSED, reason, p)


def _decide_faster(moved: _Moved, busy: str | None, device: str) -> Decision:
    """A change beyond the tolerance in the faster direction: improved only when clear."""
    p = moved.p("less")
    clear = p < moved.alpha and moved.low_ratio < 1.0 / (1.0 + moved.low_tolerance)
    if clear and busy is not None:
        reason = (
            f"{moved.text}, but the CPU was oversubscribed while it was timed ({busy}): a "
            "baseline timed under more load reads faster now; not reported as an improvement"
        )
        return moved.decided(OK, reason, p)
    if clear:
        reason = f"{moved.text}, p = {p_text(p)}"
        if improvement_needs_confirmation(device):
            reason += "; needs a confirmation re-measurement"
        return moved.decided(IMPROVED, reason, p)
    reason = (
        f"{moved.text} at the median, but not clearly (p = {p_text(p)}, fastest "
        f"{LOW_QUANTILE:.0%} of calls {pct_text(moved.change_low)}); not reported as an "
        "improvement"
    )
    return moved.decided(OK, reason, p)


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
    more load than this run reads faster); on a GPU it stands without one."""
    return is_cpu(device)


def needs_confirmation(verdict: VerdictPart) -> bool:
    """Whether the kernel must be re-timed for `confirm`: a regression, or a CPU improvement."""
    if verdict.confirmation is not None:
        return False
    if verdict.change_status == IMPROVED:
        return improvement_needs_confirmation(verdict.device)
    return verdict.change_status == REGRESSED


def floor_status(change_status: str, below_roofline: bool | None) -> str:
    """The status of a change status under the min_roofline floor: "below-roofline" for a
    kernel below it, unless the change regressed (a regression is said first)."""
    return BELOW_ROOFLINE if below_roofline and change_status != REGRESSED else change_status


def finish_verdict(
    *, change_status: str, reason: str, floor_reason: str | None, **kw: Any
) -> VerdictPart:
    """The verdict of a change status, with the absolute min_roofline floor folded in (the
    one place `decide_verdict` and `confirmation.confirm` build a verdict)."""
    status = floor_status(change_status, kw["below_roofline"])
    if status == BELOW_ROOFLINE:
        reason = f"{floor_reason} (baseline: {reason})"
    elif kw["below_roofline"]:
        reason = f"{reason}; also {floor_reason}"
    return VerdictPart(status=status, change_status=change_status, reason=reason, **kw)
