"""One condition of the session as a note (`Note`): its terminal line, cut to one line
(`fit`, `names_line`, `plain_note`), and its full text. The notes under the kernel table
(`render_session.py`, `condition_notes.py`) and the baseline's (`baseline_save.py`) are made
of these.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelpro.record import KernelRecord


def kernel_names(records: Sequence[KernelRecord], limit: int = 5) -> str:
    """The first `limit` kernels' names, and how many more."""
    names = [r.name for r in records[:limit]]
    return ", ".join(names) + (f" and {len(records) - limit} more" if len(records) > limit else "")


# A note's terminal line, after the "kernelpro: " it is printed with, stays under 100
# characters: one line per condition in an 80-100 column terminal or a CI log.
NOTE_WIDTH = 88


@dataclass(frozen=True)
class Note:
    """One condition of the session. `short`: its terminal line (under NOTE_WIDTH
    characters, naming the setting or step that changes it); `full`: the whole text, shown
    under -v and kept in the JSON report and the PR comment's details; `normal`: the
    machine's normal state (said only in the full text)."""

    short: str
    full: str
    normal: bool = False


def fit(text: str, width: int = NOTE_WIDTH) -> str:
    """`text` cut to `width` characters at a word, with an ellipsis when cut."""
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0].rstrip(",;:(")
    return cut + "…"


def names_line(head: str, records: Sequence[KernelRecord], tail: str) -> str:
    """`head (names)tail` within NOTE_WIDTH: the names give way first (`tail` names the
    setting, so it is never cut)."""
    for limit in (3, 2, 1):
        text = f"{head} ({kernel_names(records, limit)}){tail}"
        if len(text) <= NOTE_WIDTH:
            return text
    return fit(f"{head}{tail}")


def plain_note(text: str) -> Note:
    """A note another part of the session gave as one string: cut to one line that says -v
    has the rest, keeping a closing "(what to do)" of up to 45 characters, which is where
    these notes name their fix ("(`kernelpro calibrate` on a quiet machine)")."""
    if len(text) <= NOTE_WIDTH:
        return Note(text, text)
    fix = re.search(r" \(([^()]{1,43})\)$", text)
    tail = fix.group(0) if fix else " (-v)"
    return Note(fit(text[: fix.start()] if fix else text, NOTE_WIDTH - len(tail)) + tail, text)
