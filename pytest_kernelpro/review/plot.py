"""A log-log roofline plot (PNG) of every measured kernel, written atomically.

Each device/peak pair gets its ceilings: the memory slope (bandwidth x intensity) and the
compute roof (peak FLOP/s), meeting at the ridge point. Each kernel is a point at its
arithmetic intensity and achieved FLOP/s (FLOPs / median time). The ceilings come from the
record's roofline dict: `peak_flops` and `bandwidth_Bps` when present, otherwise derived from
`ridge` (= P / BW) and `roofline_time_s` (= max(F / P, B / BW)).

Ceilings equal to 6 significant digits are drawn once (the same measured peak reaches
records through different float paths and must not become two legend entries). A kernel whose
verdict needs attention (regressed, suspect, below its roofline floor, improved) gets its own
marker and the verdict with its change in the label, so the plot and the comment agree.
The legend sits below the axes, where it cannot hide a point or a label, and each label is
put where its text (measured by the renderer) overlaps no other label or point.
"""

from __future__ import annotations

import io
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.format import finite_float, record_status, short_device
from pytest_kernelpro.record import KernelRecord

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

from pytest_kernelpro.gate.format import format_change

# -- the plot's texts: a kernel's label, the verdicts' legend --

PLOT_X_LABEL = "arithmetic intensity (FLOP / byte, minimal bytes)"
PLOT_Y_LABEL = "achieved FLOP/s (FLOPs / median time)"
# The legend entry of each verdict that gets its own marker (`review.plot`).
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


_PEAK_KEYS = ("peak_flops", "peak_flops_per_s", "peak_flop_s")
_BW_KEYS = ("bandwidth_Bps", "peak_bandwidth_Bps", "bandwidth")


@dataclass(frozen=True)
class RooflinePoint:
    """One kernel on the plot."""

    label: str
    device: str
    peak_name: str
    intensity: float  # FLOP per byte
    achieved_flops: float  # FLOP/s
    peak_flops: float
    bandwidth_Bps: float
    status: str = "ok"  # the record's verdict (format.record_status)
    change: float | None = None  # the gate's change, now / baseline - 1

    @property
    def roof_flops(self) -> float:
        """The attainable FLOP/s at this intensity: min(peak, bandwidth x intensity)."""
        return min(self.peak_flops, self.bandwidth_Bps * self.intensity)

    @property
    def label_text(self) -> str:
        """'name (76%)', or 'name (1%, suspect +94.2%)' when the verdict needs attention."""
        return roofline_point_label(
            self.label,
            self.achieved_flops / self.roof_flops,
            status=self.status,
            change=self.change,
            flagged=self.status in _MARKERS,
        )


# Label positions tried in order: (dx, dy) in points from the point, text alignment, and
# whether a leader line joins label and point. Beside the point first (right, then level on
# the left); then further below or above on the right with a leader, so that two neighbours'
# labels cannot be read as each other's; then diagonally left (a leader that short would hide
# under the marker). The last one is used when none fits: labels overlap rather than vanish.
_NEAR = ((6, -10, "left", False), (6, 4, "left", False), (-8, -3, "right", False))
_FAR = tuple((6, dy, "left", True) for k in range(1, 4) for dy in (-10 - 10 * k, 4 + 10 * k))
_LEFT = ((-6, -10, "right", False), (-6, 4, "right", False))
_LABEL_POSITIONS = _NEAR + _FAR + _LEFT

# verdict -> (marker, edge color, legend text); other verdicts are plain circles
_MARKERS: dict[str, tuple[str, str, str]] = {
    "regressed": ("X", "red", VERDICT_LEGEND["regressed"]),
    "below-roofline": ("v", "red", VERDICT_LEGEND["below-roofline"]),
    "suspect": ("D", "goldenrod", VERDICT_LEGEND["suspect"]),
    "improved": ("^", "green", VERDICT_LEGEND["improved"]),
}


def _pos(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out > 0 else None


def _key(p: RooflinePoint) -> tuple[str, str, float, float]:
    """One ceiling per device, peak name and (peak, bandwidth) to 6 significant digits."""
    return (p.device, p.peak_name, float(f"{p.peak_flops:.6g}"), float(f"{p.bandwidth_Bps:.6g}"))


def _ceilings(roofline: dict[str, Any]) -> tuple[float, float] | None:
    """(peak FLOP/s, bandwidth B/s) of a roofline dict, or None if they cannot be known."""
    peak = next((_pos(roofline.get(k)) for k in _PEAK_KEYS if _pos(roofline.get(k))), None)
    bw = next((_pos(roofline.get(k)) for k in _BW_KEYS if _pos(roofline.get(k))), None)
    if peak and bw:
        return peak, bw
    flops, nbytes = _pos(roofline.get("flops")), _pos(roofline.get("min_bytes"))
    ridge, rt = _pos(roofline.get("ridge")), _pos(roofline.get("roofline_time_s"))
    if not (flops and nbytes and ridge and rt):
        return None
    # rt = max(F/P, B/BW) and P = ridge * BW: solve for BW on whichever side bound it.
    if flops / nbytes >= ridge:  # compute-bound: rt = F / P
        peak = flops / rt
        return peak, peak / ridge
    bw = nbytes / rt  # memory-bound: rt = B / BW
    return ridge * bw, bw


def roofline_points(records: Sequence[KernelRecord]) -> tuple[list[RooflinePoint], list[str]]:
    """The plottable kernels, and the names of those that cannot be placed (and why)."""
    points: list[RooflinePoint] = []
    skipped: list[str] = []
    for r in records:
        roofline = msgspec.structs.asdict(r.roofline) if r.roofline else {}
        med = r.median_s
        flops = _pos(roofline.get("flops"))
        nbytes = _pos(roofline.get("min_bytes"))
        ceilings = _ceilings(roofline)
        if med is None or not med > 0:
            skipped.append(not_plotted(r.name, "untimed"))
        elif not flops or not nbytes:
            skipped.append(not_plotted(r.name, "no_flops"))
        elif ceilings is None:
            skipped.append(not_plotted(r.name, "no_ceilings"))
        else:
            points.append(
                RooflinePoint(
                    label=r.name,
                    device=short_device(r.device),
                    peak_name=str(roofline.get("peak_name") or "peak"),
                    intensity=flops / nbytes,
                    achieved_flops=flops / med,
                    peak_flops=ceilings[0],
                    bandwidth_Bps=ceilings[1],
                    status=record_status(r),
                    change=finite_float(r.gate.change if r.gate else None),
                )
            )
    return points, skipped


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a plot is meant to be shared
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _place_labels(fig: Figure, ax: Any, points: Sequence[RooflinePoint]) -> None:
    """Annotate each point where its label overlaps no other label, point or the axes edge.

    Text sizes are measured with the figure's renderer after the axes limits are frozen, so
    the check is in the pixels the PNG will have.
    """
    ax.autoscale_view()
    ax.set_xlim(ax.get_xlim())  # freeze: annotations must not move the limits afterwards
    ax.set_ylim(ax.get_ylim())
    from matplotlib.transforms import Bbox

    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    centers = [ax.transData.transform((p.intensity, p.achieved_flops)) for p in points]
    dots = [Bbox.from_bounds(x - 5, y - 5, 10, 10) for x, y in centers]
    placed: list[Bbox] = []
    for i, p in enumerate(points):
        flagged = p.status in _MARKERS
        style = {
            "textcoords": "offset points",
            "fontsize": 7,
            "color": _MARKERS[p.status][1] if flagged else "black",
            "fontweight": "bold" if flagged else "normal",
        }
        others = [b for j, b in enumerate(dots) if j != i]
        for n, (dx, dy, ha, far) in enumerate(_LABEL_POSITIONS):
            leader = {"arrowstyle": "-", "linewidth": 0.5, "color": "0.4"} if far else None
            note = ax.annotate(
                p.label_text,
                (p.intensity, p.achieved_flops),
                xytext=(dx, dy),
                ha=ha,
                arrowprops=leader,
                **style,
            )
            box = note.get_window_extent(renderer)
            fits = (
                frame.x0 <= box.x0
                and box.x1 <= frame.x1
                and frame.y0 <= box.y0
                and box.y1 <= frame.y1
                and not any(box.overlaps(b) for b in placed + others)
            )
            if fits or n == len(_LABEL_POSITIONS) - 1:
                placed.append(box)
                break
            note.remove()


def roofline_figure(records: Sequence[KernelRecord], *, title: str | None = None) -> Figure:
    """The roofline plot of `records` as a matplotlib Figure (Agg canvas, no pyplot).

    Raises KernelproError when no kernel can be placed (none timed, or none with FLOPs and
    bytes), so a CI step does not upload an empty picture silently.
    """
    points, skipped = roofline_points(records)
    if not points:
        raise KernelproError(
            "roofline plot: no kernel has FLOPs, bytes, ceilings and a median time "
            f"({'; '.join(skipped) or 'no records'}); nothing to draw"
        )
    # The Agg canvas directly, not pyplot: no global backend switch, no GUI, thread-safe.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    fig = Figure(figsize=(9, 6.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    lo = min(p.intensity for p in points) / 8
    hi = max(max(p.intensity for p in points), max(p.peak_flops / p.bandwidth_Bps for p in points))
    hi *= 8
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    color_of: dict[tuple[str, str, float, float], str] = {}
    for i, key in enumerate(sorted({_key(p) for p in points})):
        device, peak_name, peak, bw = key
        color = f"C{i % 10}"
        color_of[key] = color
        ax.plot(
            grid,
            [min(peak, bw * x) for x in grid],
            color=color,
            linewidth=1.6,
            label=ceiling_label(device, peak_name, peak, bw),
        )
        ax.axvline(peak / bw, color=color, linewidth=0.6, linestyle=":", alpha=0.7)
    ordered = sorted(points, key=lambda q: (q.intensity, -q.achieved_flops))
    for p in ordered:
        marker, edge, _ = _MARKERS.get(p.status, ("o", "black", ""))
        flagged = p.status in _MARKERS
        ax.scatter(
            [p.intensity],
            [p.achieved_flops],
            color=color_of[_key(p)],
            marker=marker,
            s=90 if flagged else 36,
            edgecolor=edge,
            linewidth=1.8 if flagged else 1.0,
            zorder=3,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    _place_labels(fig, ax, ordered)
    ax.set_xlabel(PLOT_X_LABEL)
    ax.set_ylabel(PLOT_Y_LABEL)
    devices = sorted({p.device for p in points})
    ax.set_title(title or roofline_title(devices, len(points)))
    ax.grid(True, which="both", linewidth=0.3, alpha=0.5)
    handles, texts = ax.get_legend_handles_labels()
    for status in sorted({p.status for p in points if p.status in _MARKERS}):
        marker, edge, text = _MARKERS[status]
        handles.append(
            Line2D([], [], marker=marker, linestyle="", color="white", markeredgecolor=edge)
        )
        texts.append(text)
    # Below the axes: inside, it hid the slowest kernel's label in the H200 example plot.
    ax.legend(handles, texts, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=1)
    if skipped:
        fig.text(0.01, 0.01, not_shown_note(skipped), fontsize=6)
    return fig


def roofline_plot(
    records: Sequence[KernelRecord], path: str | os.PathLike[str], *, title: str | None = None
) -> Path:
    """Draw every kernel on its device's roofline and write a PNG to `path` atomically.

    Raises KernelproError when no kernel can be placed (see `roofline_figure`); nothing is
    written then.
    """
    target = Path(path)
    try:
        fig = roofline_figure(records, title=title)
    except KernelproError as exc:
        raise KernelproError(f"{target}: {exc}") from None
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", bbox_inches="tight")
    _atomic_write_bytes(target, buffer.getvalue())
    return target
