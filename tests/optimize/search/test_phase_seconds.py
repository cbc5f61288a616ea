"""`processes.phase_seconds`: a sandboxed worker's time per phase, from its progress lines."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelpro.optimize.sandbox.processes import phase_seconds


def test_each_phase_lasts_until_the_next_line_and_the_last_until_the_end(tmp_path: Path) -> None:
    progress = tmp_path / "progress.log"
    progress.write_text("start 10.0\nimport 10.5\nbuild 13.0\ntiming 13.25\ndone 14.0\npart")
    phases = phase_seconds(progress, launched=8.0, ended=14.5)
    assert phases == {
        "launch": 2.0,  # the sandbox's setup and the interpreter's start
        "start": 0.5,
        "import": 2.5,
        "build": 0.25,
        "timing": 0.75,
        "done": 0.5,
    }  # the half-written last line is left out
    assert sum(phases.values()) == 14.5 - 8.0


def test_a_phase_reported_twice_adds_up_and_no_file_gives_nothing(tmp_path: Path) -> None:
    progress = tmp_path / "progress.log"
    progress.write_text("start 1.0\ntiming 2.0\nchecks 3.0\ntiming 3.5\n")
    assert phase_seconds(progress, launched=1.0, ended=4.0) == {
        "launch": 0.0,
        "start": 1.0,
        "timing": 1.5,
        "checks": 0.5,
    }
    assert phase_seconds(tmp_path / "missing.log", launched=0.0, ended=1.0) == {}
    (tmp_path / "empty.log").write_text("")
    assert phase_seconds(tmp_path / "empty.log", launched=0.0, ended=1.0) == {}
