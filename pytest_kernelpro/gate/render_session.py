"""Every text about the session as a whole, in one place (the texts made from one record are
in format.py (item_section, terminal_row), comment.py, prompt_reference.py, plot.py):
the lines under the terminal summary's tables.

- `coverage_lines`: what `--kernelpro-check` could not compare (baseline entries without a
  kernel, kernels without an entry);
- `session_notes`: work that was asked for and did not run, and timings not to trust;
- `missing_records_line`: collected kernels that left no record;
- `output_lines`: where the report, the records log, the history's run and the baseline are;
- `table_footnotes`: the lines right under the kernel table, after its counts (the CPU cache
  flush the CPU timings were taken with, ...): one function per note, listed there.

Pure functions of the settings, the records and the paths; `run/session.py` writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_kernelpro.record import KernelRecord


def _names(records: Sequence[KernelRecord], limit: int = 5) -> str:
    names = [r.name for r in records[:limit]]
    return ", ".join(names) + (f" and {len(records) - limit} more" if len(records) > limit else "")


def _listed(names: Sequence[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


def coverage_lines(left: Sequence[str], without: Sequence[str]) -> list[str]:
    """`left`: baseline entries no kernel of the run matched; `without`: kernels with no
    baseline entry."""
    lines = []
    if left:
        lines.append(
            f"kernelpro: {len(left)} baseline entr{'y' if len(left) == 1 else 'ies'} matched no "
            f"kernel of this run (removed, renamed or deselected): {_listed(left)}"
        )
    if without:
        lines.append(
            f"kernelpro: {len(without)} kernel(s) have no baseline entry (new or renamed; "
            f"--kernelpro-save-baseline adds them): {_listed(without)}"
        )
    return lines


def session_notes(
    settings: Any, records: Sequence[KernelRecord], notes: Sequence[str] = ()
) -> list[str]:
    """Lines for work that was asked for and did not run, and for timings not to trust;
    `notes` (added by other parts of the session) come last."""
    out: list[str] = []
    if settings.correctness_only:
        checked = [r for r in records if r.extra.get("correctness_only")]
        out.append(
            f"correctness only: {len(checked)} kernel(s) checked; nothing was timed, placed on "
            "the roofline, gated or profiled"
            + ("; no baseline written" if settings.save_baseline is not None else "")
        )
    busy = [r for r in records if r.timing is not None and r.timing.oversubscribed]
    if busy:
        load = busy[0].timing.cpu_load or {} if busy[0].timing else {}
        from pytest_kernelpro.measure.timing.cpu import CpuLoad

        anchored = all(
            (r.timing.anchor or {}).get("layout") == "cpu-pairs" for r in busy if r.timing
        )
        advice = (
            "They are gated in on-CPU time against the CPU anchor, at a tolerance widened for "
            "the load (the verdicts say how far); a quiet machine resolves smaller changes"
            if anchored
            else "Treat them as suspect: a slowdown there is reported as suspect, never failed; "
            "re-run on a quiet machine"
        )
        out.append(
            f"{len(busy)} CPU timing(s) taken on an oversubscribed CPU ({_names(busy)}): "
            f"{CpuLoad.from_dict(load).describe()}. {advice}"
            + (" or with --kernelpro-cpu-threads=1" if (load.get("threads") or 1) > 1 else "")
        )
    fixed = [r for r in records if r.timing and (r.timing.honesty or {}).get("inputs_fixed")]
    if fixed:
        first = ((fixed[0].timing.honesty or {}) if fixed[0].timing else {}).get("inputs_fixed")
        out.append(f"{len(fixed)} kernel(s) timed on inputs that stay the same: {first}")
    overrun = [r for r in records if r.timing is not None and r.timing.budget_note]
    if overrun:
        out.append(
            f"{len(overrun)} CPU timing(s) overran the time budget ({_names(overrun)}): "
            f"{overrun[0].timing.budget_note if overrun[0].timing else ''}"
        )
    unprofiled = [r for r in records if r.extra.get("profile_skipped")]
    if settings.profile and unprofiled:
        out.append(
            f"--kernelpro-profile: {len(unprofiled)} kernel(s) not profiled ({_names(unprofiled)}): "
            "ncu, SASS and timeline need a CUDA GPU, and this run had none"
        )
    invalid = [r for r in records if r.extra.get("invalid_marker")]
    if invalid:
        out.append(
            f"{len(invalid)} kernel(s) with an invalid marker failed without running "
            f"({_names(invalid)}); the failure says what to fix"
        )
    out.extend(notes)
    return out


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
) -> list[str]:
    """Where this session's outputs are: only those that were written (None: not written)."""
    lines = []
    if json_path is not None:
        lines.append(f"kernelpro: JSON report {json_path}")
    if records_path is not None:
        lines.append(
            f"kernelpro: records log {records_path} (`kernelpro report` rebuilds the report "
            "from it)"
        )
    if history_path is not None:
        lines.append(
            f"kernelpro: run kept as {history_path.stem} (`kernelpro compare` compares the "
            "last two runs)"
        )
    if baseline_path is not None:
        lines.append(f"kernelpro: baseline written to {baseline_path}")
    return lines


def table_footnotes(records: Sequence[KernelRecord]) -> list[str]:
    """The notes printed right under the kernel table, after its counts: what a reader needs
    to read its rows right. Each note is one function of the records, None when it has
    nothing to say."""
    notes = (cpu_flush_line(records),)
    return [note for note in notes if note]


def cpu_flush_line(records: Sequence[KernelRecord]) -> str | None:
    """What the CPU timings' cache flush was, said under the table since it decides how a
    small kernel's time compares with a warm-cache loop (pytest-benchmark's, timeit's)."""
    timed = [r.timing for r in records if r.timing is not None and r.device_kind == "cpu"]
    if not timed:
        return None
    modes = sorted({str((t.budget or {}).get("cpu_flush") or "auto") for t in timed})
    flushed = [t for t in timed if t.flushed_l2]
    mode = f"--kernelpro-cpu-flush={'/'.join(modes)}"
    if not flushed:
        return f"CPU timings: warm cache, no flush before the samples ({mode})"
    size = max(t.flush_bytes or 0 for t in flushed) / 2**20
    auto = ", the default: flush when the inputs fit in the cache" if modes == ["auto"] else ""
    return (
        f"CPU timings: cache ({size:.0f} MiB) flushed before every sample of {len(flushed)} "
        f"of {len(timed)} kernel(s) ({mode}{auto}), so these are cold-cache times, slower for "
        "a small kernel than a warm loop such as pytest-benchmark's; "
        "--kernelpro-cpu-flush=off times warm"
    )
