"""The "kernelpro" section of a kernel item's pytest report: one record as plain text
(pytest shows it with the item's report; `plugin.pytest_runtest_makereport` adds it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_kernelpro.gate.format import format_time
from pytest_kernelpro.measure.gpu_memory import format_bytes
from pytest_kernelpro.record import CorrectnessPart, KernelRecord, StatsPart


def _number(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) else str(value)


def _rule_text(c: CorrectnessPart) -> str:
    """Which rule decided, both errors against the truth, and the truth's cost."""
    text = str(c.rule)
    truth = c.truth or {}
    if c.kernel_error is not None:
        text += (
            f"; normwise error against the {truth.get('precision')} truth: kernel "
            f"{_number(c.kernel_error)}, reference {_number(c.reference_error)}"
        )
    if truth.get("seconds") is not None:
        cost = f"{truth['seconds'] * 1e3:.1f} ms"
        if truth.get("peak_bytes") is not None:
            bound = "" if truth.get("peak_exact", True) else "at most "
            cost += f", {bound}{format_bytes(truth['peak_bytes'])} peak"
        text += f"; truth re-run {cost}"
    return text


def autotune_line(choice: Mapping[str, Any]) -> str:
    """'autotune: _layer_norm_fwd (key 4096, torch.float16): num_warps=8, ... (tuned)'."""
    kernel = str(choice.get("kernel", "?")).rsplit(".", 1)[-1]
    key = choice.get("key")
    at = "" if not isinstance(key, list) else f" (key {', '.join(str(v) for v in key)})"
    config = ", ".join(f"{k}={v}" for k, v in (choice.get("config") or {}).items())
    return f"autotune: {kernel}{at}: {config} ({choice.get('source', '?')})"


def item_section(record: KernelRecord) -> str:
    """The per-item "kernelpro" report section (pytest's report sections), plain text."""
    lines = [f"{record.name} on {record.device or record.device_kind} ({record.language})"]
    c = record.correctness
    if c and not c.passed and c.worst_index is None and not c.max_abs_err:
        # It failed before any output value was compared (it raised, or an output had the
        # wrong shape or dtype): errors of 0 would read as a match.
        reason = (c.failure or c.exception or "no output was compared").strip().splitlines()[0]
        lines.append(
            f"correctness: FAILED on trial {c.trials_run} of {c.trials} before any value was "
            f"compared: {reason[:300]}"
        )
    elif c:
        tol = c.tolerance
        tolerance = (
            f"rtol {_number(tol.rtol) if tol else None}, atol {_number(tol.atol) if tol else None}, "
            f"{tol.source if tol else None}"
        )
        trials = f"{c.trials_run} trial{'' if c.trials_run == 1 else 's'}"
        if not c.passed and _non_finite(c.worst_ratio):
            # A NaN or an infinity where a number was expected: the errors are computed over
            # the elements that are numbers on both sides, and their 0 would read as a match.
            reason = (c.failure or "a NaN or infinite output").strip().splitlines()[0]
            lines.append(f"correctness: FAILED over {trials} ({tolerance}): {reason[:500]}")
        else:
            lines.append(
                f"correctness: {'passed' if c.passed else 'FAILED'} over {trials}; max abs "
                f"err {c.max_abs_err or 0:.3g}, max rel err {c.max_rel_err or 0:.3g} "
                f"({tolerance})"
            )
    if c and c.rule:
        lines.append(f"correctness rule: {_rule_text(c)}")
    if c and c.kernelbench:
        kb = c.kernelbench
        lines.append(
            f"KernelBench's own check (allclose, atol={kb.get('atol')}, rtol={kb.get('rtol')}): "
            f"{'passed' if kb.get('passed') else 'FAILED'}, max abs err "
            f"{_number(kb.get('max_abs_err'))}"
        )
    t = record.timing
    if t:
        s = t.stats or StatsPart()
        lines.append(
            f"timing: median {format_time(s.median_s)}, IQR "
            f"{format_time(s.iqr_s)}, 95% CI [{format_time(s.ci_low_s)}, "
            f"{format_time(s.ci_high_s)}], n={s.n}, {t.method}, "
            f"stop: {t.stop_reason}, throttled samples: {t.throttled_samples}"
        )
    r = record.roofline
    if r:
        eff = f"{record.efficiency:.1%}" if record.efficiency is not None else "-"
        lines.append(
            f"roofline: {r.flops or 0:.4g} FLOP, {r.min_bytes or 0:.4g} B minimal "
            f"({r.unfused_bytes or 0:.4g} B unfused), intensity {r.intensity or 0:.3g} "
            f"FLOP/B vs ridge {r.ridge or 0:.3g} -> {r.bound}-bound; peak "
            f"{r.peak_name}; roofline time {format_time(r.roofline_time_s)}; "
            f"reaches {eff}"
        )
        if record.peak_used and record.peak_used.get("note"):
            lines.append(f"peak used for this kernel: {record.peak_used['note']}")
    for choice in record.autotune.choices if record.autotune else ():
        lines.append(autotune_line(choice))
    if record.gate:
        lines.append(f"gate: {record.gate.status}: {record.gate.message}")
    profile_text = record.extra.get("profile_text")
    if profile_text:
        lines.append(profile_text)
    if record.guidance:
        lines.append(record.guidance)
    optimize_text = record.extra.get("optimize_text")
    if optimize_text:
        lines.append(optimize_text)
    return "\n".join(lines)


def _non_finite(value: float | str | None) -> bool:
    """A record's error field that is an infinity or NaN (a float, or "inf"/"nan" read back
    from JSON)."""
    try:
        return value is not None and not math.isfinite(float(value))
    except (TypeError, ValueError):
        return False
