"""A requested write that fails (baseline, JSON report, records log, history, JUnit file) fails
the session, naming the path and the OS error; no line says a file was written that was not.

These run as root on CI machines, where a read-only directory does not stop a write: the
failures are made with a path whose parent is a regular file (the directory cannot be made:
EEXIST, for every user) and
with a full disk (os.write raising ENOSPC in the pytester process)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

GATED = """
import pytest, torch

def inp(device):
    return (torch.randn(1024, device=device),)

@pytest.mark.kernelpro(reference=torch.neg, inputs=inp)
def neg(x):
    return -x
"""


def _blocker(project: pytest.Pytester) -> Path:
    """A regular file: no path below it can be created (its directory: EEXIST)."""
    path = project.path / "not-a-dir"
    path.write_text("a file\n")
    return path


def test_a_baseline_that_cannot_be_written_fails_the_session(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=GATED)
    target = _blocker(kp_project) / "kernelpro-baseline.yaml"
    result = kp_project.runpytest(f"--kernelpro-save-baseline={target}")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [f"kernelpro: FAILED: could not write the baseline to {target}: File exists (errno 17)*"]
    )
    assert "baseline written" not in result.stdout.str()
    assert not target.exists()


def test_a_json_report_and_records_log_that_cannot_be_written_fail_the_session(
    kp_project: pytest.Pytester,
) -> None:
    kp_project.makepyfile(test_k=GATED)
    target = _blocker(kp_project) / "report.json"
    result = kp_project.runpytest(f"--kernelpro-json={target}", "-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert f"could not write the JSON report to {target}: File exists (errno 17)" in out
    assert f"could not write the records log to {target.with_suffix('.jsonl')}" in out
    assert "kernelpro: JSON report" not in out  # no line for a file that is not there
    assert "kernelpro: records log" not in out


def test_a_history_that_cannot_be_written_fails_the_session(kp_project: pytest.Pytester) -> None:
    kp_project.makepyfile(test_k=GATED)
    history = _blocker(kp_project) / "history"
    result = kp_project.runpytest(f"-o=kernelpro_history={history}")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"*could not write the run history * to {history}: *"])
    assert "run kept as" not in result.stdout.str()


def test_a_full_disk_fails_the_session_and_names_the_error(
    kp_project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk is full: the data of every output file fails to reach it (ENOSPC from
    fsync, where a full disk reports delayed allocation): the report, the records log and
    the baseline all fail, each by name, and the baseline is not left half written."""
    kp_project.makepyfile(test_k=GATED)
    real_fsync = os.fsync

    def full_disk(fd: int) -> None:
        try:
            name = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            name = ""
        if name.startswith(str(kp_project.path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    class FullDiskOs:
        """`os` as the plugin's file writer sees it, with a full disk behind fsync. Patched
        where the writer looks it up, not as `os.fsync` itself: the timer puts the kept
        `os.fsync` back before it times a kernel (a patched file function is a forgery)."""

        def __getattr__(self, name: str) -> object:
            return getattr(os, name)

        fsync = staticmethod(full_disk)

    from pytest_kernelpro import fileio

    baseline = kp_project.path / "kernelpro-baseline.yaml"
    monkeypatch.setattr(fileio, "os", FullDiskOs())
    result = kp_project.runpytest_inprocess("--kernelpro-save-baseline", "-p", "no:cacheprovider")
    monkeypatch.undo()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "could not write the JSON report to" in out
    assert "could not write the records log to" in out
    assert "No space left on device (errno 28)" in out
    assert f"could not write the baseline to {baseline}: No space left on device" in out
    assert "baseline written" not in out
    assert "kernelpro: JSON report" not in out
    assert not baseline.exists()  # nothing half written: the old file or none


def test_a_junit_file_that_cannot_be_written_fails_the_session(
    kp_project: pytest.Pytester,
) -> None:
    """pytest's own --junitxml: its failure is pytest's internal error, which names the path."""
    kp_project.makepyfile(test_k=GATED)
    target = _blocker(kp_project) / "junit.xml"
    result = kp_project.runpytest_subprocess(f"--junitxml={target}")
    assert result.ret != pytest.ExitCode.OK
    text = result.stdout.str() + result.stderr.str()
    assert f"FileExistsError: [Errno 17] File exists: '{target.parent}'" in text
    assert "generated xml file" not in text
