"""Rich tables and lines rendered to text for a terminal or for a log, never cut.

A terminal has a width: a table shortens its long kernel names in the middle to fit it
(`middle_ellipsis`; under -v they fold instead, whole), and where even short names leave too
little room, the table is printed wider than the terminal (the terminal wraps the line) rather
than cut: rich would otherwise crop its no-wrap columns, and the verdict, the last column, is
the first thing lost. A log (CI, a pipe, a file) has no width: `width=None`
prints every table at the width of its content.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from typing import Any


def _console(buffer: io.StringIO, width: int, color: bool) -> Any:
    from rich.console import Console

    return Console(
        file=buffer,
        width=width,
        force_terminal=color,
        color_system="standard" if color else None,
        no_color=not color,
        highlight=False,
        emoji=False,
        legacy_windows=False,
    )


def _widest(console: Any, renderable: Any) -> int:
    from rich.measure import Measurement

    return int(Measurement.get(console, console.options, renderable).maximum)


def least_width(console: Any, table: Any) -> int:
    """The narrowest `table` prints with no cell cut: its folding columns at their
    `min_width`, every other column as wide as its widest cell."""
    slack = 0
    for column in table.columns:
        if column.no_wrap or column.overflow != "fold":
            continue
        widest = max(_widest(console, cell) for cell in [column.header, *column.cells])
        slack += max(0, widest - (column.min_width or 1))
    return _widest(console, table) - slack


def console_for(
    tables: Sequence[Any], *, width: int | None, color: bool
) -> tuple[Any, io.StringIO]:
    """A rich console writing to a buffer, wide enough that `tables` print whole. `width`: the
    terminal's columns, or None for a log: the width of the widest table's content. Escape
    codes only with `color`."""
    probe = _console(io.StringIO(), 100_000, color)
    if width is None:
        columns = max([_widest(probe, table) for table in tables] or [80])
    else:
        columns = max([int(width)] + [least_width(probe, table) for table in tables])
    buffer = io.StringIO()
    return _console(buffer, columns, color), buffer


MIN_NAME = 12  # a kernel name is never shortened below this many characters


def middle_ellipsis(text: str, width: int) -> str:
    """`text` within `width` characters, its middle replaced by "…": a kernel name keeps its
    module-ish start and its shape or parameter end ("softmax_ro…[8192x4096]")."""
    if len(text) <= width:
        return text
    width = max(width, 3)
    head = width // 2
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def names_fitting(
    build: Callable[[list[str], bool], Any], names: Sequence[str], width: int | None
) -> Any:
    """The table `build(names, fold)` makes, with its kernel names shortened in the middle
    so that it fits `width` columns; with `width` None (a log, or -v) the names stay whole
    (`fold`: the name column folds a name too long for the terminal instead of cutting it)."""
    table = build(list(names), True)
    if width is None or not names:
        return table
    limit = name_width_to_fit(table, width, max(len(name) for name in names))
    if limit is None:
        return table
    return build([middle_ellipsis(name, limit) for name in names], False)


def name_width_to_fit(table: Any, width: int, longest: int) -> int | None:
    """How many characters the names of `table` (its first column, filled with the full
    names, `longest` the longest) may keep so the table fits `width` columns; None when
    they fit whole. Never below MIN_NAME: a table that still does not fit prints wider."""
    probe = _console(io.StringIO(), 100_000, False)
    over = _widest(probe, table) - int(width)
    if over <= 0:
        return None
    return max(MIN_NAME, longest - over)
