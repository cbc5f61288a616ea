"""Small formatting helpers shared by the terminal table and the PR comment, and one record's
row in the terminal table (`terminal_row`; `gate.report.render_terminal_table` holds the
table's frame: columns, header, summary)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_kernelpro.measure.roofline import SHORT_UNIT
from pytest_kernelpro.record import KernelRecord

_EIGHTHS = " ▏▎▍▌▋▊▉"

# status -> (emoji for Markdown, word for terminals, rich style)
STATUS_STYLE: dict[str, tuple[str, str, str]] = {
    "regressed": ("🔴", "REGRESSED", "bold red"),
    "below-roofline": ("🟥", "BELOW ROOFLINE", "bold red"),
    "suspect": ("🟡", "suspect", "yellow"),
    "improved": ("🟢", "improved", "green"),
    "ok": ("⚪", "ok", ""),
    "new": ("🆕", "new", "cyan"),
    "incomparable": ("⚫", "incomparable", "magenta"),
    "unmeasured": ("➖", "not timed", "dim"),
    "failed": ("❌", "FAILED", "bold red"),
    "error": ("❌", "ERROR", "bold red"),
    "skipped": ("⏭️", "skipped", "dim"),
    "passed": ("✅", "passed", "green"),
}

# Order in which comments and tables list kernels: what needs attention first.
STATUS_ORDER = {
    s: i
    for i, s in enumerate(
        (
            "failed",
            "error",
            "regressed",
            "below-roofline",
            "suspect",
            "incomparable",
            "improved",
            "new",
            "ok",
            "passed",
            "unmeasured",
            "skipped",
        )
    )
}


def format_time(seconds: float | None) -> str:
    """Seconds with the unit that reads best, 3 significant digits, trailing zeros kept:
    '812 ns', '52.1 µs', '50.0 µs', '3.20 ms', '1.05 s'."""
    if seconds is None or not math.isfinite(seconds):
        return "–"
    mag = abs(seconds)
    unit, scale = "ns", 1e-9
    for name, factor in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if mag >= factor:
            unit, scale = name, factor
            break
    value = seconds / scale
    if round(abs(value), 1) >= 1000 and unit != "s":  # 999.96 µs rounds up: next unit
        return format_time(round(seconds / scale, 0) * scale * (1 + 1e-12))
    decimals = 0 if abs(value) >= 99.95 else 1 if abs(value) >= 9.995 else 2
    return f"{value:.{decimals}f} {unit}"


def format_change(change: float | None) -> str:
    """'+7.2%' / '−3.0%' (a real minus sign, so columns line up in proportional fonts)."""
    if change is None or not math.isfinite(change):
        return "–"
    text = f"{change * 100:+.1f}%"
    return text.replace("-", "−")


def bar(fraction: float | None, width: int = 8) -> str:
    """A unicode bar of `width` cells for a fraction 0..1 (clipped), in eighths of a cell."""
    if fraction is None or not math.isfinite(fraction):
        return " " * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    text = "█" * full + (_EIGHTHS[rest] if rest else "")
    return text + " " * (width - len(text))


def short_device(name: str | None) -> str:
    """'NVIDIA H200' -> 'H200', 'NVIDIA GeForce RTX 4090' -> 'RTX 4090',
    'cpu (AMD EPYC)' -> 'AMD EPYC'; anything else stays."""
    if not name:
        return "–"
    for prefix in ("NVIDIA GeForce ", "NVIDIA "):
        if name.startswith(prefix):
            return name[len(prefix) :]
    if name.startswith("cpu (") and name.endswith(")"):  # "cpu (AMD EPYC)" -> "AMD EPYC"
        return name[5:-1] or "cpu"
    return name


def record_status(record: KernelRecord) -> str:
    """The status that describes a record: its gate verdict, else its pytest outcome."""
    if record.outcome in ("failed", "error") and not (record.gate and record.gate.failed):
        # failed for another reason (wrong result, crash): that is the news
        return record.outcome
    if record.gate and record.gate.status:
        return str(record.gate.status)
    return record.outcome or "pending"


def stat(record: KernelRecord, key: str) -> float | None:
    """A float from the timing's statistics, e.g. "median_s" (None when absent)."""
    stats = record.timing.stats if record.timing else None
    return finite_float(getattr(stats, key) if stats is not None else None)


def cross_device(record: KernelRecord) -> bool:
    """The verdict compared efficiency with a baseline from another device."""
    return bool(record.gate) and str(record.gate.basis or "").startswith("efficiency")


def roofline_value(record: KernelRecord, key: str) -> Any:
    """A field of the roofline, e.g. "roofline_time_s" (None when absent)."""
    return getattr(record.roofline, key) if record.roofline is not None else None


def finite_float(value: Any) -> float | None:
    """`value` as a finite float, None for None, non-numbers, NaN and infinities (records and
    baseline files are read from disk: anything may be there)."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def sort_key(record: KernelRecord) -> tuple[int, float, str]:
    """Attention first, then the largest slowdown, then by name."""
    status = record_status(record)
    change = finite_float(record.gate.change if record.gate else None) or 0.0
    return (STATUS_ORDER.get(status, len(STATUS_ORDER)), -change, record.name)


def peak_used_words(record: KernelRecord) -> str | None:
    """ "3xTF32, inferred" / "above every ceiling" when the kernel ran faster than its
    op-level peak allows (`measure.roofline.price_measured`), from our own words only."""
    used = record.peak_used
    if not isinstance(used, Mapping) or not used.get("note"):
        return None
    if used.get("problem"):
        return "above every ceiling"
    unit = SHORT_UNIT.get(str(used.get("key")))
    return f"{unit}, inferred" if unit and used.get("inferred") else None


def terminal_row(
    record: KernelRecord, *, show_device: bool, narrow: bool, bar_width: int, color: bool
) -> list[Any]:
    """One row of the terminal summary table (`gate.report.render_terminal_table`): kernel,
    [device,] median ±IQR/2, [roofline time,] % of roofline with a bar, bound, verdict."""
    from rich.text import Text

    text, style = _verdict_cell(record)
    # Text, not str: a name like "k[/bold]" is a kernel's name, not rich markup.
    row: list[Any] = [Text(record.name)]
    if show_device:
        row.append(Text(short_device(record.device)))
    row.append(_median_cell(record))
    if not narrow:
        row.append(format_time(roofline_value(record, "roofline_time_s")))
    row += [
        _bar_cell(record, bar_width),
        _bound_cell(record),
        Text(text, style=style if color else ""),
    ]
    return row


def _bound_cell(record: KernelRecord) -> str:
    bound = str(roofline_value(record, "bound") or "–")
    words = peak_used_words(record)
    return f"{bound} ({words})" if words else bound


def _median_cell(record: KernelRecord) -> str:
    med = stat(record, "median_s")
    if med is None:
        return "–"
    q1, q3 = stat(record, "q1_s"), stat(record, "q3_s")
    if q1 is None or q3 is None or med <= 0:
        return format_time(med)
    return f"{format_time(med)} ±{(q3 - q1) / 2 / med:.1%}"


def _bar_cell(record: KernelRecord, bar_width: int) -> str:
    eff = record.efficiency
    if eff is None:
        return "–"
    return f"{bar(eff, bar_width)} {eff:4.0%}"


def _verdict_cell(record: KernelRecord) -> tuple[str, str]:
    status = record_status(record)
    _, word, style = STATUS_STYLE.get(status, ("", status, ""))
    change = record.gate.change if record.gate else None
    text = word
    if change is not None and status not in ("new", "unmeasured"):
        text = f"{word} {format_change(change)}"
        if cross_device(record):
            text += "*"
    return text, style
