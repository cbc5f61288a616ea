"""The autotune, environment and confirmation notes of a session, for the terminal table and
the PR comment.

A note line per kernel under the table, not a column: most kernels have none. A kernel's
autotune note is shown when it explains its verdict (a re-measurement decided between the pick
and the code, or the kernel is not "ok"); kernels whose picks differ but that are within
tolerance are counted in one line. The changed versions are the session's, named once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

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


def _quiet_pick_count(records: Sequence[KernelRecord]) -> int:
    return sum(1 for r in records if r.gate and r.gate.autotune_note and not _explains(r))


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


def table_notes(records: Sequence[KernelRecord]) -> list[str]:
    """Plain-text note lines for under the terminal table."""
    lines = [f"{r.name}: {r.gate.autotune_note}" for r in records if _explains(r) and r.gate]
    lines += [f"{r.name}: {note}" for r in records if (note := fresh_process_failure(r))]
    quiet = _quiet_pick_count(records)
    if quiet:
        lines.append(
            f"{quiet} kernel(s) ran with other autotune picks than the baseline's, within "
            "tolerance (the picks are in the JSON report)"
        )
    env = environment_words(records)
    if env:
        lines.append(f"environment changed since the baseline: {env}")
    return lines


def comment_notes(records: Sequence[KernelRecord], literal: Callable[..., str]) -> list[str]:
    """Markdown lines for the PR comment (strings from the report as literal text)."""
    lines = [
        f"- 🔧 {literal(r.name, limit=120, table=False)}: "
        f"{literal(r.gate.autotune_note, limit=600, table=False)}"
        for r in records
        if _explains(r) and r.gate
    ]
    lines += [
        f"- ⚠️ {literal(r.name, limit=120, table=False)}: {literal(note, limit=600, table=False)}"
        for r in records
        if (note := fresh_process_failure(r))
    ]
    quiet = _quiet_pick_count(records)
    if quiet:
        lines.append(
            f"- 🔧 {quiet} kernel(s) ran with other autotune picks than the baseline's, "
            "within tolerance"
        )
    env = environment_words(records)
    if env:
        lines.append(
            f"- 🌐 environment changed since the baseline: {literal(env, limit=600, table=False)}"
        )
    return [*lines, ""] if lines else []
