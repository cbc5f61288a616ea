"""Whether a `--kernelpro-check` session checked nothing, and the one line that says why.

The rule: among the kernels that were timed and had a baseline entry (every verdict but
"new" and "not timed"), when each one is "incomparable" (a baseline from another machine) or
"unresolved" (a tolerance too wide to catch a 1.5x change), the gate compared nothing it could
fail on, and the session fails (exit 1) unless `--kernelpro-allow-incomparable` says that is
on purpose. One kernel compared for real is a check: the others are counted under the table.
A session without any compared kernel (all new, all failed) is told by the coverage lines and
the items' own failures, not here.

`too_noisy_note`: a baseline whose entries would make every later check of them "unresolved",
said when it is saved.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pytest_kernelpro.errors import KernelproError
from pytest_kernelpro.gate.baseline import BaselineEntry
from pytest_kernelpro.gate.render_session import NOTE_WIDTH, Note
from pytest_kernelpro.gate.verdict import RESOLVABLE_TOLERANCE, decide_verdict
from pytest_kernelpro.record import KernelRecord

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


def allowed(config: Any) -> bool:
    """`--kernelpro-allow-incomparable` (or its ini key / environment variable) is set."""
    from pytest_kernelpro.config import resolve_setting
    from pytest_kernelpro.setting_table import SETTINGS_BY_NAME

    value, _ = resolve_setting(config, SETTINGS_BY_NAME["allow_incomparable"])
    return bool(value)


def session_line(config: Any, records: Sequence[KernelRecord], *, check: bool) -> str | None:
    """The line that fails a `--kernelpro-check` session that checked nothing, or None (no
    check, something was checked, or allowed on purpose)."""
    if not check or allowed(config):
        return None
    return nothing_checked_line(records)


def too_noisy_note(records: Iterable[KernelRecord]) -> Note | None:
    """The kernels whose saved entry could not catch a 1.5x change: each record compared
    with its own entry, as an unchanged next run would be, gets a tolerance above
    `verdict.RESOLVABLE_TOLERANCE` (a bimodal or widely scattered timing, a loaded machine),
    so every later check of it would read "unresolved". None when every entry is fine."""
    noisy: list[tuple[str, float, str]] = []
    for record in records:
        entry = BaselineEntry.from_record(record)
        if entry is None:
            continue
        try:
            verdict = decide_verdict(record, entry)
        except (KernelproError, ValueError):
            continue  # an entry the gate cannot read is said when it is compared
        if verdict.tolerance > RESOLVABLE_TOLERANCE:
            noisy.append((record.name, verdict.tolerance, verdict.reason))
    if not noisy:
        return None
    fix = "re-save it on a quiet machine or with a longer --kernelpro-time-budget"
    worst = max(noisy, key=lambda n: n[1])
    head = f"baseline: {len(noisy)} entr{'y' if len(noisy) == 1 else 'ies'} too noisy to catch 1.5x"
    tail = "; re-save it on a quiet machine"
    short = f"{head} ({worst[0]} ±{worst[1]:.0%}){tail}"
    if len(short) > NOTE_WIDTH:  # a long name gives way, the fix stays
        short = f"{head} (±{worst[1]:.0%}){tail}"
    full = (
        f"the saved baseline has {len(noisy)} entr{'y' if len(noisy) == 1 else 'ies'} too noisy "
        "to catch a 1.5x change; every check against it will read them 'unresolved': "
        + "; ".join(f"{name}: tolerance ±{tol:.0%} ({reason})" for name, tol, reason in noisy)
        + f". Fix: {fix}"
    )
    return Note(short, full)
