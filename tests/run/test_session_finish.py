"""The session's finish reads its conditions once: the JSON report's notes and the terminal's
lines are the same conditions, made again only after a record or a note was added."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from pytest_kernelpro.record import KernelRecord
from pytest_kernelpro.run.session import KernelproSession, summary_notes


def _session(**settings: Any) -> KernelproSession:
    values = {
        "profile_timeout_s": 60.0,
        "auto_profiles": 0,
        "auto_profile_time_s": 0.0,
        "records_path": Path("records.jsonl"),
        "artifacts_dir": Path("artifacts"),
        "budget_for": lambda kind: 1.0,
        "correctness_only": False,
        "check": True,
        "profile": False,
        "save_baseline": None,
        **settings,
    }
    config = SimpleNamespace(option=SimpleNamespace(verbose=0))
    return KernelproSession(settings=SimpleNamespace(**values), config=config)  # type: ignore[arg-type]


def _skipped(name: str) -> KernelRecord:
    return KernelRecord(
        nodeid=f"t.py::{name}", name=name, kernel=name, outcome="skipped", message="needs a GPU"
    )


def test_the_json_and_the_terminal_share_one_reading_of_the_conditions(monkeypatch) -> None:
    import pytest_kernelpro.gate.render_session as render_session

    made: list[int] = []
    real = render_session.session_conditions

    def counted(settings: Any, records: Any, notes: Any = ()) -> Any:
        made.append(len(records))
        return real(settings, records, notes)

    monkeypatch.setattr(render_session, "session_conditions", counted)
    kp = _session()
    kp.records.append(_skipped("k_alpha"))
    full = summary_notes(kp, full=True)
    short = summary_notes(kp)
    assert made == [1]
    assert full == ["1 kernel(s) skipped (k_alpha): needs a GPU"]
    assert short == ["1 kernel(s) skipped: needs a GPU"]


def test_a_record_or_a_note_added_later_is_said(monkeypatch) -> None:
    """The attack on a memo: a condition that arrives after the first reading (a note the
    baseline's save adds, a record of a late xdist worker) must not be lost."""
    kp = _session()
    kp.records.append(_skipped("k_alpha"))
    assert len(summary_notes(kp)) == 1
    kp.notes.append("ceilings of cpu: measured under load")
    assert summary_notes(kp)[-1] == "ceilings of cpu: measured under load"
    kp.records.append(_skipped("k_beta"))
    assert summary_notes(kp, full=True)[0] == "2 kernel(s) skipped (k_alpha, k_beta): needs a GPU"


def test_the_coverage_is_said_only_under_a_check_with_a_baseline() -> None:
    from pytest_kernelpro.gate.baseline import Baseline

    kp = _session(check=False)
    kp._baseline = Baseline(path="b.yaml", device="", commit=None, created="", tool="")
    assert kp.coverage() is None
    kp = _session()
    assert kp.coverage() is None  # no baseline loaded
    kp._baseline = Baseline(path="b.yaml", device="", commit=None, created="", tool="")
    assert kp.coverage() == ([], [])
