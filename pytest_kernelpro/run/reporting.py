"""End-of-session outputs: the JSON report, the baseline, the terminal table."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from ..errors import KernelproError, KernelproWarning

if TYPE_CHECKING:
    from .session import KernelproSession


def write_session_outputs(kp: KernelproSession) -> None:
    """Write the JSON report and, when asked, the baseline; never raise into pytest."""
    from ..gate.report import build_report, write_json_report

    settings = kp.settings
    report = build_report(kp.records, meta=kp.report_meta())
    try:
        write_json_report(settings.json_path, report)
        _ignore_artifacts_dir(settings.artifacts_dir)
    except OSError as exc:
        warnings.warn(
            f"kernelpro: could not write the JSON report to {settings.json_path}: {exc}; "
            "set --kernelpro-json to a writable path",
            KernelproWarning,
            stacklevel=1,
        )
    if settings.history_dir is not None:
        from ..gate.history import save_run

        try:
            kp.history_path = save_run(settings.history_dir, report)
        except OSError as exc:
            warnings.warn(
                f"kernelpro: could not keep this run in the history {settings.history_dir} "
                f"({settings.sources.get('history')}): {exc}; set kernelpro_history to a "
                "writable directory or to off",
                KernelproWarning,
                stacklevel=1,
            )
    if settings.save_baseline is not None and not settings.correctness_only:
        from ..gate.baseline import save_baseline

        measured = [r for r in kp.records if r.outcome == "passed" and r.timing]
        try:
            save_baseline(settings.save_baseline, measured)
        except (OSError, KernelproError) as exc:
            warnings.warn(
                f"kernelpro: could not save the baseline to {settings.save_baseline}: {exc}",
                KernelproWarning,
                stacklevel=1,
            )


def _ignore_artifacts_dir(path: Any) -> None:
    gitignore = path / ".gitignore"
    if path.is_dir() and not gitignore.exists():
        gitignore.write_text("*\n", encoding="utf-8")


def baseline_coverage_lines(kp: KernelproSession) -> list[str]:
    """What --kernelpro-check could not compare: entries without a kernel and the reverse."""
    baseline = getattr(kp, "_baseline", None)
    if not kp.settings.check or baseline is None:
        return []
    from ..gate.baseline import unmatched

    left, without = unmatched(baseline, kp.records)
    lines = []
    if left:
        lines.append(
            f"kernelpro: {len(left)} baseline entr{'y' if len(left) == 1 else 'ies'} matched no "
            f"kernel of this run (removed, renamed or deselected): {', '.join(left[:10])}"
            + (" ..." if len(left) > 10 else "")
        )
    if without:
        lines.append(
            f"kernelpro: {len(without)} kernel(s) have no baseline entry (new or renamed; "
            f"--kernelpro-save-baseline adds them): {', '.join(without[:10])}"
            + (" ..." if len(without) > 10 else "")
        )
    return lines


def terminal_summary(kp: KernelproSession, terminalreporter: Any) -> None:
    from ..gate.report import render_terminal_table

    width = getattr(terminalreporter, "_tw", None)
    columns = getattr(width, "fullwidth", 120) if width is not None else 120
    color = bool(getattr(width, "hasmarkup", False))
    settings = kp.settings
    terminalreporter.write_sep("=", "kernelpro")
    terminalreporter.write_line(
        render_terminal_table(kp.records, width=columns, color=color, sort=settings.sort).rstrip(
            "\n"
        )
    )
    from ..gate.optimize_table import summary_of, terminal_section

    if any(summary_of(r) is not None for r in kp.records):
        terminalreporter.write_sep("=", "kernelpro optimize")
        terminal_section(kp.records, terminalreporter.write_line)
    for line in baseline_coverage_lines(kp):
        terminalreporter.write_line(line, yellow=True)
    for line in summary_notes(kp):
        terminalreporter.write_line(f"kernelpro: {line}")
    missing = kp.missing_records()
    if missing:
        verdict = "fails the check" if settings.check else "not checked"
        terminalreporter.write_line(
            f"kernelpro: {len(missing)} collected kernel(s) left no record ({verdict}): "
            + ", ".join(missing[:10])
            + (" ..." if len(missing) > 10 else ""),
            red=True,
        )
    terminalreporter.write_line(f"kernelpro: JSON report {settings.json_path}")
    terminalreporter.write_line(
        f"kernelpro: records log {settings.records_path} (`kernelpro report` rebuilds the "
        "report from it)"
    )
    if kp.history_path is not None:
        terminalreporter.write_line(
            f"kernelpro: run kept as {kp.history_path.stem} (`kernelpro compare` compares the "
            "last two runs)"
        )
    if settings.save_baseline is not None and not settings.correctness_only:
        terminalreporter.write_line(f"kernelpro: baseline written to {settings.save_baseline}")


def _names(records: list[Any], limit: int = 5) -> str:
    names = [r.name for r in records[:limit]]
    return ", ".join(names) + (f" and {len(records) - limit} more" if len(records) > limit else "")


def summary_notes(kp: KernelproSession) -> list[str]:
    """Lines for work that was asked for and did not run, and for timings not to trust."""
    settings = kp.settings
    records = kp.records
    notes: list[str] = []
    if settings.correctness_only:
        checked = [r for r in records if r.extra.get("correctness_only")]
        notes.append(
            f"correctness only: {len(checked)} kernel(s) checked; nothing was timed, placed on "
            "the roofline, gated or profiled"
            + ("; no baseline written" if settings.save_baseline is not None else "")
        )
    busy = [r for r in records if r.timing is not None and r.timing.oversubscribed]
    if busy:
        load = busy[0].timing.cpu_load or {} if busy[0].timing else {}
        from ..measure.cpuload import CpuLoad

        notes.append(
            f"{len(busy)} CPU timing(s) taken on an oversubscribed CPU ({_names(busy)}): "
            f"{CpuLoad.from_dict(load).describe()}. Treat them as suspect: a slowdown there is "
            "reported as suspect, never failed; re-run on a quiet machine"
            + (" or with --kernelpro-cpu-threads=1" if (load.get("threads") or 1) > 1 else "")
        )
    overrun = [r for r in records if r.timing is not None and r.timing.budget_note]
    if overrun:
        notes.append(
            f"{len(overrun)} CPU timing(s) overran the time budget ({_names(overrun)}): "
            f"{overrun[0].timing.budget_note if overrun[0].timing else ''}"
        )
    unprofiled = [r for r in records if r.extra.get("profile_skipped")]
    if settings.profile and unprofiled:
        notes.append(
            f"--kernelpro-profile: {len(unprofiled)} kernel(s) not profiled ({_names(unprofiled)}): "
            "ncu, SASS and timeline need a CUDA GPU, and this run had none"
        )
    invalid = [r for r in records if r.extra.get("invalid_marker")]
    if invalid:
        notes.append(
            f"{len(invalid)} kernel(s) with an invalid marker failed without running "
            f"({_names(invalid)}); the failure says what to fix"
        )
    notes.extend(kp.notes)
    return notes
