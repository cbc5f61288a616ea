"""A test that leaves a Python thread or a child process running fails itself, naming it.

Why: a thread left running by one test uses the CPU of its xdist worker during every later
test there, and the CPU timing refuses honest kernels for it (`DishonestTiming`: "other
threads of the process used X ms"), so one broken test turned 29 others red. Here the test
that left it is the one that fails (an error at its teardown), with the thread's name and
target or the child's pid and command line.

What counts: threads and children that did not exist when the test's own fixtures started
(those of a module- or session-scoped fixture are there before and are not the test's),
still running a grace period after its teardown: a thread that is merely ending (a poll
that exits at its next turn) is not a leak. A left child is killed once reported, so it
cannot poison the tests after it either. A library's process-wide pools (`PROCESS_POOLS`)
are the library's, whichever test started them; a test that must leave anything else says so
with `@pytest.mark.leaves_running(reason=...)`.

With $KERNELPRO_LEFT_RUNNING_LOG set to a file, nothing fails: each test that left
something appends a line there (for measuring which tests do, before the guard is on).

Loaded by tests/conftest.py (`pytest_plugins`); an inner pytester run loads it with
`-p left_running`.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

LOG_ENV = "KERNELPRO_LEFT_RUNNING_LOG"
# Seconds a thread or child may take to end after its test's teardown. Long enough for one
# that is ending on a loaded machine; only one still running after it is reported, so the
# figure never decides a correct test's outcome, only how long a leaking one waits.
GRACE_S = 15.0
# Thread pools a library keeps for the life of the process, started by whichever test first
# uses it (so blaming that test would be an order-dependent failure): name prefix -> owner.
PROCESS_POOLS = {
    "Dask-Offload": "distributed.utils' module-level offload executor",
    "Dask-Callback-Thread": "distributed.Future's class-level callback executor",
}


def _process_pool(thread: threading.Thread) -> bool:
    return thread.name.startswith(tuple(PROCESS_POOLS))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "leaves_running(reason): the test leaves a thread or child process running on purpose "
        "(a library's own long-lived pool): the left-running guard lets it, for the reason given",
    )


@dataclass(frozen=True)
class Child:
    pid: int
    start_ticks: int  # with the pid, names the process even once its pid is reused
    command: str


def _child_pids() -> set[int]:
    """Pids of this process's children: each thread's `children` file (one read per thread),
    or a scan of /proc where the kernel has none (CONFIG_PROC_CHILDREN)."""
    pids: set[int] = set()
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children", encoding="ascii") as children:
                pids.update(int(pid) for pid in children.read().split())
        return pids
    except FileNotFoundError:
        pass
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and int(stat[1]) == os.getpid():
                pids.add(int(entry))
    return pids


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields from the state on (the command name, which may hold spaces
    and parentheses, cut off); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _children() -> set[Child]:
    """This process's running (not zombie) children."""
    found: set[Child] = set()
    for pid in _child_pids():
        stat = _stat(pid)
        if stat is None or int(stat[1]) != os.getpid() or stat[0] in "ZX":
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # ended while being read
        found.add(Child(pid, int(stat[19]), command[:200]))
    return found


def _running(child: Child) -> bool:
    return any(c.pid == child.pid and c.start_ticks == child.start_ticks for c in _children())


def _describe_thread(thread: threading.Thread) -> str:
    target = getattr(thread, "_target", None)
    if target is None and type(thread).run is not threading.Thread.run:
        target = type(thread).run  # a Thread subclass: its run is what it does
    where = (
        f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
        if target is not None
        else "?"
    )
    return f"thread {thread.name!r} (target {where}, daemon={thread.daemon})"


def _still_running(
    threads_before: set[threading.Thread], children_before: set[Child]
) -> tuple[list[str], list[Child]]:
    """What the test started and left running after the grace period: threads described,
    and children (still running, for the caller to kill)."""
    deadline = time.monotonic() + GRACE_S
    threads = [
        t
        for t in threading.enumerate()
        if t not in threads_before and t.is_alive() and not _process_pool(t)
    ]
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    children = [c for c in _children() if c not in children_before]
    while children and time.monotonic() < deadline:
        time.sleep(0.05)
        children = [c for c in children if _running(c)]
    left = [_describe_thread(t) for t in threads if t.is_alive()]
    left += [f"child process {c.pid} ({c.command!r})" for c in children]
    return left, children


def _kill(child: Child) -> None:
    """Kill and reap `child`, and tell its `subprocess.Popen` (if one holds it) that it ended:
    otherwise that object, collected during a later test, warns "subprocess N is still
    running" there (an error under filterwarnings=error), blaming a test that did nothing."""
    try:
        os.kill(child.pid, signal.SIGKILL)
        _, status = os.waitpid(child.pid, 0)
    except (ProcessLookupError, ChildProcessError):
        return
    for held in gc.get_objects():  # only on this failure path: a walk of every object
        # type(), not isinstance: that reads __class__, which warns on some of torch's objects
        if issubclass(type(held), subprocess.Popen) and held.pid == child.pid:
            held.returncode = os.waitstatus_to_exitcode(status)


@pytest.fixture(autouse=True)
def _nothing_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    marker = request.node.get_closest_marker("leaves_running")
    if marker is not None:
        if not marker.kwargs.get("reason"):
            pytest.fail("@pytest.mark.leaves_running needs reason=: why the test may leave it")
        yield
        return
    threads_before, children_before = set(threading.enumerate()), _children()
    yield
    left, children = _still_running(threads_before, children_before)
    for child in children:  # reported below; never left to poison the tests after this one
        _kill(child)
    if not left:
        return
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.writelines(f"{request.node.nodeid}\t{what}\n" for what in left)
        return
    pytest.fail(
        f"the test left {len(left)} running {GRACE_S:.0f} s after its teardown: "
        + "; ".join(left)
        + ". Stop and join what it starts (in a finally), or mark a library's long-lived "
        "pool @pytest.mark.leaves_running(reason=...).",
        pytrace=False,
    )
