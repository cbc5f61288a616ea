"""The session report: JSON (one file, mergeable across xdist workers and runs), its copy in
the run history, and the terminal table.

JSON layout (schema 1)::

    {"schema_version": 1, "kind": "kernelpro-report", "tool": "pytest-kernelpro 0.1.0",
     "created": "...", "meta": {device(s), torch, commit, wall_s, options...},
     "summary": {"kernels": N, "failed": N, "by_status": {"ok": N, ...}},
     "records": [KernelRecord, ...]}

The records are written and read with msgspec at the file's edge (`record.record_builtins`,
`record.record_from_builtins`); a record that is not of the record's types is an error
naming the file and the record.

The run history keeps each run's report (samples included) as
`<UTC time>-<commit>-<machine>.json` under `.kernelpro/history/`, so runs are keyed by commit
and machine and sort by time; `kernelpro history` lists them and `kernelpro compare` takes two
of them by reference (`review/runs.py`).

The tables (this one, `kernelpro compare`'s) are rendered to text for a terminal or a log,
never cut. A terminal has a width: a table shortens its long kernel names in the middle to fit
it (`middle_ellipsis`; under -v they fold instead, whole), and where even short names leave too
little room, the table is printed wider than the terminal (the terminal wraps the line) rather
than cut: rich would otherwise crop its no-wrap columns, and the verdict, the last column, is
the first thing lost. A log (CI, a pipe, a file) has no width: `width=None` prints every table
at the width of its content.
"""

from __future__ import annotations

import datetime as _dt
import io
import json
import os
import platform
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pytest_kernelpro import __version__
from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.fileio import atomic_write_json
from pytest_kernelpro.gate.format import (
    cross_device,
    gated_elsewhere,
    record_status,
    short_device,
    sort_key,
    stat,
    terminal_row,
)
from pytest_kernelpro.gate.render_session import table_footnotes, table_notes
from pytest_kernelpro.record import (
    SCHEMA_VERSION,
    KernelRecord,
    record_builtins,
    record_from_builtins,
)

REPORT_SCHEMA_VERSION = SCHEMA_VERSION  # the records' (record.py)
REPORT_KIND = "kernelpro-report"


def summarize(records: Sequence[KernelRecord]) -> dict[str, Any]:
    """Counts by status, and the names of the kernels that fail the gate."""
    statuses = Counter(record_status(r) for r in records)
    failed = [r.name for r in records if (r.gate and r.gate.failed) or r.outcome == "failed"]
    return {
        "kernels": len(records),
        "failed": len(failed),
        "failed_names": failed,
        "by_status": dict(sorted(statuses.items())),
    }


def build_report(records: Iterable[KernelRecord], *, meta: dict[str, Any]) -> dict[str, Any]:
    """The report dict of one session: schema, session meta, summary and every record.

    `meta` is what the plugin knows about the session (device(s), torch version, commit,
    wall time, options); it is copied as given, with `devices` filled in from the records
    when missing.
    """
    recs = list(records)
    meta = dict(meta)
    meta.setdefault("devices", sorted({r.device for r in recs if r.device}))
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "kind": REPORT_KIND,
        "tool": f"pytest-kernelpro {__version__}",
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "meta": meta,
        "summary": summarize(recs),
        "records": [record_builtins(r) for r in recs],
    }


def write_json_report(path: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    """Write the report atomically (a reader never sees half a file)."""
    return atomic_write_json(path, report)


DEFAULT_HISTORY_DIR = Path(".kernelpro") / "history"


def machine_name() -> str:
    """The machine a run was measured on: its host name."""
    return platform.node() or "unknown-host"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()[:40] or "x"


def save_run(history_dir: str | Path, report: dict[str, Any]) -> Path:
    """Write `report` as a new history entry (atomically) and return its path."""
    meta = report.get("meta") or {}
    now = _dt.datetime.now(_dt.timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    commit = str(meta.get("commit") or "nocommit")[:12]
    machine = _slug(str(meta.get("machine") or machine_name()))
    path = Path(history_dir) / f"{stamp}-{_slug(commit)}-{machine}.json"
    return atomic_write_json(path, report)


def records_of(report: dict[str, Any], source: str = "kernelpro report") -> list[KernelRecord]:
    """The KernelRecords of a report dict; `source` names the report in the error of a record
    that is not of the record's types."""
    records = report.get("records") or []
    return [
        record_from_builtins(r, source=f"{source}: records[{i}]") for i, r in enumerate(records)
    ]


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check one JSON report; a bad file is a KernelproError naming it."""
    target = Path(path)
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KernelproError(
            f"kernelpro report {target} does not exist; write it with "
            "`pytest --kernelpro-json=PATH` (default .kernelpro/kernelpro-report.json)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise KernelproError(f"kernelpro report {target} cannot be read as JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise KernelproError(
            f"kernelpro report {target} is not a pytest-kernelpro JSON report (no "
            f"'kind': '{REPORT_KIND}'); pass the file written by --kernelpro-json"
        )
    version = data.get("schema_version")
    if type(version) is not int or version != REPORT_SCHEMA_VERSION:  # true == 1, 1.0 == 1
        raise KernelproError(
            f"kernelpro report {target} has schema version {version!r} (written by "
            f"{data.get('tool') or 'an unknown tool'}); this pytest-kernelpro {__version__} "
            f"reads version {REPORT_SCHEMA_VERSION}. Fix: write it again with "
            "`pytest --kernelpro-json` of this version, or read it with the version that wrote it"
        )
    if not isinstance(data.get("records"), list):
        raise KernelproError(f"kernelpro report {target}: 'records' is not a list")
    records_of(data, f"kernelpro report {target}")  # a record of the wrong types: named here
    return data


def merge_report_dicts(reports: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge reports of xdist workers, shards or several runs into one.

    Records are keyed by node id; when two reports hold the same kernel, the later report
    wins (a re-run replaces the earlier result). The merged meta keeps the first report's
    options, the union of devices, the longest wall time (workers run in parallel) and the
    list of commits when they differ.
    """
    if not reports:
        raise KernelproError("kernelpro: no reports to merge")
    by_id: dict[str, dict[str, Any]] = {}
    for report in reports:
        for rec in report.get("records") or []:
            by_id[str(rec.get("nodeid"))] = rec
    metas = [r.get("meta") or {} for r in reports]
    meta = dict(metas[0])
    devices = sorted({d for m in metas for d in (m.get("devices") or [])})
    if devices:
        meta["devices"] = devices
    walls = [m.get("wall_s") for m in metas if isinstance(m.get("wall_s"), (int, float))]
    if walls:
        meta["wall_s"] = max(walls)
    commits = sorted({m.get("commit") for m in metas if m.get("commit")})
    if len(commits) > 1:
        meta["commits"] = commits
    meta["merged_from"] = len(reports)
    records = records_of({"records": list(by_id.values())}, "merged kernelpro reports")
    return build_report(records, meta=meta)


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
    """The kernel table for the terminal summary, rendered by rich to a string.

    Columns: kernel, device, the time the verdict compared (baseline → now, labelled; only
    when some verdict compared another time than the wall median), median ± half the IQR
    (relative), roofline time, % of roofline with a bar, bound, verdict with the change. `width`: a terminal's columns: below 100 the
    roofline-time column is left out and the bar narrowed, long kernel names are shortened in
    the middle ("…") to fit (with `verbose` they fold, whole), and a table that still does not
    fit is printed wider rather than cut (`console_for`); None: a log, every column at
    the width of its content. No escape codes unless `color`. Notes of the machine's normal
    state only with `verbose`; the others cut to one line without it.
    """
    from rich.text import Text

    from pytest_kernelpro.gate.render_session import fit

    narrow = width is not None and width < 100
    bar_width = 5 if narrow else 8
    devices = sorted({short_device(r.device) for r in records if r.device})
    show_device = len(devices) > 1  # one device: named once, under the table
    # A verdict on another time than the wall median shows that time first (gate/format.py).
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
