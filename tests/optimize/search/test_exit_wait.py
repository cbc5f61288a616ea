"""The watcher's pause between polls ends when the worker exits (`processes.ExitWait`, a
pidfd), so an evaluation does not wait out a poll interval after its worker is done; like
`exited`, it never reaps the worker (its process group id stays safe to kill)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from pytest_kernelpro.optimize.sandbox import processes
from pytest_kernelpro.optimize.sandbox.processes import ExitWait, exited

LONG_PAUSE_S = 60.0  # far beyond the child's life: only its exit can end the pause early


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="needs os.pidfd_open (Linux 5.3+)")
def test_a_pause_ends_at_the_exit_and_leaves_the_process_unreaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        started = time.monotonic()
        with ExitWait(child) as wait:
            wait.pause(LONG_PAUSE_S)
        assert time.monotonic() - started < LONG_PAUSE_S / 2
        assert exited(child)
        assert child.returncode is None  # not reaped: the pid is still ours
    finally:
        child.wait()


def test_without_pidfds_a_pause_is_a_plain_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(processes.os, "pidfd_open", raising=False)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with ExitWait(child) as wait:
            started = time.monotonic()
            wait.pause(0.05)
            assert time.monotonic() - started >= 0.05
        assert not exited(child)
    finally:
        child.kill()
        child.wait()
