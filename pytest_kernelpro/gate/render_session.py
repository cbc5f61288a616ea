"""Every text about the session as a whole: the terminal summary's kernel table and the lines
under it. Pure functions of the settings, the records and the paths.

**Checked nothing.** The rule: among the kernels that were timed and had a baseline entry
(every verdict but "new" and "not timed"), when each one is "incomparable" (a baseline from
another machine) or "unresolved" (a tolerance too wide to catch a 1.5x change), the gate
compared nothing it could fail on, and the session fails (exit 1) unless
`--kernelpro-allow-incomparable` says that is on purpose. One kernel compared for real is a
check: the others are counted under the table. A session without any compared kernel (all new,
all failed) is told by the coverage lines and the items' own failures, not here.

**Tables** (this one, `kernelpro compare`'s) are rendered to text for a terminal or a log,
never cut. A terminal has a width: a table shortens its long kernel names in the middle to fit
it (`middle_ellipsis`; under -v they fold instead, whole), and where even short names leave too
little room, the table is printed wider than the terminal (the terminal wraps the line) rather
than cut: rich would otherwise crop its no-wrap columns, and the verdict, the last column, is
the first thing lost. A log (CI, a pipe, a file) has no width: `width=None` prints every table
at the width of its content.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.format import (
    NOTE_WIDTH,
    Note,
    cross_device,
    fit,
    gated_elsewhere,
    kernel_names,
    names_line,
    plain_note,
    short_device,
    sort_key,
    stat,
    terminal_row,
)
from pytest_kernelpro.gate.report import summarize
from pytest_kernelpro.record import KernelRecord


def note_lines(found: Sequence[Note], *, verbose: bool) -> list[str]:
    """The lines of the conditions `found`: one short line per condition that is not the
    machine's normal state, or with `verbose` the full text of every condition."""
    if verbose:
        return [note.full for note in found]
    return [note.short for note in found if not note.normal]


def session_conditions(
    settings: Any, records: Sequence[KernelRecord], notes: Sequence[str | Note] = ()
) -> list[Note]:
    """Work that was asked for and did not run, and timings not to trust; `notes` (added
    by other parts of the session, a plain string is cut to one line) come last."""
    out: list[Note] = []
    if settings.correctness_only:
        checked = [r for r in records if r.extra.get("correctness_only")]
        full = (
            f"correctness only: {len(checked)} kernel(s) checked; nothing was timed, placed on "
            "the roofline, gated or profiled"
            + ("; no baseline written" if settings.save_baseline is not None else "")
        )
        short = f"correctness only: {len(checked)} kernel(s) checked, nothing timed or gated"
        out.append(Note(short, full))
    busy = [r for r in records if r.timing is not None and r.timing.oversubscribed_reasons]
    if busy:
        out.append(_busy_note(busy, check=bool(settings.check)))
    fixed = [r for r in records if r.timing and (r.timing.honesty or {}).get("inputs_fixed")]
    if fixed:
        head = f"{len(fixed)} kernel(s) timed on inputs that stay the same"
        first = ((fixed[0].timing.honesty or {}) if fixed[0].timing else {}).get("inputs_fixed")
        out.append(Note(names_line(head, fixed, "; -v says what to change"), f"{head}: {first}"))
    overrun = [r for r in records if r.timing is not None and r.timing.budget_note]
    if overrun:
        head = f"{len(overrun)} CPU timing(s) overran the time budget"
        first = overrun[0].timing.budget_note if overrun[0].timing else ""
        short = names_line(head, overrun, "; -v says why; --kernelpro-time-budget")
        out.append(Note(short, f"{head} ({kernel_names(overrun)}): {first}"))
    unprofiled = [r for r in records if r.extra.get("profile_skipped")]
    if settings.profile and unprofiled:
        head = f"--kernelpro-profile: {len(unprofiled)} kernel(s) not profiled"
        full = (
            f"{head} ({kernel_names(unprofiled)}): ncu, SASS and timeline need a CUDA GPU, and "
            "this run had none"
        )
        out.append(Note(f"{head}: no CUDA GPU here", full))
    invalid = [r for r in records if r.extra.get("invalid_marker")]
    if invalid:
        head = f"{len(invalid)} kernel(s) with an invalid marker failed"
        full = f"{head} without running ({kernel_names(invalid)}); the failure says what to fix"
        out.append(Note(names_line(head, invalid, "; see each failure"), full))
    unresolved = [r for r in records if r.gate is not None and r.gate.status == "unresolved"]
    if unresolved:
        from pytest_kernelpro.gate.condition_notes import unresolved_note

        out.append(unresolved_note(unresolved))
    if any(r.outcome == "skipped" for r in records):
        from pytest_kernelpro.gate.condition_notes import skip_notes

        out.extend(skip_notes(records))
    out.extend(note if isinstance(note, Note) else plain_note(note) for note in notes)
    return out


def _busy_note(busy: Sequence[KernelRecord], *, check: bool) -> Note:
    """Timings on an oversubscribed CPU. Without --kernelpro-check nothing is gated on them:
    the machine's normal state on a shared runner, said under -v only."""
    from pytest_kernelpro.measure.timing.cpu_load import CpuLoad

    timing = busy[0].timing
    load = (timing.cpu_load or {}) if timing else {}
    anchored = all((r.timing.anchor or {}).get("layout") == "cpu-pairs" for r in busy if r.timing)
    advice = (
        "They are gated in on-CPU time against the CPU anchor, at a tolerance widened for "
        "the load (the verdicts say how far); a quiet machine resolves smaller changes"
        if anchored
        else "Treat them as suspect: a slowdown there is reported as suspect, never failed; "
        "re-run on a quiet machine"
    )
    threads = (load.get("threads") or 1) > 1
    full = (
        f"{len(busy)} CPU timing(s) taken on an oversubscribed CPU ({kernel_names(busy)}): "
        f"{CpuLoad.from_dict(load).describe()}. {advice}"
        + (" or with --kernelpro-cpu-threads=1" if threads else "")
    )
    others = load.get("others_cores")
    cores = load.get("cores")
    what = f"others used {others:.1f} of {cores} cores" if others and cores else "busy"
    fix = "; --kernelpro-cpu-threads=1" if threads else "; re-run on a quiet machine"
    head = f"{len(busy)} CPU timing(s) on a busy CPU ({what})"
    effect = ": tolerance widened" if anchored else ": slowdowns only suspect"
    short = head + effect + fix
    if len(short) > NOTE_WIDTH:
        short = fit(head + fix)
    return Note(short, full, normal=not check)


def missing_records_line(missing: Sequence[str], *, check: bool) -> str:
    """Collected kernels that left no record (a check fails on them)."""
    verdict = "fails the check" if check else "not checked"
    return (
        f"kernelpro: {len(missing)} collected kernel(s) left no record ({verdict}): "
        + ", ".join(missing[:10])
        + (" ..." if len(missing) > 10 else "")
    )


def output_lines(
    *,
    json_path: Path | None,
    records_path: Path | None,
    history_path: Path | None,
    baseline_path: Path | None,
    verbose: bool = True,
) -> list[str]:
    """Where this session's outputs are: only those that were written (None: not written);
    what reads them back only with `verbose`."""
    lines = []
    if json_path is not None:
        lines.append(f"kernelpro: JSON report {json_path}")
    if records_path is not None:
        lines.append(
            f"kernelpro: records log {records_path}"
            + (" (`kernelpro report` rebuilds the report from it)" if verbose else "")
        )
    if history_path is not None:
        lines.append(
            f"kernelpro: run kept as {history_path.stem}"
            + (" (`kernelpro compare` compares the last two runs)" if verbose else "")
        )
    if baseline_path is not None:
        lines.append(f"kernelpro: baseline written to {baseline_path}")
    return lines


def table_footnotes(records: Sequence[KernelRecord], *, verbose: bool = False) -> list[str]:
    """The notes printed right under the kernel table, after its counts: what a reader needs
    to read its rows right; a note of the machine's normal state only with `verbose`."""
    notes = [note for note in (cpu_flush_note(records),) if note is not None]
    return note_lines(notes, verbose=verbose)


def cpu_flush_note(records: Sequence[KernelRecord]) -> Note | None:
    """What the CPU timings' cache flush was, since it decides how a small kernel's time
    compares with a warm-cache loop (pytest-benchmark's, timeit's). The default (flush when
    the inputs fit in the cache) is the normal state: said under -v only."""
    timed = [r.timing for r in records if r.timing is not None and r.device_kind == "cpu"]
    if not timed:
        return None
    modes = sorted({str((t.budget or {}).get("cpu_flush") or "auto") for t in timed})
    flushed = [t for t in timed if t.flushed_l2]
    mode = f"--kernelpro-cpu-flush={'/'.join(modes)}"
    default = modes == ["auto"]
    if not flushed:
        line = f"CPU timings: warm cache, no flush before the samples ({mode})"
        return Note(line, line, normal=default)
    size = max(t.flush_bytes or 0 for t in flushed) / 2**20
    auto = ", the default: flush when the inputs fit in the cache" if default else ""
    full = (
        f"CPU timings: cache ({size:.0f} MiB) flushed before every sample of {len(flushed)} "
        f"of {len(timed)} kernel(s) ({mode}{auto}), so these are cold-cache times, slower for "
        "a small kernel than a warm loop such as pytest-benchmark's; "
        "--kernelpro-cpu-flush=off times warm"
    )
    short = f"CPU timings: cold cache, {size:.0f} MiB flushed before every sample ({mode})"
    return Note(short, full, normal=default)


def gives_process_note(record: KernelRecord) -> bool:
    """Whether `record` has a note of `gate/process_notes.py` to give: the table imports
    that module only for such a record."""
    gate = record.gate
    return bool(
        (gate is not None and (gate.autotune_note or gate.environment_change))
        or record.extra.get("confirmation_fresh_process_error")
    )


# -- a check that checked nothing (module docstring) --

CHECKS_NOTHING = ("incomparable", "unresolved")  # verdicts that compared nothing
NOT_COMPARED = ("new", "unmeasured")  # no baseline entry or no timing: not counted either way
ALLOW_FLAG = "--kernelpro-allow-incomparable"


def nothing_checked_line(
    records: Sequence[KernelRecord], *, who: str = "kernelpro", allow: str = ALLOW_FLAG
) -> str | None:
    """The line for a check that compared nothing it could fail on, or None; `who` begins
    it, `allow` is the setting that passes it on purpose."""
    compared = [r.gate for r in records if r.gate is not None]
    compared = [g for g in compared if g.status not in NOT_COMPARED]
    if not compared or any(g.status not in CHECKS_NOTHING for g in compared):
        return None
    incomparable = sum(1 for g in compared if g.status == "incomparable")
    unresolved = len(compared) - incomparable
    if unresolved == 0:
        why = f"all {incomparable} compared kernel(s) incomparable with the baseline"
        fix = "save the baseline on this machine"
    elif incomparable == 0:
        why = f"all {unresolved} compared kernel(s) unresolved (tolerance above 50%)"
        fix = "re-save the baseline on a quiet machine"
    else:
        why = f"{incomparable} kernel(s) incomparable, {unresolved} unresolved"
        fix = "save the baseline here on a quiet machine"
    return f"{who}: checked nothing: {why}; {fix}, or pass {allow}"


def session_line(
    records: Sequence[KernelRecord], *, check: bool, allow_incomparable: bool
) -> str | None:
    """The line that fails a `--kernelpro-check` session that checked nothing, or None."""
    if not check or allow_incomparable:
        return None
    return nothing_checked_line(records)


# -- the kernel table --


SORT_KEYS = ("status", "name", "median", "roofline", "change")


def sorted_records(records: Sequence[KernelRecord], sort: str = "status") -> list[KernelRecord]:
    """Records in the table's order: `status` (attention first, then the largest slowdown),
    `name`, `median` (slowest first), `roofline` (furthest from it first) or `change`
    (largest slowdown first). Records without the value go last, by name."""
    if sort not in SORT_KEYS:
        raise KernelproError(f"unknown sort order {sort!r}; use one of {', '.join(SORT_KEYS)}")
    if sort == "status":
        return sorted(records, key=sort_key)
    if sort == "name":
        return sorted(records, key=lambda r: r.name)

    def value(record: KernelRecord) -> float | None:
        if sort == "median":
            return stat(record, "median_s")
        if sort == "roofline":
            return None if record.efficiency is None else -float(record.efficiency)
        change = record.gate.change if record.gate else None
        return None if change is None else float(change)

    def key(record: KernelRecord) -> tuple[int, float, str]:
        v = value(record)
        return (1, 0.0, record.name) if v is None else (0, -v, record.name)

    return sorted(records, key=key)


def render_terminal_table(
    records: Sequence[KernelRecord],
    *,
    width: int | None = 100,
    color: bool = False,
    sort: str = "status",
    verbose: bool = False,
) -> str:
    """The kernel table for the terminal summary, rendered by rich to a string (its width:
    the module docstring's "Tables"). No escape codes unless `color`; the notes under it cut
    to one line each unless `verbose`."""
    from rich.text import Text

    narrow = width is not None and width < 100
    bar_width = 5 if narrow else 8
    devices = sorted({short_device(r.device) for r in records if r.device})
    show_device = len(devices) > 1  # one device: named once, under the table
    show_gated = any(gated_elsewhere(r) for r in records)
    ordered = sorted_records(records, sort)
    rows = [
        terminal_row(
            record,
            show_device=show_device,
            narrow=narrow,
            bar_width=bar_width,
            color=color,
            show_gated=show_gated,
        )
        for record in ordered
    ]

    def build(names: list[str], fold: bool) -> Any:
        named = [[Text(name), *row[1:]] for name, row in zip(names, rows, strict=True)]
        return _kernel_table(
            named, show_device=show_device, narrow=narrow, fold=fold, show_gated=show_gated
        )

    table = names_fitting(build, [r.name for r in ordered], None if verbose else width)
    console, buffer = console_for([table], width=width, color=color)
    console.print(table)
    summary = summarize(records)
    parts = [f"{n} {status}" for status, n in summary["by_status"].items()]

    def say(line: str) -> None:
        console.print(line, highlight=False, soft_wrap=True, markup=False)

    if any(cross_device(r) for r in records):
        say(
            "* other device than the baseline: compared by efficiency (time relative to the "
            "roofline), with the wider cross-device tolerance"
            if verbose
            else "* other device than the baseline: compared by % of roofline, wider tolerance"
        )
    if any(gives_process_note(r) for r in records):
        from pytest_kernelpro.gate.process_notes import table_notes

        for note in table_notes(records):
            say(note if verbose else fit(note, 99))
    where = f" on {devices[0]}" if len(devices) == 1 else ""
    say(f"{summary['kernels']} kernel(s){where}: " + ", ".join(parts))
    for note in table_footnotes(records, verbose=verbose):
        say(note)
    return buffer.getvalue()


def _kernel_table(
    rows: Sequence[Sequence[Any]],
    *,
    show_device: bool,
    narrow: bool,
    fold: bool,
    show_gated: bool = False,
) -> Any:
    """The table's frame with `rows`: names fold (`fold`) or keep one line (already short)."""
    from rich import box
    from rich.table import Table

    table = Table(
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        show_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    if fold:
        table.add_column("kernel", overflow="fold", min_width=12)
    else:
        table.add_column("kernel", no_wrap=True)
    if show_device:
        table.add_column(
            "device", overflow="ellipsis", max_width=10 if narrow else 14, no_wrap=True
        )
    if show_gated:
        table.add_column("gated: baseline → now", justify="right", no_wrap=True)
    table.add_column(
        "wall median ±IQR/2" if show_gated else "median ±IQR/2", justify="right", no_wrap=True
    )
    if not narrow:
        table.add_column("roofline", justify="right", no_wrap=True)
    table.add_column("of roofline", no_wrap=True)
    table.add_column("bound", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    return table


# -- rendering tables to text (module docstring) --


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
    """A rich console writing to a buffer, wide enough that `tables` print whole (`width`
    None: a log, the width of the widest table's content); escape codes only with `color`."""
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
    so that it fits `width` columns; with `width` None (a log, or -v) the names stay whole."""
    table = build(list(names), True)
    if width is None or not names:
        return table
    limit = name_width_to_fit(table, width, max(len(name) for name in names))
    if limit is None:
        return table
    return build([middle_ellipsis(name, limit) for name in names], False)


def name_width_to_fit(table: Any, width: int, longest: int) -> int | None:
    """How many characters the names of `table` (its first column, `longest` the longest)
    may keep so it fits `width` columns; None when they fit whole. Never below MIN_NAME."""
    probe = _console(io.StringIO(), 100_000, False)
    over = _widest(probe, table) - int(width)
    if over <= 0:
        return None
    return max(MIN_NAME, longest - over)
