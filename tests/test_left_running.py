"""The left-running guard (tests/left_running.py): a test that leaves a thread or a child
process running fails itself, naming it; one that stops what it started, or whose thread
belongs to a wider fixture, does not. Each attack is an inner pytest run (pytester, in this
process) with the guard loaded; what the inner test leaves is stopped here afterwards."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import left_running
import pytest

# The inner tests' threads run until this file exists (their stop word from this side).
SPIN = """
import os, threading, time

STOP = {stop!r}

def spin():
    while not os.path.exists(STOP):
        time.sleep(0.01)
"""


@pytest.fixture
def stop_file(tmp_path: Path) -> Iterator[Path]:
    """Where the inner tests' threads look for their stop word; written, and every thread
    they left joined, once the outer test is done with them."""
    stop = tmp_path / "stop"
    before = set(threading.enumerate())
    yield stop
    stop.write_text("stop")
    for thread in set(threading.enumerate()) - before:
        thread.join()


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(left_running, "GRACE_S", 0.3)  # what is left is left for good here


def inner(pytester: pytest.Pytester, stop: Path, body: str) -> pytest.RunResult:
    pytester.makepyfile(test_leaves=SPIN.format(stop=str(stop)) + body)
    return pytester.runpytest("-p", "left_running")


@pytest.mark.usefixtures("short_grace")
@pytest.mark.parametrize("daemon", [True, False])
def test_a_thread_left_running_fails_its_test_with_its_name_and_target(
    pytester: pytest.Pytester, stop_file: Path, daemon: bool
) -> None:
    result = inner(
        pytester,
        stop_file,
        f"""
def test_starts_and_forgets():
    threading.Thread(target=spin, name="attack-leftover", daemon={daemon}).start()

def test_after_it():
    pass
""",
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_starts_and_forgets*",
            f"*thread 'attack-leftover' (target test_leaves.spin, daemon={daemon})*",
        ]
    )
    assert "test_after_it" not in "".join(line for line in result.outlines if "ERROR" in line)


@pytest.mark.usefixtures("short_grace")
def test_a_thread_subclass_is_named_by_its_run(pytester: pytest.Pytester, stop_file: Path) -> None:
    result = inner(
        pytester,
        stop_file,
        """
class Poller(threading.Thread):
    def run(self):
        spin()

def test_starts_a_subclass():
    Poller(name="attack-poller", daemon=True).start()
""",
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*thread 'attack-poller' (target test_leaves.Poller.run*"])


@pytest.mark.usefixtures("short_grace")
def test_a_child_process_left_running_fails_its_test_and_is_killed(
    pytester: pytest.Pytester, stop_file: Path
) -> None:
    pid_file = pytester.path / "child.pid"
    result = inner(
        pytester,
        stop_file,
        f"""
import subprocess, sys

KEPT = []

def test_starts_a_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    KEPT.append(child)  # no __del__ of it during the run
    with open({str(pid_file)!r}, "w") as out:
        out.write(str(child.pid))
""",
    )
    result.assert_outcomes(passed=1, errors=1)
    pid = int(pid_file.read_text())
    result.stdout.fnmatch_lines([f"*child process {pid} (*time.sleep(600)*"])
    assert not os.path.exists(f"/proc/{pid}")  # killed and reaped by the guard
    # Its Popen knows it ended: collected in a later test, it would warn there that
    # "subprocess N is still running" (an error), blaming that test.
    (popen,) = [o for o in gc.get_objects() if type(o) is subprocess.Popen and o.pid == pid]
    assert popen.returncode == -signal.SIGKILL


def test_a_thread_stopped_and_joined_passes(pytester: pytest.Pytester, stop_file: Path) -> None:
    result = inner(
        pytester,
        stop_file,
        """
def test_starts_and_joins(tmp_path):
    global STOP
    STOP = str(tmp_path / "own-stop")
    thread = threading.Thread(target=spin, name="attack-joined")
    thread.start()
    try:
        pass
    finally:
        open(STOP, "w").close()
        thread.join()
""",
    )
    result.assert_outcomes(passed=1)


def test_a_thread_told_to_stop_but_not_joined_passes(
    pytester: pytest.Pytester, stop_file: Path
) -> None:
    # Ending on its own after the test (its next poll sees the word): not a leak.
    result = inner(
        pytester,
        stop_file,
        """
def test_tells_it_to_stop(tmp_path):
    global STOP
    STOP = str(tmp_path / "own-stop")
    threading.Thread(target=spin, name="attack-ending", daemon=True).start()
    open(STOP, "w").close()
""",
    )
    result.assert_outcomes(passed=1)


@pytest.mark.usefixtures("short_grace")
def test_a_thread_of_a_module_fixture_is_not_blamed_on_its_first_test(
    pytester: pytest.Pytester, stop_file: Path
) -> None:
    result = inner(
        pytester,
        stop_file,
        """
import pytest

@pytest.fixture(scope="module")
def server(tmp_path_factory):
    global STOP
    STOP = str(tmp_path_factory.mktemp("server") / "stop")
    thread = threading.Thread(target=spin, name="attack-server", daemon=True)
    thread.start()
    yield thread
    open(STOP, "w").close()
    thread.join()

def test_first(server):
    assert server.is_alive()

def test_second(server):
    assert server.is_alive()
""",
    )
    result.assert_outcomes(passed=2)


@pytest.mark.usefixtures("short_grace")
def test_the_mark_lets_a_thread_stay_only_with_a_reason(
    pytester: pytest.Pytester, stop_file: Path
) -> None:
    result = inner(
        pytester,
        stop_file,
        """
import pytest

@pytest.mark.leaves_running(reason="a library's pool, idle between uses")
def test_with_a_reason():
    threading.Thread(target=spin, name="attack-pool", daemon=True).start()

@pytest.mark.leaves_running
def test_without_one():
    pass
""",
    )
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*leaves_running needs reason=*"])


@pytest.mark.usefixtures("short_grace")
def test_the_log_mode_records_instead_of_failing(
    pytester: pytest.Pytester, stop_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = pytester.path / "left.log"
    monkeypatch.setenv(left_running.LOG_ENV, str(log))
    result = inner(
        pytester,
        stop_file,
        """
def test_starts_and_forgets():
    threading.Thread(target=spin, name="attack-logged", daemon=True).start()
""",
    )
    result.assert_outcomes(passed=1)
    assert log.read_text().splitlines() == [
        "test_leaves.py::test_starts_and_forgets\t"
        "thread 'attack-logged' (target test_leaves.spin, daemon=True)"
    ]


@pytest.mark.usefixtures("short_grace")
def test_a_librarys_process_wide_pool_is_not_blamed_but_a_thread_named_like_it_elsewise_is(
    pytester: pytest.Pytester, stop_file: Path
) -> None:
    """distributed's offload pool lives as long as the process, started by whichever test
    first used it (a CI run blamed the one that did): not a leak. The prefix must be the
    pool's own: "Dask" alone, or a name that only contains it, is still a leak."""
    result = inner(
        pytester,
        stop_file,
        """
def test_first_use_of_the_pool():
    threading.Thread(target=spin, name="Dask-Offload_0", daemon=True).start()

def test_a_thread_that_only_contains_the_name():
    threading.Thread(target=spin, name="my-Dask-Offload", daemon=True).start()
""",
    )
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        ["*ERROR at teardown of test_a_thread_that_only_contains_the_name*"]
    )
    assert "test_first_use_of_the_pool" not in "".join(
        line for line in result.outlines if "ERROR" in line
    )
