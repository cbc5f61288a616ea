"""The roofline plot's texts (`gate.plot` draws it): axis labels, legend entries, point
labels, the title and the note naming the kernels left off the plot."""

from __future__ import annotations

from pytest_kernelpro.gate.format import format_change

PLOT_X_LABEL = "arithmetic intensity (FLOP / byte, minimal bytes)"
PLOT_Y_LABEL = "achieved FLOP/s (FLOPs / median time)"
# The legend entry of each verdict that gets its own marker (`gate.plot`).
VERDICT_LEGEND = {
    "regressed": "regressed",
    "below-roofline": "below min_roofline",
    "suspect": "suspect (not failed)",
    "improved": "improved",
}


def roofline_point_label(
    name: str, share: float, *, status: str, change: float | None, flagged: bool
) -> str:
    """'name (76%)', or 'name (1%, suspect +94.2%)' when the verdict needs attention
    (`flagged`); `share` is the achieved FLOP/s over the roof at its intensity."""
    text = f"{name} ({share:.0%}"
    if flagged:
        change_text = format_change(change)
        text += f", {status}" + (f" {change_text}" if change_text != "–" else "")
    return text + ")"


def ceiling_label(device: str, peak_name: str, peak: float, bw: float) -> str:
    """A ceiling's legend entry. Peak names often carry their value ("FP32 CUDA core
    (measured 50.9 TFLOP/s)"): it is not said twice."""
    flops = "" if "FLOP/s" in peak_name else f": {peak / 1e12:.3g} TFLOP/s"
    return f"{device} {peak_name}{flops}, {bw / 1e9:.4g} GB/s"


def roofline_title(devices: list[str], count: int) -> str:
    return f"Roofline on {', '.join(devices)}: {count} kernel{'s' * (count > 1)}"


NOT_PLOTTED = {
    "untimed": "not timed",
    "no_flops": "0 FLOPs: no point on a log axis",
    "no_ceilings": "no roofline ceilings",
}


def not_plotted(name: str, why: str) -> str:
    """A kernel left off the plot, and why (a key of NOT_PLOTTED)."""
    return f"{name} ({NOT_PLOTTED[why]})"


def not_shown_note(skipped: list[str]) -> str:
    """The plot's footnote naming the kernels left off it."""
    return "not shown: " + "; ".join(skipped)[:300]
