"""The notes of the session's rarer conditions: timings taken on an oversubscribed CPU,
verdicts unresolved, kernels skipped. `render_session.session_conditions` imports this module
only when the session has one of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kernelpro.gate.note import NOTE_WIDTH, Note, fit, kernel_names, names_line, plain_note
from pytest_kernelpro.record import KernelRecord


def busy_note(busy: Sequence[KernelRecord], *, check: bool) -> Note:
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
