"""One record's row in the terminal summary table (`gate.report.render_terminal_table`
holds the table's frame: columns, header, summary)."""

from __future__ import annotations

from typing import Any

from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    bar,
    cross_device,
    format_change,
    format_time,
    peak_used_words,
    record_status,
    roofline_value,
    short_device,
    stat,
)
from pytest_kernelpro.record import KernelRecord


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
