"""The correctness rule: how close a kernel's output must be to the reference's. Within a
stated factor of the reference's own error against the higher-precision truth (the reference
re-run in float64 on the same inputs, `measure/truth.py`), and never an output that carries no
information (`CorrectnessRule`). Where no truth could be run, or a marker's rtol/atol
override it, the dtype tolerances decide (`measure/tolerance.py`).

One rule for the gate (`correctness.check_correctness`, `recheck_after_timing`) and the
sandbox (`optimize/sandbox/measurement.py`: the worker's checks and the judge's), so an
output that passes one passes the others.

The rule, per floating output (t: the reference re-run in float64, or float32 for a
bf16/fp16 reference, `truth.run_truth`; r: the reference; k: the kernel; u: the unit
roundoff of the output's dtype; F = `FACTOR`):

- the call whose inputs the truth was run on (the first trial):
  every element |k - t| <= F (|r - t| + s) + R u |t|, with the floor s = max |r - t| +
  u rms(t) (the reference's largest error and one rounding of the output's typical value: a
  scale of the output, not a fixed atol; a reordering's error at one element is not bounded
  by the reference's error there, nor by its typical size: on the H200 a transposed
  convolution run twice differed at 0.005% of 28M elements by more than 8x the rms), and
  normwise ||k - t|| <= F ||r - t|| + R u ||t||
  (R = `ROUNDINGS`: the kernel may round its result differently). A kernel that does the
  same math in another order has an error of the reference's size and passes; an error F
  times the reference's own does not.
- every later call (other inputs: more trials, the re-check after timing, the sandbox's
  in-place and shape checks) compares with the reference directly, by the tolerance the
  first call measured: |k - r| <= R u |r| + F s + (F + 1) m per element (m = max |r - t|)
  and ||k - r|| <= ((F + 1) rho + R u) ||r||
  (rho: the reference's normwise relative error), which a kernel passing the first rule on
  these inputs meets.
- without a truth (it could not run: `Truth.skipped` says why) the dtype tolerances decide
  (`tolerance.tolerance_rule`); a marker's (or task's) rtol/atol override the rule,
  and the record names whichever decided.
- in every mode an output that carries no information fails: all zeros where the reference
  stands above its own noise, one constant where it varies, or the reference times a
  constant (the scale explains the difference and exceeds the rule's relative allowance) --
  a softmax over 393,216 columns is about 2.5e-6 everywhere, so a zeros kernel passed any
  fixed atol. The truth's rule (and its calibration) rejects them by itself; where the dtype
  rule or a marker decides, `information_failure` checks them, and a failing output's
  message starts with that diagnosis.

Imports only the standard library and `measure/` at module level (torch is passed in), so
the sandbox's child processes import it without the plugin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from pytest_kernelpro.measure import compare as _compare
from pytest_kernelpro.measure.compare import (
    STRUCTURE_ONLY_SOURCE,
    LeafReport,
    compare_outputs,
    compare_tensor,
)
from pytest_kernelpro.measure.tolerance import Tolerance, tolerance_rule
from pytest_kernelpro.measure.truth import LeafTruth, Truth, leaves_of, unit_roundoff

# The kernel may be this many times farther from the truth than the reference is. A
# reordering of the same sums has an error of the reference's own size (elementwise, up to
# the reference's largest, which the floor carries); one precision step coarser (fp32 ->
# TF32: 2^13 times) is far outside.
FACTOR = 8.0
# Roundings of the output's dtype a kernel may differ by beyond that (where the reference is
# exact, or its error is below one rounding): its last rounding may go the other way.
ROUNDINGS = 2.0


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat % size)
        flat //= size
    return tuple(reversed(index))


def _steps(total: int) -> range:
    # Read at call time, as compare.py does (a by-value import ignores a changed
    # COMPARE_CHUNK, and the pass runs in one full-size chunk).
    step = max(_compare.COMPARE_CHUNK, -(-total // _compare.COMPARE_MAX_CHUNKS))
    return range(0, total, step)


@dataclass(frozen=True)
class TruthComparison:
    """One leaf of the kernel's output against the truth."""

    report: LeafReport
    kernel_error: float  # ||kernel - truth|| / ||truth||
    reference_error: float  # ||reference - truth|| / ||truth||


def truth_source(precision: str | None, factor: float) -> str:
    return f"within {factor:g}x the reference's own error against its {precision} re-run"


def screen_tolerance(source: str) -> Tolerance:
    """Shape, dtype, NaN and infinities judged with the gate's messages; values not judged."""
    return Tolerance(0.0, math.inf, source)


def compare_with_truth(
    torch: Any,
    path: str,
    got: Any,
    expected: Any,
    leaf: LeafTruth,
    precision: str,
    factor: float,
) -> TruthComparison:
    """The first call's rule on one floating leaf (module docstring), in one chunked pass
    (which also takes the kernel's errors against the reference for the record); a NaN or
    infinity the reference does not have, or another shape or dtype, is explained by the
    gate's comparison (`compare.compare_tensor`, values not judged)."""
    u = leaf.unit_roundoff
    floor = leaf.reference_error_max + u * leaf.rms_truth
    source = truth_source(precision, factor)
    norm_bound_rel = factor * leaf.reference_error_rel + ROUNDINGS * u
    tol = Tolerance(ROUNDINGS * u, factor * floor, source, norm_rtol=norm_bound_rel)

    def screened() -> TruthComparison:
        screen = compare_tensor(torch, path, got, expected, screen_tolerance(source))
        screen.tolerance = tol  # the screen's own (values not judged) is no rule
        return TruthComparison(screen, math.inf, leaf.reference_error_rel)

    if tuple(got.shape) != tuple(expected.shape) or got.dtype != expected.dtype:
        return screened()
    shape, total = tuple(expected.shape), expected.numel()
    work = torch.complex64 if expected.is_complex() else torch.float32
    g = got.detach().to(expected.device).reshape(-1)
    r, d = expected.detach().reshape(-1), leaf.difference.reshape(-1)
    rows = []
    best_at = []
    steps = _steps(total)
    for lo in steps:
        hi = min(total, lo + steps.step)
        gd, rd, dd = g[lo:hi].to(work), r[lo:hi].to(work), d[lo:hi].to(work)
        ok = torch.isfinite(gd) & torch.isfinite(rd)
        both_nan = torch.isnan(gd) & torch.isnan(rd)
        # Not numbers on both sides and not the same NaN or infinity: screened below.
        unlike = (~ok & ~both_nan & (gd != rd)).sum()
        zero = torch.zeros((), dtype=work, device=gd.device)
        diff = torch.where(ok, gd - rd, zero)  # kernel - reference
        r_abs = rd.abs()
        rel = torch.where(r_abs > 0, diff.abs() / r_abs, torch.zeros_like(r_abs))
        off = (diff + torch.where(ok, dd, zero)).abs()  # |kernel - truth|
        allowed = factor * (dd.abs() + floor) + ROUNDINGS * u * (rd - dd).abs()
        ratio = torch.where(off > 0, off / allowed, torch.zeros_like(off))
        best = ratio.argmax()
        rows.append(
            torch.stack(
                [
                    (off > allowed).sum().to(torch.float64),
                    off.to(torch.float64).pow(2).sum(),
                    ratio[best].to(torch.float64),
                    unlike.to(torch.float64),
                    both_nan.sum().to(torch.float64),
                    diff.abs().max().to(torch.float64),
                    rel.max().to(torch.float64),
                ]
            )
        )
        best_at.append(best + lo)
        del gd, rd, dd, ok, both_nan, diff, r_abs, rel, off, allowed, ratio
    table = torch.stack(rows).cpu()
    starts = torch.stack(best_at).cpu()
    if float(table[:, 3].sum()) > 0:
        return screened()
    n_both_nan = int(table[:, 4].sum())
    notes = []
    if n_both_nan:
        notes.append(
            f"{path}: the reference itself produced NaN at {n_both_nan} element(s) and the kernel "
            "has NaN at the same places (accepted: the reference runs without output poisoning)"
        )
    n_bad = int(table[:, 0].sum())
    off_norm = math.sqrt(float(table[:, 1].sum()))
    chunk = int(table[:, 2].argmax())
    worst_ratio, worst_flat = float(table[chunk, 2]), int(starts[chunk])
    kernel_rel = (
        off_norm / leaf.truth_norm if leaf.truth_norm else (0.0 if off_norm == 0 else math.inf)
    )
    norm_bound = factor * leaf.reference_error_norm + ROUNDINGS * u * leaf.truth_norm
    norm_ratio = off_norm / norm_bound if norm_bound else (0.0 if off_norm == 0 else math.inf)
    index = _unravel(worst_flat, shape)
    errors = (
        f"Normwise relative error against the truth: kernel {kernel_rel:.3g}, reference "
        f"{leaf.reference_error_rel:.3g}."
    )
    message = None
    if n_bad:
        r_v, d_v = r[worst_flat].item(), d[worst_flat].item()
        t_v = r_v - d_v
        message = (
            f"{path}: {n_bad} of {total} elements ({100 * n_bad / total:.3g}%) farther from the "
            f"{precision} truth than {factor:g}x the reference's own error allows "
            f"(|kernel - truth| <= {factor:g} (|reference - truth| + floor) + {ROUNDINGS:g} u "
            "|truth|, "
            f"u = {u:.3g}, floor = {floor:.3g}: max |reference - truth| + u rms(truth)). "
            f"Worst at index {index}: truth {t_v:.7g}, reference {r_v:.7g}, kernel "
            f"{g[worst_flat].item():.7g}. {errors}"
        )
    elif norm_ratio > 1:
        message = (
            f"{path}: normwise relative error against the {precision} truth {kernel_rel:.3g}, "
            f"above {factor:g}x the reference's {leaf.reference_error_rel:.3g} + {ROUNDINGS:g} u "
            f"(u = {u:.3g}) = {norm_bound_rel:.3g}, though every element is inside its bound."
        )
    ok = message is None
    report = LeafReport(
        path,
        tol,
        ok,
        message,
        float(table[:, 5].max()),
        float(table[:, 6].max()),
        max(worst_ratio, norm_ratio),
        index,
        notes,
        "values",
    )
    return TruthComparison(report, kernel_rel, leaf.reference_error_rel)


@dataclass(frozen=True)
class InformationLimits:
    """When an output counts as carrying no information (`information_failure`): the
    reference's noise relative to its own magnitude, elementwise (`abs_rel`, of max |ref|)
    and normwise (`norm_rel`, of ||ref||), and the relative error the rule allows (`rel`)."""

    abs_rel: float
    norm_rel: float
    rel: float


def information_failure(
    torch: Any, path: str, got: Any, expected: Any, limits: InformationLimits
) -> str | None:
    """Why `got` carries no information about `expected` (zeros, one constant, a scaled
    copy), or None. Finite elements on both sides only; chunked sums in float64."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or expected.numel() == 0:
        return None
    if expected.is_complex() or not expected.is_floating_point():
        return None
    total = expected.numel()
    g_all = got.detach().to(expected.device).reshape(-1)
    e_all = expected.detach().reshape(-1)
    rows = []
    steps = _steps(total)
    for lo in steps:
        hi = min(total, lo + steps.step)
        g = g_all[lo:hi].to(torch.float64)
        e = e_all[lo:hi].to(torch.float64)
        ok = torch.isfinite(g) & torch.isfinite(e)
        if not bool(ok.all()):
            g, e = g[ok], e[ok]
        if g.numel() == 0:
            continue
        rows.append(
            torch.stack(
                [
                    torch.tensor(float(g.numel()), dtype=torch.float64, device=g.device),
                    g.abs().max(),
                    g.min(),
                    g.max(),
                    e.abs().max(),
                    e.min(),
                    e.max(),
                    (g * e).sum(),
                    (e * e).sum(),
                    (g * g).sum(),
                ]
            )
        )
    if not rows:
        return None
    table = torch.stack(rows).cpu()
    n = int(table[:, 0].sum())
    g_abs, g_min, g_max = (
        float(table[:, 1].max()),
        float(table[:, 2].min()),
        float(table[:, 3].max()),
    )
    e_abs, e_min, e_max = (
        float(table[:, 4].max()),
        float(table[:, 5].min()),
        float(table[:, 6].max()),
    )
    ge, ee, gg = (float(table[:, i].sum()) for i in (7, 8, 9))
    noise_abs = limits.abs_rel * e_abs
    if g_abs == 0 and e_abs > noise_abs:
        return (
            f"{path}: the kernel returned all zeros; the reference reaches {e_abs:.3g} (its "
            f"noise: {noise_abs:.3g}). Zeros carry no information about it."
        )
    if n >= 2 and g_min == g_max and e_max - e_min > 2 * noise_abs:
        return (
            f"{path}: the kernel returned one value ({g_min:.7g}) for all {n} elements; the "
            f"reference ranges from {e_min:.7g} to {e_max:.7g}. A constant carries no "
            "information about it."
        )
    if n >= 2 and ee > 0 and g_abs > 0:
        scale = ge / ee
        e_norm = math.sqrt(ee)
        residual = math.sqrt(max(0.0, gg - scale * ge))
        off = abs(scale - 1) * e_norm
        if off > (limits.norm_rel + limits.rel) * e_norm and residual <= 0.5 * off:
            return (
                f"{path}: the kernel returned {scale:.6g} times the reference (after that "
                f"factor the normwise difference is {residual / e_norm:.3g}); a constant factor "
                f"off by {abs(scale - 1):.3g} is beyond the rule's relative allowance "
                f"{limits.norm_rel + limits.rel:.3g}."
            )
    return None


@dataclass(frozen=True)
class Calibration:
    """What the first call's truth says about one output, for every later call."""

    tolerance: Tolerance
    limits: InformationLimits


def calibrate(leaf: LeafTruth, precision: str, factor: float) -> Calibration:
    """Later calls' tolerance for one leaf (module docstring)."""
    u = leaf.unit_roundoff
    floor = leaf.reference_error_max + u * leaf.rms_truth
    rho = leaf.reference_error_rel
    source = (
        f"{truth_source(precision, factor)}, calibrated on the first trial "
        f"(reference's normwise error {rho:.3g})"
    )
    tol = Tolerance(
        rtol=ROUNDINGS * u,
        atol=factor * floor + (factor + 1) * leaf.reference_error_max,
        source=source,
        norm_rtol=(factor + 1) * rho + ROUNDINGS * u,
    )
    return Calibration(tol, limits_from_truth(leaf, factor, rel=0.0))


def limits_from_truth(leaf: LeafTruth, factor: float, rel: float) -> InformationLimits:
    u = leaf.unit_roundoff
    abs_rel = (
        factor * leaf.reference_error_max / leaf.truth_abs_max + ROUNDINGS * u
        if leaf.truth_abs_max
        else math.inf
    )
    return InformationLimits(abs_rel, factor * leaf.reference_error_rel + ROUNDINGS * u, rel)


class CorrectnessRule:
    """The rule one check decides by, with what it learns from the first call's truth.

    `set_truth(truth)` before the comparison of the call whose inputs the truth was run on;
    `judge` then compares that call with the truth, and every later call with the tolerance
    calibrated from it (`for_leaf`). Without a truth, or under a marker's rtol/atol (or a
    fixed tolerance), the dtype rule (`tolerance_rule`) decides. Usable as the
    `tolerance_for` of `compare.compare_outputs`.
    """

    def __init__(
        self,
        *,
        rtol: float | None = None,
        atol: float | None = None,
        fixed: Tolerance | None = None,
        factor: float = FACTOR,
    ) -> None:
        self.rtol, self.atol, self.fixed, self.factor = rtol, atol, fixed, factor
        self.reduced: str | None = None  # the reference's fp32 matmuls ran in "tf32"/"bf16"
        self.truth: Truth | None = None
        self.calibrated: dict[str, Calibration] = {}
        self.kernel_error: float | None = None  # normwise relative, vs the truth (worst leaf)
        self.reference_error: float | None = None
        self._pending = False

    @property
    def overridden(self) -> bool:
        return self.fixed is not None or self.rtol is not None or self.atol is not None

    def set_truth(self, truth: Truth) -> None:
        self.truth = truth
        self._pending = truth.available

    @property
    def name(self) -> str:
        """Which rule decides, in words (the record's `rule`)."""
        if self.fixed is not None:
            return f"fixed tolerance ({self.fixed.source})"
        if self.overridden:
            return f"marker rtol={self.rtol}, atol={self.atol} (override)"
        if self.truth is None:
            return "dtype default (no higher-precision truth was run)"
        if not self.truth.available:
            return f"dtype default (no truth: {self.truth.skipped})"
        if self.reduced:
            return (
                f"{truth_source(self.truth.precision, self.factor)}, or the {self.reduced} "
                f"tolerance (its fp32 matmuls/convolutions may run in {self.reduced})"
            )
        return truth_source(self.truth.precision, self.factor)

    def fallback(self) -> Callable[[Any], Tolerance]:
        return tolerance_rule(
            reduced=self.reduced, rtol=self.rtol, atol=self.atol, fixed=self.fixed
        )

    def __call__(self, dtype: Any) -> Tolerance:
        return self.fallback()(dtype)

    def for_leaf(self, path: str, dtype: Any) -> Tolerance:
        """A later call's tolerance for the leaf at `path` (`compare.leaf_tolerance`).

        Where the reference's fp32 matmuls/convolutions may run reduced (TF32, bf16: the
        session's flags allow it), the same reference may be that inexact on any call (the
        check's deterministic mode alone makes cuDNN pick another algorithm), so the reduced
        precision's dtype tolerance is allowed too: the larger of the two."""
        found = self.calibrated.get(path)
        if found is None or self.overridden:
            return self.fallback()(dtype)
        if not self.reduced:
            return found.tolerance
        loose = self.fallback()(dtype)
        cal = found.tolerance
        return Tolerance(
            max(cal.rtol, loose.rtol),
            max(cal.atol, loose.atol),
            f"{cal.source}, or {loose.source}",
        )

    def _limits(self, torch: Any, path: str, expected: Any, tol: Tolerance) -> InformationLimits:
        found = self.calibrated.get(path)
        rel = tol.rtol if self.overridden or found is None or self.reduced else 0.0
        if found is not None:
            return InformationLimits(found.limits.abs_rel, found.limits.norm_rel, rel)
        u = unit_roundoff(torch, expected.dtype)
        return InformationLimits(ROUNDINGS * u, ROUNDINGS * u, rel)

    def judge(self, torch: Any, got: Any, expected: Any) -> list[LeafReport]:
        """One call's reports, one per output leaf (the truth's call first, if pending)."""
        if self._pending:
            self._pending = False
            reports = self._judge_with_truth(torch, got, expected)
        else:
            reports = compare_outputs(torch, got, expected, self)
        return self._with_information(torch, got, expected, reports)

    def _judge_with_truth(self, torch: Any, got: Any, expected: Any) -> list[LeafReport]:
        assert self.truth is not None
        precision = self.truth.precision or "float64"
        leaves = self.truth.leaves
        fallback = self.fallback()
        overridden = self.overridden

        class FirstPass:
            """Structure, integers, plain values and the override's verdict by their rule;
            the truth's leaves screened only (their values are judged below)."""

            def __call__(self, dtype: Any) -> Tolerance:
                return fallback(dtype)

            def for_leaf(self, path: str, dtype: Any) -> Tolerance:
                if path in leaves and not overridden:
                    return Tolerance(0.0, math.inf, STRUCTURE_ONLY_SOURCE)
                return fallback(dtype)

        reports = compare_outputs(torch, got, expected, FirstPass())
        by_report = {r.path: r for r in reports}
        got_leaves = dict(leaves_of(torch, got))
        exp_leaves = dict(leaves_of(torch, expected))
        kernel_errors, reference_errors = [], []
        for path, leaf in leaves.items():
            self.calibrated[path] = calibrate(leaf, precision, self.factor)
            exp_leaf, got_leaf = exp_leaves.get(path), got_leaves.get(path)
            report = by_report.get(path)
            if report is None or report.kind == "structure":
                continue  # the structure comparison names it
            if not isinstance(got_leaf, torch.Tensor) or not isinstance(exp_leaf, torch.Tensor):
                continue
            found = compare_with_truth(
                torch,
                path,
                got_leaf,
                exp_leaf,
                leaf,
                precision,
                self.factor,
            )
            if not overridden:
                by_report[path] = found.report
            if (
                not overridden
                and not found.report.ok
                and self.reduced
                and found.report.kind == "values"
            ):
                # The reduced precision's tolerance accepts too (see `for_leaf`).
                loose = compare_tensor(torch, path, got_leaf, exp_leaf, fallback(exp_leaf.dtype))
                if loose.ok:
                    loose.notes.append(
                        f"{path}: outside {found.report.tolerance.source}, inside "
                        f"{loose.tolerance.source}: accepted, as the reference's fp32 "
                        f"matmuls/convolutions may run in {self.reduced}"
                    )
                    by_report[path] = loose
            kernel_errors.append(found.kernel_error)
            reference_errors.append(found.reference_error)
        # Calibrated: later calls need only the numbers (the caller's Truth keeps its own).
        self.truth = replace(
            self.truth,
            leaves={p: replace(v, difference=None) for p, v in self.truth.leaves.items()},
        )
        if kernel_errors:
            self.kernel_error = max(kernel_errors)
            self.reference_error = max(reference_errors)
        return [by_report[r.path] for r in reports]

    def _with_information(
        self, torch: Any, got: Any, expected: Any, reports: list[LeafReport]
    ) -> list[LeafReport]:
        got_leaves = dict(leaves_of(torch, got))
        exp_leaves = dict(leaves_of(torch, expected))
        out = []
        for report in reports:
            exp_leaf = exp_leaves.get(report.path)
            # A leaf that passed by the truth's rule (or its calibration) is no constant, zero
            # or scaled copy beyond its noise: that rule is tighter. The others are checked,
            # and a failing leaf gets the diagnosis in its message.
            by_truth = report.path in self.calibrated and not (self.overridden or self.reduced)
            judged = not by_truth if report.ok else report.kind == "values"
            if judged and isinstance(exp_leaf, torch.Tensor) and exp_leaf.is_floating_point():
                limits = self._limits(torch, report.path, exp_leaf, report.tolerance)
                why = information_failure(
                    torch, report.path, got_leaves.get(report.path), exp_leaf, limits
                )
                if why is not None:
                    # Failing by the values already: the diagnosis leads the message.
                    text = why if report.ok else f"{why} {report.message}"
                    report = LeafReport(
                        report.path,
                        report.tolerance,
                        False,
                        text,
                        report.max_abs,
                        report.max_rel,
                        math.inf,
                        report.worst_index,
                        report.notes,
                        "information",
                    )
            out.append(report)
        return out

    def summary(self) -> dict[str, Any]:
        """The record's fields: rule, factor, both errors, the truth's precision and cost."""
        truth = self.truth.summary() if self.truth is not None else None
        return {
            "rule": self.name,
            "factor": self.factor if self.truth is not None and self.truth.available else None,
            "kernel_error": self.kernel_error,
            "reference_error": self.reference_error,
            "truth": truth,
        }
