"""End-of-session outputs: the JSON report, the baseline, the terminal table (its texts:
`gate/terminal_row.py`, `gate/render_session.py`, `gate/optimize_table.py`)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from pytest_kernelpro.errors import KernelproError, KernelproWarning

if TYPE_CHECKING:
    from pytest_kernelpro.run.session import KernelproSession


def write_session_outputs(kp: KernelproSession) -> None:
    """Write the JSON report and, when asked, the baseline and the history; never raise into
    pytest. A write that fails is noted (`kp.write_failed`): the session fails, and no
    line says the file was written."""
    from pytest_kernelpro.gate.report import build_report, write_json_report

    settings = kp.settings
    report = build_report(kp.records, meta=kp.report_meta())
    try:
        write_json_report(settings.json_path, report)
        kp.json_written = True
    except OSError as exc:
        kp.write_failed("JSON report", settings.json_path, exc)
    try:
        _ignore_artifacts_dir(settings.artifacts_dir)
    except OSError as exc:
        kp.write_failed("artifacts .gitignore", settings.artifacts_dir / ".gitignore", exc)
    if settings.history_dir is not None:
        from pytest_kernelpro.gate.history import save_run

        try:
            kp.history_path = save_run(settings.history_dir, report)
        except OSError as exc:
            kp.write_failed(
                f"run history ({settings.sources.get('history')})", settings.history_dir, exc
            )
    if settings.save_baseline is not None and not settings.correctness_only:
        from pytest_kernelpro.gate.baseline import save_baseline

        measured = [r for r in kp.records if r.outcome == "passed" and r.timing]
        try:
            save_baseline(settings.save_baseline, measured)
            kp.baseline_written = True
        except OSError as exc:
            kp.write_failed("baseline", settings.save_baseline, exc)
        except KernelproError as exc:
            warnings.warn(
                f"kernelpro: could not save the baseline to {settings.save_baseline}: {exc}",
                KernelproWarning,
                stacklevel=1,
            )
            kp.write_failed("baseline", settings.save_baseline, exc)


def _ignore_artifacts_dir(path: Any) -> None:
    gitignore = path / ".gitignore"
    if path.is_dir() and not gitignore.exists():
        gitignore.write_text("*\n", encoding="utf-8")


def baseline_coverage_lines(kp: KernelproSession) -> list[str]:
    """What --kernelpro-check could not compare: entries without a kernel and the reverse."""
    baseline = getattr(kp, "_baseline", None)
    if not kp.settings.check or baseline is None:
        return []
    from pytest_kernelpro.gate.baseline import unmatched
    from pytest_kernelpro.gate.render_session import coverage_lines

    left, without = unmatched(baseline, kp.records)
    return coverage_lines(left, without)


def terminal_summary(kp: KernelproSession, terminalreporter: Any) -> None:
    from pytest_kernelpro.gate.render_session import missing_records_line, output_lines
    from pytest_kernelpro.gate.report import render_terminal_table

    writer = getattr(terminalreporter, "_tw", None)
    columns = table_width(writer)
    color = bool(getattr(writer, "hasmarkup", False))
    settings = kp.settings
    terminalreporter.write_sep("=", "kernelpro")
    terminalreporter.write_line(
        render_terminal_table(kp.records, width=columns, color=color, sort=settings.sort).rstrip(
            "\n"
        )
    )
    from pytest_kernelpro.gate.optimize_table import summary_of, terminal_section

    if any(summary_of(r) is not None for r in kp.records):
        terminalreporter.write_sep("=", "kernelpro optimize")
        terminal_section(kp.records, terminalreporter.write_line)
    for line in baseline_coverage_lines(kp):
        terminalreporter.write_line(line, yellow=True)
    for line in summary_notes(kp):
        terminalreporter.write_line(f"kernelpro: {line}")
    missing = kp.missing_records()
    if missing:
        terminalreporter.write_line(missing_records_line(missing, check=settings.check), red=True)
    # Only files that are on disk are named as written; each failed write in red.
    for line in output_lines(
        json_path=settings.json_path if kp.json_written else None,
        records_path=settings.records_path if kp.records_log is not None else None,
        history_path=kp.history_path,
        baseline_path=settings.save_baseline if kp.baseline_written else None,
    ):
        terminalreporter.write_line(line)
    for failure in kp.write_failures:
        terminalreporter.write_line(f"kernelpro: FAILED: {failure}", red=True)


def table_width(writer: Any) -> int | None:
    """The terminal's columns, or None where pytest writes to no terminal (a CI log, a pipe,
    a file): the tables then take the width of their content, since a log has no width to
    fit and a cut table loses its verdicts first."""
    if writer is None:
        return None
    stream = getattr(writer, "_file", None)
    isatty = getattr(stream, "isatty", None)
    if stream is not None and not (callable(isatty) and isatty()):
        return None
    return int(getattr(writer, "fullwidth", 120))


def summary_notes(kp: KernelproSession) -> list[str]:
    """Lines for work that was asked for and did not run, and for timings not to trust
    (the text: `gate.render_session.session_notes`)."""
    from pytest_kernelpro.gate.render_session import session_notes

    return session_notes(kp.settings, kp.records, kp.notes)
