"""The notes of a session's exceptions: baseline entries and kernels that did not match
(`coverage_lines`), verdicts unresolved, kernels skipped. The session imports this module only
when it has one (a busy CPU, the normal state of a shared runner, is said by `render_session`
itself).
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kernelpro.gate.format import Note, fit, kernel_names, names_line, plain_note
from pytest_kernelpro.record import KernelRecord


def _listed(names: Sequence[str], limit: int = 10) -> str:
    return ", ".join(names[:limit]) + (" ..." if len(names) > limit else "")


def coverage_lines(
    left: Sequence[str], without: Sequence[str], *, verbose: bool = True
) -> list[str]:
    """`left`: baseline entries no kernel of the run matched; `without`: kernels with no
    baseline entry. Without `verbose` one short line each (-v lists them)."""
    entries = f"{len(left)} baseline entr{'y' if len(left) == 1 else 'ies'}"
    kernels = f"{len(without)} kernel(s)"
    said = (  # (names, the full words, the short words)
        (
            left,
            f"{entries} matched no kernel of this run (removed, renamed or deselected)",
            f"{entries} matched no kernel (renamed or deselected?)",
        ),
        (
            without,
            f"{kernels} have no baseline entry (new or renamed; --kernelpro-save-baseline adds "
            "them)",
            f"{kernels} without a baseline entry (--kernelpro-save-baseline)",
        ),
    )
    return [
        "kernelpro: "
        + (f"{full}: {_listed(names)}" if verbose else fit(f"{short}: {_listed(names, 2)}"))
        for names, full, short in said
        if names
    ]


def unresolved_note(unresolved: Sequence[KernelRecord]) -> Note:
    """Verdicts whose tolerance cannot tell a 1.5x change (`gate.verdict.UNRESOLVED`)."""
    widest = max(r.gate.tolerance for r in unresolved if r.gate)
    full = f"{len(unresolved)} kernel(s) unresolved: " + "; ".join(
        f"{r.name}: {r.gate.reason}" for r in unresolved if r.gate
    )
    short = names_line(
        f"{len(unresolved)} kernel(s) unresolved, tolerance up to ±{widest:.0%}",
        unresolved,
        "; re-save the baseline on a quiet machine",
    )
    return Note(short, full)


def skip_notes(records: Sequence[KernelRecord]) -> list[Note]:
    """One line per distinct reason kernels were skipped (pytest's own summary shows skip
    reasons only with -rs)."""
    # Kernels skipped alike share a line: grouped by the first clause of their reason, with
    # the kernel's own name taken out; the full text lists each reason once.
    by_clause: dict[str, list[tuple[KernelRecord, str]]] = {}
    for record in records:
        if record.outcome == "skipped":
            reason = _without_name(skip_reason(record), record.name)
            by_clause.setdefault(_first_clause(reason), []).append((record, reason))
    notes = []
    for clause, group in by_clause.items():
        kernels = [record for record, _ in group]
        reasons = "; ".join(dict.fromkeys(reason for _, reason in group))
        notes.append(
            Note(
                plain_note(f"{len(kernels)} kernel(s) skipped: {clause}").short,
                f"{len(kernels)} kernel(s) skipped ({kernel_names(kernels)}): {reasons}",
            )
        )
    return notes


def _first_clause(reason: str) -> str:
    """A skip reason's first clause ("it needs a CUDA GPU"), with " (-v)" when cut there."""
    head = reason.split(", but ", 1)[0].split("; ", 1)[0].split(" (", 1)[0]
    return head if head == reason else f"{head} (-v)"


def _without_name(reason: str, name: str) -> str:
    """`reason` with the kernel's name said as "it" where the reason starts with it ("NAME is
    a cuda kernel that ..."), the one place a skip reason names its kernel; the name found
    elsewhere is a word of the reason (a kernel named `a` in "needs a CUDA GPU")."""
    return "it" + reason[len(name) :] if reason.startswith(name + " ") else reason


def skip_reason(record: KernelRecord) -> str:
    """Why a kernel item was skipped, as the record keeps it."""
    reason = record.message or "no reason given"
    return str(reason).removeprefix("Skipped: ").strip()
