"""The "Reference analysis" lines of every optimize prompt, from a record's roofline (the
Benchmarking Agent's part of the prompt): the bound, the peak that sets it, the share of the
roofline the reference and the current kernel reach, and the headroom left."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kernelpro.measure.ceilings import format_rate
from pytest_kernelpro.measure.roofline import price_measured, roofline_fields, timed_paths
from pytest_kernelpro.record import RooflinePart

BOUND_ADVICE = {  # what a bound means for the Programmer
    "memory": "memory-bound: the roofline is set by bytes moved; fuse, read each input once, "
    "vectorize, and do not spend effort on tensor cores",
    "compute": "compute-bound: the roofline is set by FLOP/s; use the tensor-core "
    "instructions listed for this GPU and keep them fed",
    "mixed": "between the two ceilings: both data movement and arithmetic throughput matter",
}


def attainable_path(roofline: Any) -> Mapping[str, Any] | None:
    """The fastest path of `roofline` as accurate as its op-level pricing and faster than it
    (3xTF32 for fp32 GEMM with TF32 off), or None."""
    paths = timed_paths(roofline_fields(roofline))
    if len(paths) < 2:
        return None
    rule = paths[0]
    same = [p for p in paths[1:] if p.get("accuracy") == rule.get("accuracy")]
    best = min(same, key=lambda p: float(p["roofline_time_s"]), default=None)
    if best is None or float(best["roofline_time_s"]) >= float(rule["roofline_time_s"]):
        return None
    return best


def seconds_text(value: float) -> str:
    """Seconds in the prompts' style: 3 significant digits, s / ms / us."""
    if value >= 1:
        return f"{value:.3g} s"
    if value >= 1e-3:
        return f"{value * 1e3:.3g} ms"
    return f"{value * 1e6:.3g} us"


def reference_summary(
    roofline: RooflinePart,
    *,
    reference_s: float | None = None,
    current_s: float | None = None,
    validation: Mapping[str, Any] | None = None,
) -> str:
    """The ReferenceAnalysis section of every prompt, from a record's roofline: the bound,
    the peak that sets it, the % of the roofline the reference and the current kernel reach,
    the headroom left, and the ncu validation of the class (Stage 1 on the reference)."""
    bound = str(roofline.bound or "unknown")
    t = roofline.roofline_time_s
    lines = [f"## Reference analysis (Benchmarking Agent, {roofline.device or 'this device'})"]
    lines.append(
        f"- Bound: **{bound}** ({BOUND_ADVICE.get(bound, bound)}); arithmetic intensity "
        f"{float(roofline.intensity or 0):.3g} FLOP/B vs ridge "
        f"{float(roofline.ridge or 0):.3g} FLOP/B."
    )
    peak = roofline.peak_name
    if peak:
        lines.append(
            f"- Peak that sets the roofline: {peak} "
            f"({format_rate(float(roofline.peak_flops or 0), 'FLOP/s')}) and "
            f"{format_rate(float(roofline.bandwidth_Bps or 0), 'B/s')} DRAM; work "
            f"{format_rate(float(roofline.flops or 0), 'FLOP')}, minimal traffic "
            f"{format_rate(float(roofline.min_bytes or 0), 'B')}."
        )
    faster = attainable_path(roofline)
    if t and faster is None:
        parts = [f"- Roofline time {seconds_text(float(t))}"]
        if reference_s:
            parts.append(
                f"the reference takes {seconds_text(reference_s)} ({float(t) / reference_s:.1%} of roofline)"
            )
        priced = price_measured(roofline, current_s) if current_s else None
        if current_s and priced is not None and priced.note:
            parts.append(
                f"the current kernel {seconds_text(current_s)} ({priced.efficiency:.1%} of "
                f"roofline; {priced.note})"
            )
        elif current_s:
            parts.append(
                f"the current kernel {seconds_text(current_s)} ({float(t) / current_s:.1%} of "
                f"roofline): headroom at most {current_s / float(t):.3g}x"
            )
        lines.append("; ".join(parts) + ".")
    elif t and faster is not None:
        lines += _headroom_lines(roofline, faster, reference_s, current_s)
    if validation:
        lines.append(
            f"- ncu validation of the class on the reference: measured "
            f"{validation.get('measured') or 'n/a'} (SM {_pct(validation.get('sm_pct'))}, "
            f"memory {_pct(validation.get('memory_pct'))} of peak) vs theoretical "
            f"{validation.get('theoretical') or 'n/a'}: Stage 1 says "
            f"{validation.get('cls') or 'unknown'} (confidence {validation.get('confidence')})."
        )
    return "\n".join(lines) + "\n"


def _headroom_lines(
    roofline: RooflinePart,
    faster: Mapping[str, Any],
    reference_s: float | None,
    current_s: float | None,
) -> list[str]:
    """The roofline lines when the work has a faster path at the reference's accuracy (fp32
    GEMM/conv with TF32 off: 3xTF32 on the tensor cores): the share of the op-level roofline
    the reference reaches, and the headroom against the faster ceiling, named."""
    t, ta = float(roofline.roofline_time_s or 0), float(faster["roofline_time_s"])
    rule = (roofline.paths or [{}])[0]
    unit, fast_unit = rule.get("unit") or "op-level", faster.get("unit") or faster.get("key")
    parts = [f"- Roofline time {seconds_text(t)} at the {unit} peak"]
    if reference_s:
        parts.append(
            f"the reference takes {seconds_text(reference_s)} ({t / reference_s:.1%} of the "
            f"{unit} roofline)"
        )
    if current_s and current_s >= t:
        parts.append(f"the current kernel {seconds_text(current_s)} ({t / current_s:.1%} of it)")
    elif current_s:
        parts.append(
            f"the current kernel {seconds_text(current_s)} is faster than that roofline allows: "
            f"it does not run on the {unit}s alone"
        )
    rate = format_rate(float(faster.get("peak_flops") or 0), "FLOP/s")
    second = [
        f"- At {faster.get('accuracy', 'the same')} accuracy the work can run faster, at the "
        f"{fast_unit} peak ({rate}): roofline time {seconds_text(ta)}"
    ]
    if reference_s:
        second.append(f"the reference reaches {ta / reference_s:.1%} of it")
    if current_s and current_s > ta:
        second.append(
            f"the current kernel {ta / current_s:.1%}: headroom at most {current_s / ta:.3g}x "
            "against this ceiling"
        )
    elif current_s:
        second.append(
            f"the current kernel is already faster than this ceiling ({ta / current_s:.1%} "
            "of it): it runs at lower accuracy, or a FLOP count is wrong"
        )
    return ["; ".join(parts) + ".", "; ".join(second) + "."]


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{float(value):.0f}%"
