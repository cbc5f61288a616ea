"""`kernelpro compare [BASE] [HEAD]`: gate two saved runs against each other, offline.

BASE is a JSON report (with its timing samples) or a baseline YAML; HEAD is a JSON report;
either can also be a run of the history (`-1` the latest, `-2` the one before, a run id or a
commit prefix: see gate/report.py). Without arguments: the two latest runs of the history.
Every kernel of HEAD gets the same verdict `--kernelpro-check` would give it, except that
no confirmation re-measurement is possible offline: a regression is shown as unconfirmed.
The table has the baseline's and the head's medians and the speedup (baseline / head, so
2.00x is twice as fast and 0.50x twice as slow): the time the verdict compared, labelled,
where that is not the wall median (on-CPU against the CPU anchor), with the wall median second.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.baseline import Baseline, load_baseline
from pytest_kernelpro.gate.baseline_save import entry_from_record
from pytest_kernelpro.gate.format import (
    STATUS_STYLE,
    format_change,
    format_time,
    gated_elsewhere,
    gated_times,
    sort_key,
)
from pytest_kernelpro.gate.verdict import DEFAULT_ALPHA, REGRESSED, decide_verdict
from pytest_kernelpro.record import KernelRecord
from pytest_kernelpro.review.report_load import load_report, records_of


def _base_entries(path: str) -> Baseline:
    if path.lower().endswith((".yaml", ".yml")):
        return load_baseline(path)
    entries = {}
    for record in records_of(load_report(path)):
        entry = entry_from_record(record)
        if entry is not None:
            entries[record.nodeid] = entry
    if not entries:
        raise KernelproError(f"kernelpro compare: the base report {path} has no timed kernels")
    return Baseline(path=path, device="", commit=None, created="", tool="", entries=entries)


def gate_records(
    base: Baseline,
    head: Sequence[KernelRecord],
    *,
    threshold: float | None = None,
    alpha: float = DEFAULT_ALPHA,
    cross_cpu: str = "info",
) -> list[KernelRecord]:
    """HEAD's records with `gate` set by comparing them with BASE (no confirmation; autotune
    picks and versions that differ are noted)."""
    from pytest_kernelpro.gate.run_differences import compare_choices, name_environment, note_picks

    out = []
    for record in head:
        entry = base.entry_for(record)
        verdict = decide_verdict(
            record, entry, threshold=threshold, alpha=alpha, cross_cpu=cross_cpu
        )
        if entry is not None:
            choices = record.autotune.choices if record.autotune else None
            verdict = note_picks(verdict, compare_choices(choices, entry.autotune))
            environment = record.environment.versions() if record.environment else None
            verdict = name_environment(verdict, environment, entry.environment)
        record.gate = verdict
        out.append(record)
    return out


def compare_row(record: KernelRecord, base_s: float | None) -> tuple[str, str, str, str, str, str]:
    """Its cells against the base run's median `base_s`: kernel, baseline, head, speedup
    (baseline / head), verdict with the change; and the verdict's style. Where the verdict
    compared another time than the wall median (gate/format.py `gated_times`), the baseline
    and head cells show that time first, labelled, the wall median second, and the speedup
    is that time's."""
    head_s = record.median_s
    speedup = f"{base_s / head_s:.2f}×" if base_s and head_s else "–"
    base_cell, head_cell = format_time(base_s), format_time(head_s)
    if gated_elsewhere(record):
        times = gated_times(record)
        assert times is not None
        label, gated_base, gated_head = times
        speedup = f"{gated_base / gated_head:.2f}× {label}"
        base_cell = f"{format_time(gated_base)} {label} (wall {format_time(base_s)})"
        head_cell = f"{format_time(gated_head)} {label} (wall {format_time(head_s)})"
    gate = record.gate
    status = str((gate.status if gate else None) or record.outcome)
    _, word, style = STATUS_STYLE.get(status, ("", status, ""))
    change = gate.change if gate else None
    verdict = word if change is None else f"{word} {format_change(change)}"
    return record.name, base_cell, head_cell, speedup, verdict, style


def render_compare_table(
    base: Baseline, gated: Sequence[KernelRecord], *, width: int | None = 100, color: bool = False
) -> str:
    """kernel | baseline | head | speedup | verdict (with the change), rendered by rich.
    `width`: a terminal's columns (long kernel names shortened in the middle; the table is
    never cut), None: a log (the content's width, `gate.render_session.console_for`)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from pytest_kernelpro.gate.render_session import console_for, names_fitting

    width = None if width is None else max(60, width)
    rows = []
    for record in sorted(gated, key=sort_key):
        entry = base.entry_for(record)
        rows.append(compare_row(record, entry.median_s if entry is not None else None))

    def build(names: list[str], fold: bool) -> Table:
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
        if fold:
            table.add_column("kernel", overflow="fold", min_width=12)
        else:
            table.add_column("kernel", no_wrap=True)
        for column in ("baseline", "head", "speedup"):
            table.add_column(column, justify="right", no_wrap=True)
        table.add_column("verdict", no_wrap=True)
        for name, (_, base_cell, head_cell, speedup, verdict, style) in zip(
            names, rows, strict=True
        ):
            table.add_row(
                Text(name),
                base_cell,
                head_cell,
                speedup,
                Text(verdict, style=style if color else ""),
            )
        return table

    table = names_fitting(build, [row[0] for row in rows], width)
    console, buffer = console_for([table], width=width, color=color)
    console.print(table)
    return buffer.getvalue()


def compare_main(argv: Sequence[str] | None = None) -> int:
    """Print the table (or Markdown) of HEAD against BASE; exit 1 on a regression or when
    every compared kernel is incomparable or unresolved (one line on stderr says which;
    `--no-fail` exits 0), 0 otherwise; 2 on bad usage."""
    from pytest_kernelpro.review.runs import DEFAULT_HISTORY_DIR, resolve_run

    parser = argparse.ArgumentParser(
        prog="kernelpro compare",
        description="Compare two kernelpro runs (base vs head) with the gate's statistics.",
    )
    parser.add_argument(
        "base", metavar="BASE", nargs="?", default="-2", help="report, baseline YAML or run (-2)"
    )
    parser.add_argument("head", metavar="HEAD", nargs="?", default="-1", help="report or run (-1)")
    parser.add_argument(
        "--history",
        type=Path,
        default=DEFAULT_HISTORY_DIR,
        help=f"run history for -1/-2/ids. Default: {str(DEFAULT_HISTORY_DIR)!r}",
    )
    parser.add_argument(
        "--threshold", type=float, default=None, help="default: each kernel's own threshold"
    )
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    parser.add_argument(
        "--cpu-cross-device",
        choices=("info", "gate"),
        default="info",
        help="another CPU than the base's: info (default, never a regression) or gate",
    )
    parser.add_argument("--markdown", action="store_true", help="print the PR-comment Markdown")
    parser.add_argument(
        "--fail", action="store_true", help="exit 1 when a kernel regressed (the default)"
    )
    parser.add_argument(
        "--no-fail",
        action="store_true",
        help="exit 0 even when a kernel regressed or nothing could be compared (only show)",
    )
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        base_path = resolve_run(args.base, args.history)
        head_path = resolve_run(args.head, args.history)
        base = _base_entries(str(base_path))
        head = records_of(load_report(head_path))
        gated = gate_records(
            base, head, threshold=args.threshold, alpha=args.alpha, cross_cpu=args.cpu_cross_device
        )
    except KernelproError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    if args.markdown:
        from pytest_kernelpro.gate.report import build_report
        from pytest_kernelpro.review.comment import render_comment

        sys.stdout.write(render_comment(build_report(gated, meta={"compared": str(base_path)})))
    else:
        tty = sys.stdout.isatty()
        width = shutil.get_terminal_size((100, 24)).columns if tty else None
        sys.stdout.write(f"base {base_path}\nhead {head_path}\n")
        sys.stdout.write(render_compare_table(base, gated, width=width, color=tty))
        sys.stdout.write("(offline comparison: regressions are not confirmed by re-measuring)\n")
    failure = compare_failure(gated)
    if failure is None or args.no_fail:
        return 0
    sys.stderr.write(f"{failure}\n")
    return 1


def compare_failure(gated: Sequence[KernelRecord]) -> str | None:
    """One line why this comparison fails (a regressed row, or every compared kernel
    incomparable or unresolved: it checked nothing), or None."""
    from pytest_kernelpro.gate.render_session import nothing_checked_line

    regressed = [r.name for r in gated if r.gate and r.gate.change_status == REGRESSED]
    if regressed:
        names = ", ".join(regressed[:5]) + (" ..." if len(regressed) > 5 else "")
        return (
            f"kernelpro compare: {len(regressed)} kernel(s) regressed: {names} "
            "(exit 1; --no-fail only shows)"
        )
    return nothing_checked_line(gated, who="kernelpro compare", allow="--no-fail")
