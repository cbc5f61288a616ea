"""The process notes of a session: a note line per kernel under the kernel table, not a
column: most kernels have none. A kernel's autotune note is shown when it explains its verdict
(a re-measurement decided between the pick and the code, or the kernel is not "ok"); kernels
whose picks differ but that are within tolerance are counted in one line. The changed versions
are the session's, named once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelpro.gate.format import record_status
from pytest_kernelpro.record import KernelRecord

QUIET = ("ok", "new", "passed", "skipped", "unmeasured")


def _explains(record: KernelRecord) -> bool:
    gate = record.gate
    if gate is None or not gate.autotune_note:
        return False
    return record_status(record) not in QUIET or bool((gate.autotune or {}).get("decided"))


def environment_words(records: Sequence[KernelRecord]) -> str | None:
    """'torch 2.10.0 -> 2.11.0 (3 kernels)' over the session's changed versions, or None."""
    from pytest_kernelpro.gate.run_differences import changes_words

    counts: dict[str, int] = {}
    for record in records:
        change = record.gate.environment_change if record.gate else None
        if change:
            words = changes_words(change)
            counts[words] = counts.get(words, 0) + 1
    if not counts:
        return None
    return "; ".join(f"{words} ({n} kernel{'s' * (n != 1)})" for words, n in counts.items())


def fresh_process_failure(record: KernelRecord) -> str | None:
    """'the fresh-process confirmation failed (...); re-measured in this process', or None:
    a confirmation that could not run where it should is news, never only in the JSON."""
    error = record.extra.get("confirmation_fresh_process_error")
    if not error:
        return None
    from pytest_kernelpro.text_safety import safe_line

    text = str(error).strip()
    first = safe_line(text.splitlines()[0] if text else "no detail", 300)
    return (
        f"the fresh-process confirmation failed ({first}); re-measured in this process "
        "instead (the JSON report holds the child's output)"
    )


@dataclass(frozen=True)
class ProcessNotes:
    """The process notes of a session (module docstring)."""

    picks: list[tuple[str, str]]  # (kernel, its autotune note) where the note explains it
    fresh_failures: list[tuple[str, str]]  # (kernel, why its fresh-process confirmation failed)
    quiet_picks: int  # kernels with other picks than the baseline's, within tolerance
    environment: str | None  # the session's changed versions, in words


def process_notes(records: Sequence[KernelRecord]) -> ProcessNotes:
    """The session's process notes, read from its records once."""
    return ProcessNotes(
        picks=[
            (r.name, r.gate.autotune_note)
            for r in records
            if r.gate and r.gate.autotune_note and _explains(r)
        ],
        fresh_failures=[(r.name, note) for r in records if (note := fresh_process_failure(r))],
        quiet_picks=sum(1 for r in records if r.gate and r.gate.autotune_note and not _explains(r)),
        environment=environment_words(records),
    )


QUIET_PICKS = "kernel(s) ran with other autotune picks than the baseline's, within tolerance"


def table_notes(records: Sequence[KernelRecord]) -> list[str]:
    """Plain-text note lines for under the terminal table."""
    notes = process_notes(records)
    lines = [f"{name}: {note}" for name, note in (*notes.picks, *notes.fresh_failures)]
    if notes.quiet_picks:
        lines.append(f"{notes.quiet_picks} {QUIET_PICKS} (the picks are in the JSON report)")
    if notes.environment:
        lines.append(f"environment changed since the baseline: {notes.environment}")
    return lines
