"""The process notes under the kernel table (gate/process_notes.py), which the table imports
only for a record that gives one (`render_session.gives_process_note`)."""

from __future__ import annotations

from itertools import product

from gate_factories import make_record

from pytest_kernelpro.gate.process_notes import table_notes
from pytest_kernelpro.gate.render_session import gives_process_note, render_terminal_table

AUTOTUNE_NOTE = "autotune picked num_warps=4 for k (key 1), the baseline 8"
CHANGE = {"torch": {"baseline": "2.10.0", "now": "2.11.0"}}
FRESH_ERROR = "the child exited with status 3"


def _record(status: str, autotune_note: str | None, change: dict | None, error: str | None):
    record = make_record(
        "k[1]",
        gate={
            "status": status,
            "change_status": status,
            "reason": "r",
            "autotune_note": autotune_note,
            "environment_change": change,
        },
    )
    if error is not None:
        record.extra["confirmation_fresh_process_error"] = error
    return record


def test_a_record_passed_over_has_no_note_and_each_note_reaches_the_table() -> None:
    for status, note, change, error in product(
        ("ok", "regressed"), (None, "", AUTOTUNE_NOTE), (None, {}, CHANGE), (None, "", FRESH_ERROR)
    ):
        record = _record(status, note, change, error)
        if not gives_process_note(record):
            assert table_notes([record]) == [], (status, note, change, error)
            continue
        lines = table_notes([record])
        assert lines, (status, note, change, error)
        table = render_terminal_table([record], width=None, verbose=True)
        for line in lines:
            assert line in table
    # Each note alone is given and shown.
    assert "torch 2.10.0 -> 2.11.0" in render_terminal_table(
        [_record("ok", None, CHANGE, None)], width=None
    )
    assert "the fresh-process confirmation failed (the child exited with status 3)" in (
        render_terminal_table([_record("ok", None, None, FRESH_ERROR)], width=None)
    )
    assert "1 kernel(s) ran with other autotune picks" in render_terminal_table(
        [_record("ok", AUTOTUNE_NOTE, None, None)], width=None
    )
